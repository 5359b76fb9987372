// The channels-last convolution: a forward convolution (or backward_data as one) on tensor cores whose operands arrive
// by 16-byte asynchronous copies, in TF32 or BF16. Interface and the reason for the layout:
// kernels/cuda/conv_channels_last.cuh.
//
// Staged operands (stage, one kernel; round = the format's: cvt.rna.tf32 for TF32, cvt.rn.bf16 for BF16):
//   src_cl[img][h][w][c]            = round(src[img][c][h][w])                     (N·H·W·C elements)
//   filters[m][(r·S + s)·C + c]     = round(w[m][c][r][s])                         forward
//                                   = round(w[c][m][R−1−r][S−1−s])                 flipped (backward_data)
// The source's transpose goes through a 32×32 tile in shared memory (reads along h·w, writes along c, both
// coalesced); the filters (K·C·R·S values, 74 KB in fp32 for the cnn's conv2) are gathered by a few blocks beside it.
// Where the layer's neighbour wrote the source staged already (kernels/conv.h, 'Staged operands'), the kernel stages
// the filters alone, and may run beside the kernel before it (StageArgs::beside).
// TF32's rounding here, once per element, is the same rounding conv.cu's MMA kernel applies at every fragment load,
// so the products are the same TF32 products; the MMA loop then takes the values as they are.
//
// The GEMM (multiply):  C(m, n) = Σ_kg A(m, kg) · B(kg, n),  M = K (output channels), N = N·P·Q (output pixels),
//   Kg = R·S·C in the order (r, s, c):
//   A(m, kg)  = filters[m·Kg + kg]
//   B(kg, n)  = src_cl[((img·H + p·st − pad + r)·W + q·st − pad_w + s)·C + c]   (0 outside the image)
// Block: BM × BN of C (4 to 16 warps of m16n8k8 TF32 or m16n8k16 BF16 MMAs: mma_tf32.cuh, mma_bf16.cuh; on sm_90a one
// or two warpgroups of wgmma instead: conv_channels_last_wgmma_kernel below), Kg in slabs
// of 32. A slab of each operand is BM (or BN) rows of BK / V chunks of V consecutive kg (V = 4 TF32 or 8 BF16 values,
// 16 bytes), each chunk one copy: thread t copies chunk t % (BK / V) of rows t / (BK / V) + step·i. As kg and C are
// multiples of V, a chunk lies in one tap: one range check for its V values. The copies land in shared memory as
// As[m][k], Bs[n][k], rows padded so that the fragment loads hit 32 banks (row stride BK + 4 floats, or BK + 8 bf16).
// Pipeline: kStages stages; slab t + kStages − 1 is copied while slab t is multiplied. Each iteration waits for
// slab t's copies (cp.async.wait_group), one barrier, issues the next copy into the stage slab t − 1 used, then
// multiplies. No split-K: the planner (conv.cu) takes this kernel only where the tiles fill the GPU.
// Epilogue: the forward's (kernels/cuda/conv_epilogue.cuh): the fp32 tile through shared memory, y in NCHW a row of
// pixels per store, the bias, and with a.stats the BatchNorm partials of chunk blockIdx.x.
// Each output sums its products in one fixed order (slabs in kg order, the MMA's own order within a slab): the same
// bits run to run.
//
// backward_weight (weight_gradient; conv.cu plans it where backward_data runs here):
//   dW(m, j) = Σ_pixel A(pixel, m) · B(pixel, j), M = K, columns j = (r·S + s)·C + c, the reduction over the N·P·Q
//   output pixels, rows of both staged operands:
//   A(pixel, m) = dy_cl[pixel·K + m]              (backward_data's staged source)
//   B(pixel, j) = x_cl[((img·H + p·st − pad + r)·W + q·st − pad_w + s)·C + c]   (0 outside; staged beside it)
// Slabs of 32 pixels land k-major, As[pixel][m] and Bs[pixel][j]: TF32 fragments are scalar loads
// (mma_tf32::multiply_slab with the KMajor layout), BF16 fragments come through ldmatrix.trans
// (mma_bf16::multiply_k_major_slab); on sm_90a BF16 runs on wgmma with the slabs as MN-major operands
// (conv_channels_last_weight_wgmma_kernel). grid.z splits the pixels into parts whose partials conv.cu's split-K
// reduction adds in part order.
#include "kernels/cuda/conv_channels_last.cuh"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/cuda/conv_epilogue.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/mma_tf32.cuh"
#include "kernels/cuda/staged_activation.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace nt::kernels::cuda::channels_last {

