// The convolution's direct kernels for few taps (C·R·S <= kDirectTaps and a filter bank that fits shared memory):
// a first layer (1x3x3 on a gray image, 3x3x3 on a colour one) whose forward and backward_weight as an implicit
// GEMM (kernels/cuda/conv.cu) would be a GEMM of depth C·R·S, or of C·R·S columns: one slab, mostly the tile
// machinery's overhead. backward_data is a GEMM of depth K·R·S and stays in conv.cu. Contract in kernels/conv.h.
//
//   forward:         y[n,k,p,q] = Σ_{c,r,s} x[n,c, p·st−pad+r, q·st−pad+s] · w[k,c,r,s] (+ bias[k]), written;
//                    one thread per output pixel, the taps in registers, the filter bank in shared memory.
//   backward_weight: dw[k,c,r,s], dbias[k] as partial sums, one per block column, into the workspace; conv.cu's
//                    split-K reduction (conv_split_reduce_kernel) adds them in a fixed order and writes (=) dw, dbias.
// Layouts: x (N,C,H,W); w, dw (K,C,R,S); y, dy (N,K,P,Q); bias, dbias (K).
// Numerics: the gathers, the stores and the sums' order are the forward GEMM's (ForwardPass, conv_passes.cuh):
// the forward's FMA chain is the implicit GEMM's (taps ascending, bias last), so the same bits; with Exec::math TF32
// or BF16 every product's operands are rounded as the tensor-core kernels round them (kernels/operand.h) and summed
// in fp32, dbias from the unrounded dy. Fixed grids and fixed orders, no atomics: bit-reproducible run to run.
#include <cstdint>

#include "kernels/cuda/conv_passes.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/operand.h"