namespace {

constexpr int kStages = 4;          // slabs in flight: three copied while one is multiplied
constexpr int kTransposeTile = 32;  // the source's transpose: 32 × 32 elements a block
constexpr int kStageThreads = 256;  // 8 warps: each thread moves 4 elements of a transpose tile
constexpr int kFilterBlocks = 32;   // blocks of the staging kernel that gather the filters

// Warpgroups of a wgmma kernel whose tile has bn columns (pixels, or weight columns): one up to 64, two above (a
// warpgroup's N is at most 64).
constexpr int warpgroups_of(int bn) { return bn > 64 ? 2 : 1; }

// A stage of the wgmma kernels (below), in bytes: the forward's A (64 filter rows) and B (bn pixel rows) of one
// 128-byte line each; the weight kernel's A (32 pixel lines of dy) and one atom column of 32 lines per warpgroup for B.
constexpr int kWeightSlabPixels = 32;
constexpr int wgmma_stage_bytes(int bn) { return (wgmma::kRows + bn) * wgmma::kLineBytes; }
constexpr int weight_wgmma_stage_bytes(int bn) {
  return (1 + warpgroups_of(bn)) * kWeightSlabPixels * wgmma::kLineBytes;
}
// Their dynamic shared memory: kStages stages and the room to align the first to the swizzle's period.
constexpr size_t wgmma_shared_bytes(int stage_bytes) { return size_t(kStages) * stage_bytes + wgmma::kAlignment; }

// The operands' number format: the element the stage writes and the multiply's MMA takes.
template <Format F>
struct Operands;

template <>
struct Operands<Format::tf32> {  // fp32 bit patterns rounded to TF32 (cvt.rna), m16n8k8
  using Element = float;
  template <int BM, int BN, int Warps>
  using Config = mma_tf32::MmaConfig<BM, BN, 2, Warps / 2>;
  __device__ static Element from(float v) { return __uint_as_float(mma_tf32::to_tf32(v)); }
  template <class Cfg>
  __device__ static void multiply_slab(float (&acc)[Cfg::kTilesM][Cfg::kTilesN][4], const Element* As,
                                       const Element* Bs, int wm, int wn) {
    mma_tf32::multiply_slab<Cfg, mma_tf32::Rounding::staged>(acc, As, Bs, wm, wn);
  }
  template <class Cfg>
  using KMajor = mma_tf32::KMajor<Cfg>;
  template <class Cfg>
  __device__ static void multiply_k_major_slab(float (&acc)[Cfg::kTilesM][Cfg::kTilesN][4], const Element* As,
                                               const Element* Bs, int wm, int wn) {
    mma_tf32::multiply_slab<Cfg, mma_tf32::Rounding::staged, mma_tf32::KMajor<Cfg>>(acc, As, Bs, wm, wn);
  }
  __device__ static float to_float(Element v) { return v; }
};

template <>
struct Operands<Format::bf16> {  // bf16 (cvt.rn: to nearest, ties to even), m16n8k16
  using Element = __nv_bfloat16;
  template <int BM, int BN, int Warps>
  using Config = mma_bf16::MmaConfig<BM, BN, 2, Warps / 2>;
  __device__ static Element from(float v) { return __float2bfloat16_rn(v); }
  template <class Cfg>
  __device__ static void multiply_slab(float (&acc)[Cfg::kTilesM][Cfg::kTilesN][4], const Element* As,
                                       const Element* Bs, int wm, int wn) {
    mma_bf16::multiply_slab<Cfg>(acc, As, Bs, wm, wn);
  }
  template <class Cfg>
  using KMajor = mma_bf16::KMajor<Cfg>;
  template <class Cfg>
  __device__ static void multiply_k_major_slab(float (&acc)[Cfg::kTilesM][Cfg::kTilesN][4], const Element* As,
                                               const Element* Bs, int wm, int wn) {
    mma_bf16::multiply_k_major_slab<Cfg>(acc, As, Bs, wm, wn);
  }
  __device__ static float to_float(Element v) { return __bfloat162float(v); }
};

// Elements per 16-byte copy: 4 TF32 or 8 BF16 channels.
constexpr size_t element_bytes(Format format) { return format == Format::bf16 ? 2 : 4; }
constexpr int vector_of(Format format) { return static_cast<int>(16 / element_bytes(format)); }

template <class Ops, class Cfg>
constexpr size_t shared_bytes() {
  return size_t(kStages) * Cfg::kStageElements * sizeof(typename Ops::Element);
}

// ---- stage ------------------------------------------------------------------------------------------------

// One source (n, c, hw) into channels-last order (n, hw, c), rounded, in 32 × 32 tiles: `blocks` of them.
template <class T>
struct Transpose {
  const float* src;  // (n, c, hw)
  T* dst;            // (n, hw, c)
  int c = 0, hw = 0;
  int tiles_hw = 0, tiles_c = 0, blocks = 0;
};

template <class T>
struct StageArgs {
  Transpose<T> source, input;  // input: backward_weight's x beside backward_data's dy (else input.blocks == 0)
  const float* w;              // (rows, cin, r, s), or flipped (cin, rows, r, s)
  T* filters;                  // (rows, r, s, cin)
  int rows, cin, r, s, filter_elements;
  bool flipped;
  bool beside;  // the filters alone, beside the predecessor (stage's overlaps_previous)
};

template <class T>
Transpose<T> make_transpose(const float* src, T* dst, int n, int c, int hw) {
  Transpose<T> t{.src = src, .dst = dst, .c = c, .hw = hw};
  t.tiles_hw = (hw + kTransposeTile - 1) / kTransposeTile, t.tiles_c = (c + kTransposeTile - 1) / kTransposeTile;
  t.blocks = src ? t.tiles_hw * t.tiles_c * n : 0;
  return t;
}

// Tile b of t: src[img][c0 + j][hw0 + lane] through shared memory to dst[img][hw0 + j][c0 + lane].
template <class Ops>
__device__ void transpose_tile(const Transpose<typename Ops::Element>& t, int b,
                               float (&tile)[kTransposeTile][kTransposeTile + 1]) {
  const int hw0 = (b % t.tiles_hw) * kTransposeTile;
  b /= t.tiles_hw;
  const int c0 = (b % t.tiles_c) * kTransposeTile, img = b / t.tiles_c;
  const int lane = threadIdx.x % 32, row = threadIdx.x / 32;
  constexpr int kRows = kStageThreads / 32;
  for (int j = row; j < kTransposeTile; j += kRows) {
    const int c = c0 + j, hw = hw0 + lane;
    if (c < t.c && hw < t.hw) tile[j][lane] = t.src[(size_t(img) * t.c + c) * t.hw + hw];
  }
  __syncthreads();
  for (int j = row; j < kTransposeTile; j += kRows) {
    const int hw = hw0 + j, c = c0 + lane;
    if (hw < t.hw && c < t.c) t.dst[(size_t(img) * t.hw + hw) * t.c + c] = Ops::from(tile[lane][j]);
  }
}

// Blocks [0, source.blocks) transpose the source, the next input.blocks the input; the rest gather the filters.
template <class Ops>
__global__ void __launch_bounds__(kStageThreads)
    conv_stage_channels_last_kernel(StageArgs<typename Ops::Element> a, StampRing stamps) {
  begin_kernel(a.beside, stamps);
  __shared__ float tile[kTransposeTile][kTransposeTile + 1];  // +1: the transposed reads hit 32 banks
  int b = blockIdx.x;
  if (b < a.source.blocks) return transpose_tile<Ops>(a.source, b, tile);
  b -= a.source.blocks;
  if (b < a.input.blocks) return transpose_tile<Ops>(a.input, b, tile);
  b -= a.input.blocks;
  const int stride = (gridDim.x - a.source.blocks - a.input.blocks) * blockDim.x;
  for (int e = b * blockDim.x + threadIdx.x; e < a.filter_elements; e += stride)
    a.filters[e] = Ops::from(a.w[staged_filter_source(e, a.rows, a.cin, a.r, a.s, a.flipped)]);
  end_kernel(a.beside, stamps);  // beside: the filters alone, so every thread comes here
}

// ---- multiply ---------------------------------------------------------------------------------------------

// GEMM column n, an output pixel (img, p, q): {the source pixel of its tap (0, 0), img·H·W + h0·W + w0; h0; w0;
// y's offset of its channel 0}. Past N: a pixel every tap misses.
__device__ __forceinline__ int4 pixel_column(const ConvArgs& a, int n) {
  if (n >= a.N) return make_int4(0, kInvalid, kInvalid, 0);
  int img, pq, p, q;
  a.by_pq.divmod(n, img, pq);
  a.by_q.divmod(pq, p, q);
  const int h0 = p * a.stride - a.pad, w0 = q * a.stride - a.pad_w;
  return make_int4(img * a.hw + h0 * a.w + w0, h0, w0, img * a.kpq + pq);
}

// grid (tiles of N, tiles of M): block (x, y) computes C tile (y, x) over all of Kg. Dynamic shared memory:
// kStages stages of As[BM][kLd], Bs[BN][kLd] of Ops::Element; after the last slab the finished fp32 tile is staged
// there. filters (M, Kg) and src_cl (n, h, w, c): the staged operands.
template <class Ops, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    conv_channels_last_kernel(ConvArgs a, const typename Ops::Element* filters, const typename Ops::Element* src_cl,
                              StampRing stamps) {
  using Element = typename Ops::Element;
  begin_kernel(a.overlaps_previous, stamps);
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, kLd = Cfg::kLd, kThreads = Cfg::kThreads;
  constexpr int kVector = 16 / sizeof(Element);
  constexpr int kChunksPerRow = BK / kVector, kRowStep = kThreads / kChunksPerRow;
  static_assert(kThreads % kChunksPerRow == 0, "a thread copies the same chunk of every row it copies");
  static_assert(BM * conv_epilogue::kStagedLd<BN> * sizeof(float) <= kStages * Cfg::kStageElements * sizeof(Element),
                "the tile is staged in the stages");
  extern __shared__ __align__(16) float smem[];
  Element* stages = reinterpret_cast<Element*>(smem);
  __shared__ int4 columns[BN];

  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  for (int i = threadIdx.x; i < BN; i += kThreads) columns[i] = pixel_column(a, n0 + i);
  __syncthreads();

  const int chunk = threadIdx.x % kChunksPerRow, row0 = threadIdx.x / kChunksPerRow;
  const int warp = threadIdx.x / 32;
  const int wm = (warp / Cfg::kWarpsN) * Cfg::WM, wn = (warp % Cfg::kWarpsN) * Cfg::WN;
  const int slabs = (a.K + BK - 1) / BK;

  // Slab `slab` into `stage`: this thread's chunk of each of its rows of A and B (rows step kRowStep; where a tile has
  // fewer rows than the block copies at once, the threads past it copy none).
  auto copy_slab = [&](int slab, int stage) {
    Element* As = stages + stage * Cfg::kStageElements;
    Element* Bs = As + BM * kLd;
    const int kg = slab * BK + chunk * kVector;
    const bool in_k = kg < a.K;
    int tap, c, r, s;
    a.by_c.divmod(kg, tap, c);
    a.by_s.divmod(tap, r, s);
#pragma unroll
    for (int i = 0; i < (BM + kRowStep - 1) / kRowStep; ++i) {
      const int row = row0 + i * kRowStep, m = m0 + row;
      if (BM % kRowStep != 0 && row >= BM) break;
      const bool valid = in_k && m < a.M;
      cp_async::copy16_or_zero(As + row * kLd + chunk * kVector, valid ? filters + size_t(m) * a.K + kg : filters,
                               valid);
    }
    const int tap_offset = r * a.w + s;
#pragma unroll
    for (int i = 0; i < (BN + kRowStep - 1) / kRowStep; ++i) {
      const int row = row0 + i * kRowStep;
      if (BN % kRowStep != 0 && row >= BN) break;
      const int4 col = columns[row];
      const bool valid = in_k && inside(col.y + r, a.h) && inside(col.z + s, a.w);
      cp_async::copy16_or_zero(Bs + row * kLd + chunk * kVector,
                               valid ? src_cl + size_t(col.x + tap_offset) * a.c + c : src_cl, valid);
    }
  };

  float acc[Cfg::kTilesM][Cfg::kTilesN][4];
  mma_tf32::zero(acc);

  cp_async::pipeline<kStages>(slabs, copy_slab, [&](int stage) {
    const Element* As = stages + stage * Cfg::kStageElements;
    Ops::template multiply_slab<Cfg>(acc, As, As + BM * kLd, wm, wn);
  });
  __syncthreads();  // the stages are free for the finished tile
  end_kernel(a.overlaps_previous, stamps);

  conv_epilogue::stage_accumulators<ForwardPass, BN>(a, smem, m0, wm, wn, acc);
  conv_epilogue::write_staged<ForwardPass, BM, BN, kThreads>(a, smem, m0, n0, columns);
}

// ---- multiply on warpgroup MMAs (sm_90a) -----------------------------------------------------------------------

// The GEMM, the tile and the epilogue of conv_channels_last_kernel, on wgmma (wgmma.cuh): a block of WG warpgroups owns
// BM output channels × BN pixels; the MMA's M is 64 channel rows (a 32-row tile leaves rows 32..63 zero, their sums
// never stored), warpgroup i takes the pixels [i·BN/WG, (i+1)·BN/WG) as the MMA's N. A slab is wgmma::kChunks chunks
// of 16 bytes of Kg a row (32 TF32 or 64 BF16 values), in wgmma's swizzled layout: A (64 filter rows, 8 KB), then
// B (BN pixel rows), one stage, each 1024-byte aligned; the same 4-stage cp.async pipeline, each thread's landed copies
// fenced for the async proxy before the barrier. A warp copies 8 rows × 4 chunks of one 8-row group (each 8 lanes one
// chunk of 8 rows: distinct banks), so a thread's chunk, (warp % 2)·4 + lane / 8, is the same in every slab and its kg
// is decoded once a slab.
// Each output sums its products slab by slab in kg order, k steps in order within a slab, as the mma.sync kernel.
template <class Ops, int BM, int BN, int WG>
__global__ void __launch_bounds__(WG * 128)
    conv_channels_last_wgmma_kernel(ConvArgs a, const typename Ops::Element* filters,
                                    const typename Ops::Element* src_cl, StampRing stamps) {
  using Element = typename Ops::Element;
  constexpr int kThreads = WG * 128, kWarps = kThreads / 32, kWN = BN / WG;
  constexpr int kVector = 16 / sizeof(Element), kBK = wgmma::kChunks * kVector;
  constexpr int kABytes = wgmma::kRows * wgmma::kLineBytes, kStageBytes = wgmma_stage_bytes(BN);
  static_assert(BM == 64 || BM == 32, "the MMA's 64 rows hold the tile's channels");
  static_assert(kWN % 8 == 0 && kWarps % 2 == 0, "whole 8-row groups of pixels a warpgroup; a thread's chunk is fixed");
  static_assert(BM * conv_epilogue::kStagedLd<BN> * sizeof(float) <= size_t(kStages) * kStageBytes,
                "the tile is staged in the stages");
  begin_kernel(a.overlaps_previous, stamps);
#if NT_WGMMA
  extern __shared__ __align__(16) unsigned char dynamic_bytes[];
  __shared__ int4 columns[BN];
  unsigned char* stage_bytes = wgmma::aligned_to_swizzle(dynamic_bytes);

  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  for (int i = threadIdx.x; i < BN; i += kThreads) columns[i] = pixel_column(a, n0 + i);
  if constexpr (BM < wgmma::kRows) {  // A's rows past the tile: zero in every stage, and no copy lands there
    constexpr int kZeroVectors = (wgmma::kRows - BM) * wgmma::kLineBytes / 16;
    for (int i = threadIdx.x; i < kStages * kZeroVectors; i += kThreads)
      reinterpret_cast<int4*>(stage_bytes + (i / kZeroVectors) * kStageBytes +
                              BM * wgmma::kLineBytes)[i % kZeroVectors] = make_int4(0, 0, 0, 0);
    wgmma::publish_shared_to_async_proxy();
  }
  __syncthreads();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warpgroup = warp / 4;
  const int chunk = (warp % 2) * 4 + lane / 8, group_row = lane % 8;
  const int slabs = (a.K + kBK - 1) / kBK;

  // Slab `slab` into `stage`: piece p = warp + i·kWarps of an operand is its 8-row group p / 2, chunks (p % 2)·4 ...
  // + 3. The checks and addresses are conv_channels_last_kernel's: both loops through shared helpers changed the code
  // generated for this kernel and cost about 1 ms an epoch (docs/conv.md, 'Warpgroup MMAs'), so they stay written out.
  auto copy_slab = [&](int slab, int stage) {
    unsigned char* As = stage_bytes + stage * kStageBytes;
    unsigned char* Bs = As + kABytes;
    const int kg = slab * kBK + chunk * kVector;
    const bool in_k = kg < a.K;
    int tap, c, r, s;
    a.by_c.divmod(kg, tap, c);
    a.by_s.divmod(tap, r, s);
#pragma unroll
    for (int i = 0; i < (BM / 4 + kWarps - 1) / kWarps; ++i) {
      const int piece = warp + i * kWarps, row = piece / 2 * 8 + group_row, m = m0 + row;
      if (BM / 4 % kWarps != 0 && piece >= BM / 4) break;
      const bool valid = in_k && m < a.M;
      cp_async::copy16_or_zero(As + wgmma::offset(row, chunk), valid ? filters + size_t(m) * a.K + kg : filters, valid);
    }
    const int tap_offset = r * a.w + s;
#pragma unroll
    for (int i = 0; i < (BN / 4 + kWarps - 1) / kWarps; ++i) {
      const int piece = warp + i * kWarps, row = piece / 2 * 8 + group_row;
      if (BN / 4 % kWarps != 0 && piece >= BN / 4) break;
      const int4 col = columns[row];
      const bool valid = in_k && inside(col.y + r, a.h) && inside(col.z + s, a.w);
      cp_async::copy16_or_zero(Bs + wgmma::offset(row, chunk),
                               valid ? src_cl + size_t(col.x + tap_offset) * a.c + c : src_cl, valid);
    }
  };

  float acc[kWN / 2];
#pragma unroll
  for (int i = 0; i < kWN / 2; ++i) acc[i] = 0.f;
  // One batch of MMAs stays in flight while the next slab is waited for: the copies look one slab less ahead.
  constexpr int kMmasInFlight = 1;
  cp_async::pipeline<kStages, kMmasInFlight>(
      slabs, copy_slab,
      [&](int stage) {
        const unsigned char* As = stage_bytes + stage * kStageBytes;
        const unsigned char* Bs = As + kABytes + warpgroup * kWN * wgmma::kLineBytes;
        wgmma::hold(acc);
        wgmma::fence();
#pragma unroll
        for (int step = 0; step < wgmma::kSteps; ++step)
          wgmma::Mma<Element, kWN>::run(acc, wgmma::descriptor(As + step * wgmma::kStepBytes),
                                        wgmma::descriptor(Bs + step * wgmma::kStepBytes));
        wgmma::commit_and_wait<kMmasInFlight>();
        wgmma::hold(acc);
      },
      [] { wgmma::publish_shared_to_async_proxy(); });
  wgmma::commit_and_wait<0>();
  wgmma::hold(acc);
  __syncthreads();  // the stages are free for the finished tile
  end_kernel(a.overlaps_previous, stamps);

  // d[4j + e] of warp w in its warpgroup: channel row 16w + g + 8·(e / 2), the warpgroup's pixel 8j + 2t + e % 2
  float* tile = reinterpret_cast<float*>(stage_bytes);
  const int g = lane / 4, t = lane % 4, w = warp % 4;
#pragma unroll
  for (int j = 0; j < kWN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * w + g + 8 * (e / 2), col = warpgroup * kWN + 8 * j + 2 * t + e % 2;
      if (row < BM) conv_epilogue::stage<ForwardPass, BN>(a, tile, m0, row, col, acc[4 * j + e]);
    }
  conv_epilogue::write_staged<ForwardPass, BM, BN, kThreads>(a, tile, m0, n0, columns);
#else
  __trap();  // no wgmma in this code: multiply() launches the kernel only where runs_warpgroup_mma()
#endif
}

// ---- backward_weight ------------------------------------------------------------------------------------------

// Whether the weight kernel serves a Cfg tile in Ops' format: conflict-free k-major fragment loads (mma_tf32.cuh,
// mma_bf16.cuh) and whole 16-byte copies of its rows.
template <class Ops, class Cfg>
constexpr bool serves_weight_tile() {
  constexpr int kVector = 16 / sizeof(typename Ops::Element);
  return Ops::template KMajor<Cfg>::kConflictFree && Cfg::BM % kVector == 0 && Cfg::BN % kVector == 0;
}

// The weight kernels' outputs. Part blockIdx.z's sums of columns col and col + 1 (K is a multiple of the vector, so
// both are inside or neither) at row m: with a split to its partial as the tile's rows, C(m, column (r, s, c)) at
// partial[m·K + column], a float2 (the reduction, conv.cu's ChannelsLastWeightPass, puts them in dw's order);
// without one straight to dw's (c, r, s) places, out[m·K + c·R·S + r·S + s].
__device__ __forceinline__ void store_weight_pair(const ConvArgs& f, int m, int col, float v0, float v1) {
  if (m >= f.M || col >= f.K) return;
  if (f.split > 1) {
    float* to = f.partial + size_t(blockIdx.z) * f.partial_stride;
    *reinterpret_cast<float2*>(to + size_t(m) * f.K + col) = make_float2(v0, v1);
    return;
  }
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    int tap, c;
    f.by_c.divmod(col + e, tap, c);
    f.out[size_t(m) * f.K + c * f.rs + tap] = e == 0 ? v0 : v1;
  }
}

// dbias's row m of part blockIdx.z (after the partial's M·K weights), or dbias itself without a split.
__device__ __forceinline__ void store_weight_row_sum(const ConvArgs& f, int m, float sum) {
  if (m >= f.M) return;
  if (f.split > 1)
    f.partial[size_t(blockIdx.z) * f.partial_stride + size_t(f.M) * f.K + m] = sum;
  else
    f.out_rows[m] = sum;
}

// The weight kernels' slabs of 32 pixels that block (x, y, z) sums: part z of the grid's split, [first, last).
struct WeightSlabs {
  int first, last;
};
__device__ __forceinline__ WeightSlabs weight_slabs(const ConvArgs& f, int pixels_per_slab) {
  const int slabs = (f.N + pixels_per_slab - 1) / pixels_per_slab, per_part = (slabs + gridDim.z - 1) / gridDim.z;
  const int first = blockIdx.z * per_part;
  return {first, min(slabs, first + per_part)};
}

// The weight kernels' table of the tile's column chunks (kChunks of kVector columns from n0), filled by kThreads
// threads: chunk j as {x_cl offset of its tap and channel, r, s, valid}.
template <int kChunks, int kVector, int kThreads>
__device__ __forceinline__ void fill_weight_chunks(const ConvArgs& f, int n0, int4 (&chunks)[kChunks]) {
  for (int j = threadIdx.x; j < kChunks; j += kThreads) {
    const int col = n0 + j * kVector;
    int tap, c, r, s;
    f.by_c.divmod(col, tap, c);
    f.by_s.divmod(tap, r, s);
    chunks[j] = col < f.K ? make_int4((r * f.w + s) * f.c + c, r, s, 1) : make_int4(0, 0, 0, 0);
  }
}