namespace nt::kernels::cuda {

namespace {

// ---- direct forward for few taps ------------------------------------------------------------------------------

// A first layer (C·R·S <= kDirectTaps, e.g. 1x3x3 on a gray image) makes a GEMM of depth 9: one slab, mostly
// zero padding, for a tile machinery built to amortize deep K. Here one thread owns an output pixel: it loads
// its C·R·S input taps once into registers (0 in the padding), then runs each output channel's dot product
// over them with the filter bank in shared memory (a broadcast read). The FMA chain is the implicit GEMM's
// (k ascending from 0, bias last): the same bits. Memory-bound on the writes of y, K floats per pixel.
constexpr int kDirectTaps = 32;
constexpr int kDirectThreads = 128;
constexpr int kDirectMaxWeights = 8192;  // K·C·R·S floats in shared memory (32 KB)

// grid: ceil(N·P·Q / kDirectThreads); smem: w (K, C·R·S) then the tap table (ForwardPass::k_info of each tap).
// Taps: C·R·S exactly (no guard in the loops), or kDirectTaps with a guard for any smaller count.
template <int Taps>
__global__ void __launch_bounds__(kDirectThreads) conv_direct_forward_kernel(ConvArgs a, StampRing stamps) {
  static_assert(Taps <= kDirectTaps);
  __shared__ float sw[kDirectMaxWeights];
  __shared__ ForwardPass::KInfo taps[kDirectTaps];
  const int ntaps = a.K;  // the GEMM's depth: C·R·S
  for (int t = threadIdx.x; t < ntaps; t += kDirectThreads) taps[t] = ForwardPass::k_info(a, t);
  begin_dependent_kernel(stamps);  // the weights (and x) may come from the kernels before
  for (int i = threadIdx.x; i < a.M * ntaps; i += kDirectThreads) sw[i] = round_operand(__ldg(&a.a_src[i]), a.math);
  __syncthreads();
  const int pixel = blockIdx.x * kDirectThreads + threadIdx.x;
  if (pixel >= a.N) return;
  const int4 col = ForwardPass::column(a, pixel);  // {x offset of tap (0,0,0), h0, w0, y offset of channel 0}
  float x[Taps];
#pragma unroll
  for (int t = 0; t < Taps; ++t) {
    x[t] = 0.f;
    if (Taps != kDirectTaps || t < ntaps) {
      x[t] = load_or_zero(ForwardPass::b_at(a, taps[t], col));
      x[t] = round_operand(x[t], a.math);
    }
  }
  for (int m = 0; m < a.M; ++m) {
    const float* wm = sw + m * ntaps;
    float acc = 0.f;
#pragma unroll
    for (int t = 0; t < Taps; ++t)
      if (Taps != kDirectTaps || t < ntaps) acc = fmaf(wm[t], x[t], acc);
    ForwardPass::store(a, m, pixel, col, acc);
  }
}

// ---- direct backward_weight for few taps ---------------------------------------------------------------------

// The same first layer's weight gradient as a GEMM is M = K channels by N = C·R·S taps (9) over Kg = N·P·Q
// pixels: the 32×32 tile wastes 23 of its 32 columns and every slab decodes pixels it then splits 256 ways
// (docs/conv.md, 'Direct backward_weight for few taps'). Here a thread owns kDirectPixelsPerThread pixels,
// loads each one's taps as the direct forward does and the dy of Channels output channels, and accumulates
// the products (and dy itself: dbias) in registers; the block adds its threads' sums (through shared memory,
// in a fixed order) into one partial per block column, which conv_split_reduce_kernel adds as split-K
// partials. A fixed grid and fixed orders: deterministic. grid: (ceil(N·P·Q / pixels per block),
// ceil(K / Channels)). a: the forward GEMM's args (M = K, N = N·P·Q, K = C·R·S) with a_src = dy, b_src = x,
// partial_stride = K·C·R·S + K (backward_weight's split layout: dw (K, C·R·S), then dbias (K)).
constexpr int kDirectPixelsPerThread = 4;
constexpr int kDirectPixelsPerBlock = kDirectThreads * kDirectPixelsPerThread;

template <int Taps, int Channels>
__global__ void __launch_bounds__(kDirectThreads) conv_direct_backward_weight_kernel(ConvArgs a, StampRing stamps) {
  static_assert(Taps <= kDirectTaps);
  constexpr int kSums = Taps + 1;  // per channel: the taps' products, then dy alone (dbias)
  static_assert(kDirectThreads % 4 == 0);
  __shared__ ForwardPass::KInfo taps[kDirectTaps];
  __shared__ float parked[Channels * kSums][kDirectThreads + 1];  // +1: a row's consecutive threads, distinct banks
  const int ntaps = a.K;
  for (int t = threadIdx.x; t < ntaps; t += kDirectThreads) taps[t] = ForwardPass::k_info(a, t);
  begin_dependent_kernel(stamps);  // dy comes from the kernels before
  __syncthreads();

  const int m0 = blockIdx.y * Channels;
  float acc[Channels][kSums];
#pragma unroll
  for (int c = 0; c < Channels; ++c)
#pragma unroll
    for (int t = 0; t < kSums; ++t) acc[c][t] = 0.f;

  const int first = blockIdx.x * kDirectPixelsPerBlock + threadIdx.x;
#pragma unroll
  for (int i = 0; i < kDirectPixelsPerThread; ++i) {
    const int pixel = first + i * kDirectThreads;
    if (pixel >= a.N) break;
    const int4 col = ForwardPass::column(a, pixel);  // {x offset of tap (0,0,0), h0, w0, dy offset of channel 0}
    float x[Taps];
#pragma unroll
    for (int t = 0; t < Taps; ++t) {
      x[t] = Taps != kDirectTaps || t < ntaps ? load_or_zero(ForwardPass::b_at(a, taps[t], col)) : 0.f;
      x[t] = round_operand(x[t], a.math);
    }
#pragma unroll
    for (int c = 0; c < Channels; ++c) {
      const int m = m0 + c;
      const float g = m < a.M ? __ldg(&a.a_src[col.w + m * a.pq]) : 0.f;  // dy[img, m, pq]
      const float gm = round_operand(g, a.math);                          // what the products see
#pragma unroll
      for (int t = 0; t < Taps; ++t) acc[c][t] = fmaf(gm, x[t], acc[c][t]);
      acc[c][Taps] += a.math == Math::bf16 ? gm : g;  // dbias: fp32 sums of dy, as BF16 rounds it (operand.h)
    }
  }

  // The block's sums: every thread parks its sums in its column of shared memory, then thread v adds row
  // v's entries in a fixed order (four interleaved chains, joined in order). A warp butterfly per sum cost
  // 10 instructions per thread for each of the 80, more than the products themselves (Nsight Compute;
  // docs/conv.md, 'Direct backward_weight for few taps').
#pragma unroll
  for (int c = 0; c < Channels; ++c)
#pragma unroll
    for (int t = 0; t < kSums; ++t) parked[c * kSums + t][threadIdx.x] = acc[c][t];
  __syncthreads();
  float* part = a.partial + static_cast<size_t>(blockIdx.x) * a.partial_stride;
  for (int v = threadIdx.x; v < Channels * kSums; v += kDirectThreads) {
    const int c = v / kSums, t = v % kSums, m = m0 + c;
    if (m >= a.M || (t < Taps && t >= ntaps)) continue;
    float chain[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
    for (int i = 0; i < kDirectThreads; i += 4)
#pragma unroll
      for (int k = 0; k < 4; ++k) chain[k] += parked[v][i + k];
    part[t < Taps ? m * ntaps + t : a.M * ntaps + m] = (chain[0] + chain[1]) + (chain[2] + chain[3]);
  }
}

}  // namespace

bool direct_taps(const Conv2dShape& s) {
  const int64_t taps = int64_t(s.c) * s.r * s.s;
  return taps <= kDirectTaps && taps * s.k <= kDirectMaxWeights;
}

int direct_weight_blocks(const Conv2dShape& s) {
  return static_cast<int>((int64_t(s.n) * s.p() * s.q() + kDirectPixelsPerBlock - 1) / kDirectPixelsPerBlock);
}

void launch_direct_forward(const Exec& exec, const profile::OpCost& cost, const ConvArgs& a) {
  // 1x3x3 (a gray image's first layer) gets a kernel without the tap guards: a third of the instructions.
  const auto kernel = a.K == 9 ? conv_direct_forward_kernel<9> : conv_direct_forward_kernel<kDirectTaps>;
  const dim3 grid(static_cast<unsigned>((a.N + kDirectThreads - 1) / kDirectThreads));
  launch(exec, "conv2d_forward", cost, kernel, grid, dim3(kDirectThreads), 0, a);
}

void launch_direct_backward_weight(const Exec& exec, const profile::OpCost& cost, const Conv2dShape& s,
                                   const ConvArgs& d) {
  // 1x3x3 gets 8 channels per thread without tap guards; up to 32 taps, 2 channels (64 accumulators).
  const bool nine = d.K == 9;
  const int channels = nine ? 8 : 2;
  const auto kernel =
      nine ? conv_direct_backward_weight_kernel<9, 8> : conv_direct_backward_weight_kernel<kDirectTaps, 2>;
  const dim3 grid(static_cast<unsigned>(direct_weight_blocks(s)),
                  static_cast<unsigned>((d.M + channels - 1) / channels));
  launch(exec, "conv2d_backward_weight", cost, kernel, grid, dim3(kDirectThreads), 0, d);
}

}  // namespace nt::kernels::cuda