// f: the forward's args (M = K output channels, K = R·S·C weight columns in (r, s, c) order, N = N·P·Q pixels),
// with split, partial_stride, partial, out (dw) and out_rows (dbias, nullable) set.
// grid (tiles of the columns, tiles of M, parts): block (x, y, z) sums the products of its tile over the slabs of
// part z, into dw (one part) or partial z. Dynamic shared memory: kStages stages of As[BK][kLdA] (dy_cl's rows: pixels
// × channels m) and Bs[BK][kLdB] (x_cl at each pixel's taps: pixels × columns). A slab row is one pixel: chunk j of it
// is kVector consecutive m of dy_cl, or kVector channels of one tap of x_cl, one 16-byte copy each; the copies of a
// slab are spread over the block's threads in order (idx = thread + i·threads), so any warp count serves. The
// chunks' taps and channels are found once per block (`chunks`).
// dbias (f.out_rows): the blocks of column tile 0 add their As slabs, pixels ascending, one thread per tile row, as
// conv.cu's kernels do: the sums of the rounded dy (the BF16 contract, docs/bf16.md).
template <class Ops, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    conv_channels_last_weight_kernel(ConvArgs f, const typename Ops::Element* dy_cl, const typename Ops::Element* x_cl,
                                     StampRing stamps) {
  using Element = typename Ops::Element;
  using Layout = typename Ops::template KMajor<Cfg>;
  begin_kernel(f.overlaps_previous, stamps);
  constexpr int kVector = 16 / sizeof(Element);
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, kThreads = Cfg::kThreads;
  constexpr int kLdA = Layout::kLdA, kLdB = Layout::kLdB;
  constexpr int kChunksA = BM / kVector, kChunksB = BN / kVector;
  static_assert(serves_weight_tile<Ops, Cfg>(), "the host refuses other tiles");
  static_assert(kThreads >= BM, "one thread per tile row sums dbias");
  extern __shared__ __align__(16) float smem[];
  Element* stages = reinterpret_cast<Element*>(smem);
  __shared__ int4 chunks[kChunksB];  // chunk j of a B row: {x_cl offset of its tap and channel, r, s, valid}

  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const WeightSlabs part = weight_slabs(f, BK);
  fill_weight_chunks<kChunksB, kVector, kThreads>(f, n0, chunks);
  __syncthreads();

  auto copy_slab = [&](int slab, int stage) {
    Element* As = stages + stage * Layout::kStageElements;
    Element* Bs = As + BK * kLdA;
    const int pixel0 = slab * BK;
#pragma unroll
    for (int i = 0; i < (BK * kChunksA + kThreads - 1) / kThreads; ++i) {
      const int idx = threadIdx.x + i * kThreads, row = idx / kChunksA, chunk = idx % kChunksA;
      if ((BK * kChunksA) % kThreads != 0 && row >= BK) break;
      const int pixel = pixel0 + row, m = m0 + chunk * kVector;
      const bool valid = m < f.M && pixel < f.N;
      cp_async::copy16_or_zero(As + row * kLdA + chunk * kVector, valid ? dy_cl + size_t(pixel) * f.M + m : dy_cl,
                               valid);
    }
#pragma unroll
    for (int i = 0; i < (BK * kChunksB + kThreads - 1) / kThreads; ++i) {
      const int idx = threadIdx.x + i * kThreads, row = idx / kChunksB;
      if ((BK * kChunksB) % kThreads != 0 && row >= BK) break;
      const int4 chunk = chunks[idx % kChunksB], col = pixel_column(f, pixel0 + row);
      const bool valid = chunk.w && inside(col.y + chunk.y, f.h) && inside(col.z + chunk.z, f.w);
      cp_async::copy16_or_zero(Bs + row * kLdB + (idx % kChunksB) * kVector,
                               valid ? x_cl + size_t(col.x) * f.c + chunk.x : x_cl, valid);
    }
  };

  float acc[Cfg::kTilesM][Cfg::kTilesN][4];
  mma_tf32::zero(acc);
  const bool sums_rows = f.out_rows != nullptr && blockIdx.x == 0 && threadIdx.x < BM;
  float row_sum = 0.f;

  const int warp = threadIdx.x / 32;
  const int wm = (warp / Cfg::kWarpsN) * Cfg::WM, wn = (warp % Cfg::kWarpsN) * Cfg::WN;
  cp_async::pipeline<kStages>(
      max(part.last - part.first, 0), [&](int t, int stage) { copy_slab(part.first + t, stage); },
      [&](int stage) {
        const Element* As = stages + stage * Layout::kStageElements;
        Ops::template multiply_k_major_slab<Cfg>(acc, As, As + BK * kLdA, wm, wn);
        if (sums_rows)
#pragma unroll 8
          for (int k = 0; k < BK; ++k) row_sum += Ops::to_float(As[k * kLdA + threadIdx.x]);
      });
  end_kernel(f.overlaps_previous, stamps);

  if (sums_rows) store_weight_row_sum(f, m0 + threadIdx.x, row_sum);
#pragma unroll
  for (int j = 0; j < Cfg::kTilesN; ++j) {
    const int col = n0 + wn + 8 * j + mma_tf32::col_of(0);
#pragma unroll
    for (int i = 0; i < Cfg::kTilesM; ++i) {
      const int m = m0 + wm + 16 * i + mma_tf32::row_of(0);
      store_weight_pair(f, m, col, acc[i][j][0], acc[i][j][1]);
      store_weight_pair(f, m + 8, col, acc[i][j][2], acc[i][j][3]);
    }
  }
}

// ---- backward_weight on warpgroup MMAs (sm_90a, BF16) ----------------------------------------------------------

// The weight GEMM of conv_channels_last_weight_kernel on wgmma, BF16 only. The pixels are k, the slow index of both
// staged operands, and wgmma reads such MN-major operands in 16-bit formats alone (wgmma.cuh). A slab of 32 pixels
// lands as lines of 64 values, one pixel a line, in the 128-byte swizzle: A, dy_cl's 64 channels of the tile (one
// atom column, 4 KB), then B, an atom column per warpgroup of its kWN ≤ 64 weight columns (x_cl at each pixel's taps,
// 4 KB each; 48 of 64 used at the plan's 96 columns). Warpgroup g multiplies m64n{kWN}k16 twice a slab, k steps of
// 16 pixels 2 KB apart in both operands, into columns [g·kWN, (g+1)·kWN) of the tile. The grid, the parts, the
// pipeline (one batch of MMAs in flight, as the forward's wgmma kernel) and the order of the sums are the mma.sync
// kernel's, so the bits are too. dbias: threads 0..63 add their channel's line entries of each A slab, pixels
// ascending.
template <int BN>
__global__ void __launch_bounds__(warpgroups_of(BN) * 128)
    conv_channels_last_weight_wgmma_kernel(ConvArgs f, const __nv_bfloat16* dy_cl, const __nv_bfloat16* x_cl,
                                           StampRing stamps) {
  constexpr int BM = wgmma::kMnValues, BK = kWeightSlabPixels, kVector = 8;  // 64 channels, 8 BF16 a copy
  constexpr int WG = warpgroups_of(BN), kThreads = WG * 128, kWN = BN / WG;
  constexpr int kChunksA = BM / kVector, kChunksB = kWN / kVector;  // 16-byte chunks of a line
  constexpr int kAtomBytes = BK * wgmma::kLineBytes;                // an operand's 32 lines
  constexpr int kStageBytes = weight_wgmma_stage_bytes(BN);
  constexpr int kPiecesA = BK * kChunksA, kPiecesB = WG * BK * kChunksB;
  static_assert(kWN % 16 == 0 && kWN <= wgmma::kMnValues, "a warpgroup's columns: one atom, whole MMAs");
  static_assert(kPiecesA % kThreads == 0, "a copy round is A's or B's");
  begin_kernel(f.overlaps_previous, stamps);
#if NT_WGMMA
  extern __shared__ __align__(16) unsigned char dynamic_bytes[];
  // chunk j of the tile's columns: {x_cl offset of its tap and channel, r, s, valid}
  __shared__ int4 chunks[BN / kVector];
  unsigned char* stage_bytes = wgmma::aligned_to_swizzle(dynamic_bytes);

  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const WeightSlabs part = weight_slabs(f, BK);
  fill_weight_chunks<BN / kVector, kVector, kThreads>(f, n0, chunks);
  __syncthreads();

  // Piece p = thread + i·kThreads of a slab: A's line p / 8, chunk p % 8; then B's warpgroup q / (32·kChunksB), line,
  // chunk, q = p − kPiecesA.
  auto copy_slab = [&](int slab, int stage) {
    unsigned char* As = stage_bytes + stage * kStageBytes;
    unsigned char* Bs = As + kAtomBytes;
    const int pixel0 = slab * BK;
#pragma unroll
    for (int i = 0; i < (kPiecesA + kPiecesB + kThreads - 1) / kThreads; ++i) {
      const int piece = threadIdx.x + i * kThreads;
      if (i < kPiecesA / kThreads) {
        const int line = piece / kChunksA, chunk = piece % kChunksA, pixel = pixel0 + line, m = m0 + chunk * kVector;
        const bool valid = m < f.M && pixel < f.N;
        cp_async::copy16_or_zero(As + wgmma::offset(line, chunk), valid ? dy_cl + size_t(pixel) * f.M + m : dy_cl,
                                 valid);
        continue;
      }
      const int q = piece - kPiecesA;
      if (kPiecesB % kThreads != 0 && q >= kPiecesB) break;
      const int group = q / (BK * kChunksB), line = q % (BK * kChunksB) / kChunksB, chunk = q % kChunksB;
      const int4 column = chunks[group * kChunksB + chunk], at = pixel_column(f, pixel0 + line);
      const bool valid = column.w && inside(at.y + column.y, f.h) && inside(at.z + column.z, f.w);
      cp_async::copy16_or_zero(Bs + group * kAtomBytes + wgmma::offset(line, chunk),
                               valid ? x_cl + size_t(at.x) * f.c + column.x : x_cl, valid);
    }
  };

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warpgroup = warp / 4;
  const bool sums_rows = f.out_rows != nullptr && blockIdx.x == 0 && threadIdx.x < BM;
  float row_sum = 0.f;
  float acc[kWN / 2];
#pragma unroll
  for (int i = 0; i < kWN / 2; ++i) acc[i] = 0.f;
  constexpr int kMmasInFlight = 1;
  cp_async::pipeline<kStages, kMmasInFlight>(
      max(part.last - part.first, 0), [&](int t, int stage) { copy_slab(part.first + t, stage); },
      [&](int stage) {
        const unsigned char* As = stage_bytes + stage * kStageBytes;
        const unsigned char* Bs = As + kAtomBytes + warpgroup * kAtomBytes;
        wgmma::hold(acc);
        wgmma::fence();
#pragma unroll
        for (int step = 0; step < BK / 16; ++step)
          wgmma::Mma<__nv_bfloat16, kWN, wgmma::Major::mn>::run(
              acc, wgmma::descriptor(As + step * wgmma::kMnStepBytes, kAtomBytes),
              wgmma::descriptor(Bs + step * wgmma::kMnStepBytes, kAtomBytes));
        wgmma::commit_and_wait<kMmasInFlight>();
        wgmma::hold(acc);
        if (sums_rows)
#pragma unroll 8
          for (int k = 0; k < BK; ++k)
            row_sum += __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(
                As + wgmma::offset(k, threadIdx.x / kVector) + threadIdx.x % kVector * sizeof(__nv_bfloat16)));
      },
      [] { wgmma::publish_shared_to_async_proxy(); });
  wgmma::commit_and_wait<0>();
  wgmma::hold(acc);
  end_kernel(f.overlaps_previous, stamps);

  // d[4j + e] of warp w in its warpgroup: channel row 16w + g + 8·(e / 2), the warpgroup's column 8j + 2t + e % 2
  if (sums_rows) store_weight_row_sum(f, m0 + threadIdx.x, row_sum);
  const int g = lane / 4, t = lane % 4, w = warp % 4;
#pragma unroll
  for (int j = 0; j < kWN / 8; ++j) {
    const int col = n0 + warpgroup * kWN + 8 * j + 2 * t;
    store_weight_pair(f, m0 + 16 * w + g, col, acc[4 * j], acc[4 * j + 1]);
    store_weight_pair(f, m0 + 16 * w + g + 8, col, acc[4 * j + 2], acc[4 * j + 3]);
  }
#else
  __trap();  // no wgmma in this code: weight_gradient launches the kernel only where runs_warpgroup_mma()
#endif
}

// Elements of the staged source (a.n, a.h, a.w, a.c); the filters follow it, 16-byte aligned (C is a multiple of
// the format's vector, so the source's bytes are a multiple of 16).
size_t source_elements(const ConvArgs& a) { return size_t(a.n) * a.hw * a.c; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Dynamic shared memory above the default 48 KB needs the kernel's opt-in, once per kernel and device (a template of
// the kernel itself: the tiles' kernels share one function type). carveout_max_shared: also prefer the SM's largest
// shared-memory carveout (less L1), for a kernel whose blocks share the SMs with another kernel's (weight_gradient).
template <auto kKernel>
void allow_shared_bytes(size_t bytes, bool carveout_max_shared = false) {
  static std::atomic<uint64_t> done{0};  // a bit per device
  int device = 0;
  NT_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t(1) << (device % 64);
  if (done.load(std::memory_order_acquire) & bit) return;
  NT_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  if (carveout_max_shared)
    NT_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  done.fetch_or(bit, std::memory_order_acq_rel);
}

template <class Cfg>
struct ConfigTag {
  using type = Cfg;
};

// f(ConfigTag<Ops::Config<...>>) for the tile: the instantiated tiles.
template <class Ops, class F>
void with_config(const Tile& tile, const char* name, F&& f) {
  const auto is = [&](int bm, int bn, int warps) { return tile.bm == bm && tile.bn == bn && tile.warps == warps; };
  using T = Ops;
  if (is(64, 64, 4)) return f(ConfigTag<typename T::template Config<64, 64, 4>>{});
  if (is(64, 32, 4)) return f(ConfigTag<typename T::template Config<64, 32, 4>>{});
  if (is(32, 64, 4)) return f(ConfigTag<typename T::template Config<32, 64, 4>>{});
  if (is(32, 32, 4)) return f(ConfigTag<typename T::template Config<32, 32, 4>>{});
  if (is(64, 64, 8)) return f(ConfigTag<typename T::template Config<64, 64, 8>>{});
  if (is(64, 96, 12)) return f(ConfigTag<typename T::template Config<64, 96, 12>>{});
  if (is(64, 48, 6)) return f(ConfigTag<typename T::template Config<64, 48, 6>>{});
  if (is(32, 96, 12)) return f(ConfigTag<typename T::template Config<32, 96, 12>>{});
  if (is(32, 48, 6)) return f(ConfigTag<typename T::template Config<32, 48, 6>>{});
  if (is(64, 128, 16)) return f(ConfigTag<typename T::template Config<64, 128, 16>>{});
  if (is(32, 128, 16)) return f(ConfigTag<typename T::template Config<32, 128, 16>>{});
  if (is(64, 96, 8)) return f(ConfigTag<typename T::template Config<64, 96, 8>>{});
  NT_CHECK(is(32, 64, 8), name, ": no channels-last tile ", tile.bm, "x", tile.bn, " on ", tile.warps, " warps");
  return f(ConfigTag<typename T::template Config<32, 64, 8>>{});
}

// f(std::integral_constant<int, BN>) for the columns the wgmma kernels have (128, 96, 64 or 32: two warpgroups above
// 64): whether they have bn.
template <class F>
bool with_warpgroup_columns(int bn, F&& f) {
  using std::integral_constant;
  switch (bn) {
    case 128:
      return f(integral_constant<int, 128>{}), true;
    case 96:
      return f(integral_constant<int, 96>{}), true;
    case 64:
      return f(integral_constant<int, 64>{}), true;
    case 32:
      return f(integral_constant<int, 32>{}), true;
    default:
      return false;
  }
}

// f(std::integral_constant<int, BM>, std::integral_constant<int, BN>) for a tile the wgmma kernel has (64 or 32 rows):
// whether it has it.
template <class F>
bool with_warpgroup_config(const Tile& tile, F&& f) {
  if (tile.bm != 64 && tile.bm != 32) return false;
  return with_warpgroup_columns(tile.bn, [&](auto bn) {
    if (tile.bm == 64)
      f(std::integral_constant<int, 64>{}, bn);
    else
      f(std::integral_constant<int, 32>{}, bn);
  });
}

bool has_warpgroup_kernel(const Tile& tile) {
  return with_warpgroup_config(tile, [](auto, auto) {});
}

// f(std::integral_constant<int, BN>) for a tile the wgmma weight kernel has (BF16, 64 rows): whether it has it.
template <class F>
bool with_warpgroup_weight_config(const Tile& tile, F&& f) {
  return tile.format == Format::bf16 && tile.bm == wgmma::kMnValues && with_warpgroup_columns(tile.bn, f);
}

bool has_warpgroup_weight_kernel(const Tile& tile) {
  return with_warpgroup_weight_config(tile, [](auto) {});
}

// The instruction a tile runs on, for a pass whose wgmma kernel has the tile or not (Mma::fastest: wgmma where this
// device and the kernel have it).
Mma instruction_of(const Tile& tile, bool has_warpgroup_pass) {
  if (tile.mma != Mma::fastest) return tile.mma;
  return has_warpgroup_pass && runs_warpgroup_mma() ? Mma::warpgroup : Mma::sync;
}

// f(Operands<format>{}).
template <class F>
void with_format(Format format, F&& f) {
  if (format == Format::bf16) return f(Operands<Format::bf16>{});
  return f(Operands<Format::tf32>{});
}

// After its predecessor, as conv.cu's TF32 tiles (launch_mma_tile), unless beside it by design.
Exec placed(const Exec& exec, bool overlaps_previous) {
  Exec e = exec;
  e.programmatic_launch = exec.programmatic_launch && overlaps_previous;
  return e;
}

const char* format_name(Format format) { return format == Format::bf16 ? "BF16" : "TF32"; }

}  // namespace

bool serves(const ConvArgs& a, Format format) {
  return a.c > 0 && a.c % vector_of(format) == 0 && a.M > 0 && a.N > 0 && a.K > 0;
}

int64_t tiles(const Tile& tile, int M, int N) {
  return ((int64_t(M) + tile.bm - 1) / tile.bm) * ((int64_t(N) + tile.bn - 1) / tile.bn);
}

Tile choose_tile(int M, int N) {
  const int bm = M > 32 ? 64 : 32;
  for (const Tile tile : {Tile{.bm = bm, .bn = 128, .warps = 16}, Tile{.bm = bm, .bn = 96, .warps = 12},
                          Tile{.bm = bm, .bn = 64, .warps = 8}})
    if (tiles(tile, M, N) >= kMinTiles) return tile;
  return Tile{.bm = bm, .bn = 32, .warps = 4};
}

size_t staging_floats(const ConvArgs& a, Format format) {
  const size_t bytes = (source_elements(a) + size_t(a.M) * a.K) * element_bytes(format);
  return (bytes + sizeof(float) - 1) / sizeof(float);
}

size_t input_elements(const ConvArgs& flipped) { return size_t(flipped.n) * flipped.pq * flipped.M; }

void* staged_filters(const ConvArgs& a, Format format, float* staging) {
  return reinterpret_cast<char*>(staging) + source_elements(a) * element_bytes(format);
}

size_t input_floats(const ConvArgs& flipped, Format format) {
  return (input_elements(flipped) * element_bytes(format) + sizeof(float) - 1) / sizeof(float);
}

void stage(const Exec& exec, const ConvArgs& a, Format format, const float* src, const float* w, bool flipped,
           float* staging, const float* x, float* x_cl, bool overlaps_previous) {
  NT_CHECK(serves(a, format), "conv2d: the channels-last ", format_name(format), " kernel needs source channels ",
           "a multiple of ", vector_of(format), ", got ", a.c);
  NT_CHECK(staging != nullptr && aligned16(staging),
           "conv2d: the channels-last operands need a 16-byte aligned workspace (conv2d_workspace_floats)");
  NT_CHECK((x == nullptr) == (x_cl == nullptr) && (x == nullptr || (flipped && aligned16(x_cl))),
           "conv2d: the input is staged beside a backward_data's operands only, into 16-byte aligned memory");
  NT_CHECK(!overlaps_previous || (src == nullptr && x == nullptr && w != nullptr),
           "conv2d: only the filters' stage runs beside its predecessor");
  with_format(format, [&](auto ops) {
    using Ops = decltype(ops);
    using Element = typename Ops::Element;
    Element* typed = reinterpret_cast<Element*>(staging);
    StageArgs<Element> s{};
    s.source = make_transpose(src, typed, a.n, a.c, a.hw);
    // x (n, C = the flipped forward's M, H·W = its P·Q), in the format's elements as the source
    s.input = make_transpose(x, reinterpret_cast<Element*>(x_cl), a.n, a.M, a.pq);
    s.w = w, s.filters = typed + source_elements(a), s.rows = a.M, s.cin = a.c, s.r = a.r, s.s = a.s;
    s.filter_elements = w ? a.M * a.K : 0, s.flipped = flipped;  // no w: the filters are not staged
    s.beside = exec.programmatic_launch && overlaps_previous;
    const int filter_blocks = std::min(kFilterBlocks, (s.filter_elements + kStageThreads - 1) / kStageThreads);
    const double elements = double(source_elements(a)) + (x ? double(input_elements(a)) : 0.0) + s.filter_elements;
    const double moved = elements * (sizeof(float) + sizeof(Element));  // each read once (fp32) and written once
    const char* name = x ? "conv2d_backward_stage" : flipped ? "conv2d_backward_data_stage" : "conv2d_forward_stage";
    launch(exec, name, profile::OpCost{.bytes = moved, .overlaps_previous = s.beside},
           conv_stage_channels_last_kernel<Ops>,
           dim3(static_cast<unsigned>(s.source.blocks + s.input.blocks + filter_blocks)), dim3(kStageThreads), 0, s);
  });
}

void multiply(const Exec& exec, const char* name, const profile::OpCost& cost, ConvArgs a, const float* staging,
              const Tile& tile, const void* source) {
  require_tf32_code(name);
  NT_CHECK(serves(a, tile.format), name, ": the channels-last ", format_name(tile.format),
           " kernel needs source channels a multiple of ", vector_of(tile.format), ", got ", a.c);
  NT_CHECK(staging != nullptr && aligned16(staging) && (source == nullptr || aligned16(source)), name,
           ": the channels-last operands need a 16-byte aligned workspace");
  const Mma mma = instruction_of(tile, has_warpgroup_kernel(tile));
  NT_CHECK(mma != Mma::warpgroup || (runs_warpgroup_mma() && has_warpgroup_kernel(tile)), name,
           ": no wgmma kernel for a ", tile.bm, "x", tile.bn, " tile on this device (wgmma needs sm_90a code)");
  a.split = 1;
  with_format(tile.format, [&](auto ops) {
    using Ops = decltype(ops);
    using Element = typename Ops::Element;
    const Element* filters = reinterpret_cast<const Element*>(staging) + source_elements(a);
    const Element* src_cl = reinterpret_cast<const Element*>(source ? source : staging);
    if (mma == Mma::warpgroup) {
      with_warpgroup_config(tile, [&](auto bm, auto bn) {
        constexpr int BM = decltype(bm)::value, BN = decltype(bn)::value, WG = warpgroups_of(BN);
        const dim3 grid(static_cast<unsigned>((a.N + BN - 1) / BN), static_cast<unsigned>((a.M + BM - 1) / BM));
        constexpr auto kernel = conv_channels_last_wgmma_kernel<Ops, BM, BN, WG>;
        constexpr size_t smem = wgmma_shared_bytes(wgmma_stage_bytes(BN));
        allow_shared_bytes<kernel>(smem);
        launch(placed(exec, a.overlaps_previous), name, cost, kernel, grid, dim3(WG * 128), smem, a, filters, src_cl);
      });
      return;
    }
    with_config<Ops>(tile, name, [&](auto tag) {
      using Cfg = typename decltype(tag)::type;
      constexpr auto kernel = conv_channels_last_kernel<Ops, Cfg>;
      constexpr size_t smem = shared_bytes<Ops, Cfg>();
      allow_shared_bytes<kernel>(smem);
      const dim3 grid(static_cast<unsigned>((a.N + Cfg::BN - 1) / Cfg::BN),
                      static_cast<unsigned>((a.M + Cfg::BM - 1) / Cfg::BM));
      launch(placed(exec, a.overlaps_previous), name, cost, kernel, grid, dim3(Cfg::kThreads), smem, a, filters,
             src_cl);
    });
  });
}

bool serves_weight(const Tile& tile) {
  if (tile.mma == Mma::warpgroup) return has_warpgroup_weight_kernel(tile);
  bool served = false;
  with_format(tile.format, [&](auto ops) {
    using Ops = decltype(ops);
    with_config<Ops>(tile, "conv2d_backward_weight",
                     [&](auto tag) { served = serves_weight_tile<Ops, typename decltype(tag)::type>(); });
  });
  return served;
}

bool serves_weight(const ConvArgs& f, Format format) {
  const int vector = vector_of(format);
  return f.c % vector == 0 && f.M % vector == 0 && f.M > 0 && f.K > 0 && f.N > 0;
}

size_t weight_partial_floats(const ConvArgs& f, int split, bool bias_rows) {
  return split > 1 ? size_t(split) * (size_t(f.M) * f.K + (bias_rows ? f.M : 0)) : 0;
}

int weight_gradient(const Exec& exec, const char* name, const profile::OpCost& cost, ConvArgs f, const float* dy_cl,
                    const float* x_cl, const WeightPlan& plan) {
  require_tf32_code(name);
  const Format format = plan.tile.format;
  const int vector = vector_of(format);
  NT_CHECK(f.c % vector == 0 && f.M % vector == 0, name, ": the channels-last ", format_name(format),
           " backward_weight needs input and output channels a multiple of ", vector, ", got ", f.c, " and ", f.M);
  NT_CHECK(aligned16(dy_cl) && aligned16(x_cl), name, ": the channels-last operands need 16-byte aligned memory");
  NT_CHECK(plan.split >= 1 && (plan.split == 1 || f.partial != nullptr), name, ": a split needs its partials");
  const Mma mma = instruction_of(plan.tile, has_warpgroup_weight_kernel(plan.tile));
  NT_CHECK(mma != Mma::warpgroup || (runs_warpgroup_mma() && has_warpgroup_weight_kernel(plan.tile)), name,
           ": no wgmma backward_weight for a ", format_name(format), " ", plan.tile.bm, "x", plan.tile.bn,
           " tile on this device (wgmma needs sm_90a code, BF16 operands and 64 rows)");
  NT_CHECK(serves_weight(plan.tile), name, ": no channels-last ", format_name(format), " backward_weight on ",
           plan.tile.bm, "x", plan.tile.bn, " tiles of ", plan.tile.warps, " warps");
  f.split = plan.split;
  f.partial_stride = static_cast<int>(size_t(f.M) * f.K + (f.out_rows ? f.M : 0));
  if (f.M == 0 || f.K == 0) return f.partial_stride;
  if (mma == Mma::warpgroup) {
    with_warpgroup_weight_config(plan.tile, [&](auto bn) {
      constexpr int BN = decltype(bn)::value;
      constexpr auto kernel = conv_channels_last_weight_wgmma_kernel<BN>;
      constexpr size_t smem = wgmma_shared_bytes(weight_wgmma_stage_bytes(BN));
      allow_shared_bytes<kernel>(smem);
      const dim3 grid(static_cast<unsigned>((f.K + BN - 1) / BN),
                      static_cast<unsigned>((f.M + wgmma::kMnValues - 1) / wgmma::kMnValues),
                      static_cast<unsigned>(plan.split));
      launch(placed(exec, f.overlaps_previous), name, cost, kernel, grid, dim3(warpgroups_of(BN) * 128), smem, f,
             reinterpret_cast<const __nv_bfloat16*>(dy_cl), reinterpret_cast<const __nv_bfloat16*>(x_cl));
    });
    return f.partial_stride;
  }
  with_format(format, [&](auto ops) {
    using Ops = decltype(ops);
    using Element = typename Ops::Element;
    with_config<Ops>(plan.tile, name, [&](auto tag) {
      using Cfg = typename decltype(tag)::type;
      if constexpr (serves_weight_tile<Ops, Cfg>()) {
        constexpr auto kernel = conv_channels_last_weight_kernel<Ops, Cfg>;
        constexpr size_t smem = size_t(kStages) * Ops::template KMajor<Cfg>::kStageElements * sizeof(Element);
        // backward_data runs beside this kernel (conv2d_backward). An SM's carveout is set as blocks start, and the
        // default one made room for TF32's 90 KB blocks alone: backward_data's waited for them (26.8 µs in the cnn's
        // step at batch 64 against 3.9 with the largest carveout). BF16's 45 KB blocks leave room under the default,
        // and with the largest carveout its epochs were slower (batch 256: 51.5–51.7 → 52.0–52.2 ms; docs/conv.md).
        allow_shared_bytes<kernel>(smem, /*carveout_max_shared=*/std::is_same_v<Ops, Operands<Format::tf32>>);
        const dim3 grid(static_cast<unsigned>((f.K + Cfg::BN - 1) / Cfg::BN),
                        static_cast<unsigned>((f.M + Cfg::BM - 1) / Cfg::BM), static_cast<unsigned>(plan.split));
        launch(placed(exec, f.overlaps_previous), name, cost, kernel, grid, dim3(Cfg::kThreads), smem, f,
               reinterpret_cast<const Element*>(dy_cl), reinterpret_cast<const Element*>(x_cl));
      }
    });
  });
  return f.partial_stride;
}

}  // namespace nt::kernels::cuda::channels_last
