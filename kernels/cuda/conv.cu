// 2-D convolution on the GPU as implicit GEMM, deterministic: fp32 SIMT (FFMA), or with Exec::math TF32 or BF16 on
// tensor cores (conv_mma_kernel, the channels-last kernel; the direct kernels then round their operands the same way,
// kernels/operand.h).
// The passes' operand gathers and stores, and ConvArgs, are in kernels/cuda/conv_passes.cuh (shared with
// conv_direct.cu, the kernels of few taps). The ops take Conv2dArgs (kernels/conv.h) and fill a ConvArgs per pass.
//
// Math and layouts (contract in kernels/conv.h): x, dx (N,C,H,W); w, dw (K,C,R,S); y, dy (N,K,P,Q);
// bias, dbias (K); every output written with `=`. Each pass is one GEMM C(M,N) = A(M,Kg) · B(Kg,N) whose
// operands are never materialized: the slab loaders compute each element's address on the fly (zero
// where a tap falls into the padding), and the epilogue scatters C to its NCHW / KCRS place.
//
//   pass             M     N          Kg         A(m, kg)                    B(kg, n)                     C(m, n) ->
//   forward          K     N·P·Q      C·R·S      w[k=m, (c,r,s)=kg]          x[n, c, p·st−pad+r, ...]     y[n,k=m,p,q]
//   backward_data    C     N·H·W      K·R·S      w[k, c=m, r, s]             dy[n, k, (h+pad−r)/st, ...]  dx[n,c=m,h,w]
//   backward_weight  K     C·R·S      N·P·Q      dy[n, k=m, p, q]            x[n, c, p·st−pad+r, ...]     dw[k=m,crs]
// The output channels are M (the short side) and pixels N, so consecutive GEMM columns are consecutive
// pixels of one image: the gathers of x / dy and the NCHW stores run along rows of the images. In
// backward_data a tap (r,s) lands on an output only where (h+pad−r) and (w+pad−s) are multiples of the
// stride and inside [0,P)×[0,Q); the others load 0 (for stride 1 every in-range tap lands).
//
// Tiling: the tile configurations and the microkernel of the SIMT GEMM (kernels/cuda/gemm_tile.cuh):
// a block owns a BM×BN tile of C, walks Kg in BK-deep slabs held in shared memory as As[k][m] and
// Bs[k][n], two stages, the next slab's global loads in registers while the current one is multiplied
// (one __syncthreads per slab), TM×TN accumulators per thread. Only the loaders differ from gemm.cu:
//   thread t loads the slab column kl = t % BK and rows t / BK + j·(threads/BK), j < BM·BK/threads (A) and
//   BN·BK/threads (B). Per slab a thread decodes its one Kg index kl + k0 once (k_info: two fast divisions);
//   the per-column decode of the tile's N indices (pixel or (c,r,s)) is done once per block into a small
//   shared table `columns` (column()); each element is then an add, two unsigned range compares and a load.
//   Configurations: Medium 64×64 (8×4 per thread, 128 threads, BK 16), Narrow 32×64 (4×4, 128 threads, BK 16),
//   Small 32×32 (4×4, 64 threads, BK 16), the grouped twins NarrowGrouped (BK 32, 2 k-groups) and
//   SmallGrouped (BK 64, 4 k-groups), 256 threads each, whose k-group g multiplies k-rows [g·16, g·16+16) of
//   each slab (the groups' tiles are added in g order after the last slab), and TallGrouped 64×32 (8×4 per
//   thread, BK 48, 3 k-groups, 192 threads); WideGrouped 32×64 (4×8) is for the kernel lab only. Plan
//   (choose_plan): Medium if M > 32 and it yields >= kTargetBlocks tiles; else Tall if M > 32 and it does;
//   else Narrow if N > 32 and it does (grouped below kGroupedSplitBlocks tiles); else Tall (M > 32) or Small,
//   grouped where Kg holds at least two of the grouped slabs. When that gives fewer than kTargetBlocks tiles,
//   Kg is split over S <= kMaxSplit blocks, each keeping >= 64 of Kg, so that tiles·S reaches kTargetBlocks
//   (grouped and tall: kGroupedSplitBlocks, one wave of three blocks per SM).
//   The plan depends on (M, N, Kg) only, not on the device: the same bits on every GPU. A forward and a
//   backward_weight with few taps (C·R·S <= 32) are no GEMM at all: kernels/cuda/conv_direct.cu, whose
//   backward_weight partials go through this file's split-K reduction.
//
// Split-K and determinism: with S > 1, block z of the grid sums Kg slabs [z·L, (z+1)·L) (L = ceil(slabs/S)),
// k ascending, and writes its raw partial tile to workspace[z][m][n] (all S blocks write, an empty range
// writes zeros); then conv_split_reduce_kernel sums, for each output, the S partials in a fixed tree:
// thread row g < G = min(S, 32) adds partials g, g+G, g+2G, ... in order, then row 0 adds the G results
// g ascending, and applies the epilogue. No atomics; the same inputs give the same bits run to run.
// dbias (backward_weight) = row sums of A = dY: the blocks of tile column 0 add their As slabs, k ascending
// (zero-filled past Kg), into one register per tile row, written directly or as the split's partial row
// workspace[z][M·N + m], reduced with the tile.
//
// Forward epilogue (no split): the finished tile goes through shared memory, so y is written a row of pixels
// per store instruction, and with a statistics buffer each block also writes its channels' (mean, M2, count)
// over its pixels for the BatchNorm after the convolution (kernels/conv.h, ChannelPartials; section below).
//
// Workspace: S·(M·N) floats for the pass that splits (+M for backward_weight's bias rows); the query returns
// the maximum over the three passes and every batch size n' <= n. Indices are 32-bit: tensors must hold
// fewer than 2^31 elements (checked).
//
// Length: over the ~700 lines of a kernel file, on purpose. The two GEMM kernels, their staged epilogue, the plan
// that picks among their instantiations and the launchers that instantiate them change together (a tile
// configuration touches all four); what stands alone is out (conv_passes.cuh, conv_direct.cu, conv_halo.cuh).
// The K-loop is not gemm.cu's: the slab loaders gather through the passes, and sharing the loop would risk
// the bits and the speed of both.
#include "kernels/conv.h"
#include "kernels/conv_lab.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "kernels/bf16.h"
#include "kernels/cuda/conv_channels_last.cuh"
#include "kernels/cuda/conv_epilogue.cuh"
#include "kernels/cuda/conv_halo.cuh"
#include "kernels/cuda/conv_passes.cuh"
#include "kernels/cuda/fast_divmod.cuh"
#include "kernels/cuda/gemm_tile.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma_tf32.cuh"
#include "kernels/operand.h"
#include "kernels/tf32.h"

namespace nt::kernels::cuda {

namespace {

using conv_epilogue::kStagedLd;
using conv_epilogue::stage;
using conv_epilogue::write_staged;
using gemm_tile::col_step;
using gemm_tile::multiply_slab;
using gemm_tile::reduce_k_groups;
using gemm_tile::row_step;
using gemm_tile::TileConfig;

using ConvMedium = TileConfig<64, 64, 16, 8, 4, 4>;            // 128 threads, 17.4 KB smem
using ConvNarrow = TileConfig<32, 64, 16, 4, 4, 4>;            // 128 threads, 13.3 KB
using ConvSmall = TileConfig<32, 32, 16, 4, 4, 8>;             //  64 threads,  9.2 KB
using ConvNarrowGrouped = TileConfig<32, 64, 32, 4, 4, 3, 2>;  // 256 threads, 26.6 KB: Narrow's warps x 2 k-groups
using ConvSmallGrouped = TileConfig<32, 32, 64, 4, 4, 3, 4>;   // 256 threads, 36.9 KB: Small's warps x 4 k-groups
using ConvTallGrouped = TileConfig<64, 32, 48, 8, 4, 3, 3>;    // 192 threads, 39.9 KB: 8x4 per thread, 3 k-groups
using ConvWideGrouped = TileConfig<32, 64, 48, 4, 8, 3, 3>;    // 192 threads, 39.9 KB: 4x8 per thread, 3 k-groups
// Tensor-core tiles (Exec::math TF32 or BF16), 4 warps each, BK 32: warp pieces 32×32, 32×16, 16×32, 16×16.
using ConvMma64x64 = mma_tf32::MmaConfig<64, 64, 2, 2>;  // 36.9 KB smem
using ConvMma64x32 = mma_tf32::MmaConfig<64, 32, 2, 2>;  // 27.6 KB
using ConvMma32x64 = mma_tf32::MmaConfig<32, 64, 2, 2>;  // 27.6 KB
using ConvMma32x32 = mma_tf32::MmaConfig<32, 32, 2, 2>;  // 18.4 KB

constexpr int64_t kTargetBlocks = 264;  // two blocks per SM of a 132-SM H100/H200; fixed, so plans are device-free
constexpr int64_t kGroupedSplitBlocks = 396;  // one wave of three blocks per SM (the grouped tiles, 192-256 threads)
constexpr int kMaxSplit = 256;
constexpr int kMinSplitDepth = 64;  // >= 64 products per output per split block

// ---- the implicit-GEMM kernels ------------------------------------------------------------------------------

// Every thread of a GEMM kernel opens with begin_kernel and passes end_kernel before its stores: after its
// predecessor, or, declared independent of it (conv2d_backward's backward_data beside backward_weight), beside
// it, waiting for it only at the end (launch.cuh).

// A thread's share of one Kg slab, into registers: slab column kl of rows rl + j·RowStep, of A (output rows
// m0 + ...) and of B (the block's column table).
template <class Pass, int BK, int RowStep, int ElemsA, int ElemsB>
__device__ __forceinline__ void load_slab_elements(const ConvArgs& a, int slab, int kl, int rl, int m0,
                                                   const int4* columns, float (&a_next)[ElemsA],
                                                   float (&b_next)[ElemsB]) {
  const auto ki = Pass::k_info(a, slab * BK + kl);
#pragma unroll
  for (int j = 0; j < ElemsA; ++j) a_next[j] = load_or_zero(Pass::a_at(a, ki, m0 + rl + j * RowStep));
#pragma unroll
  for (int j = 0; j < ElemsB; ++j) b_next[j] = load_or_zero(Pass::b_at(a, ki, columns[rl + j * RowStep]));
}

// The block's n_slabs slabs from slab_begin, two stages: load(slab) fetches a slab into registers, store(stage)
// puts them into a stage of shared memory, multiply(stage) consumes one. The next slab's global loads are in
// flight while the current one is multiplied; one barrier per slab.
template <class Load, class Store, class Multiply>
__device__ __forceinline__ void run_two_stages(int slab_begin, int n_slabs, Load load, Store store, Multiply multiply) {
  if (n_slabs > 0) {
    load(slab_begin);
    store(0);
  }
  __syncthreads();
  for (int t = 0; t < n_slabs; ++t) {
    const int cur = t & 1;
    const bool has_next = t + 1 < n_slabs;
    if (has_next) load(slab_begin + t + 1);
    multiply(cur);
    if (has_next) store(cur ^ 1);  // the other stage was last read before the previous barrier
    __syncthreads();
  }
}

// backward_weight's dbias: row m's sum goes to out_rows, or (split > 1) after the block's (M, N) partial.
__device__ __forceinline__ void store_row_sum(const ConvArgs& a, float* part, int m, float v) {
  if (a.split == 1) {
    a.out_rows[m] = v;
  } else {
    part[static_cast<size_t>(a.M) * a.N + m] = v;
  }
}

// grid (tiles_n, tiles_m, S): block (x, y, z) computes C tile (y, x) over the z-th share of Kg.
// smem: two stages of As[BK][BM+4], Bs[BK][BN+4] and the BN-entry column table; after the last slab the
// stages park the k-groups' partial tiles (Cfg::KG > 1, gemm_tile.cuh).
template <class Cfg, class Pass>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) conv_gemm_kernel(ConvArgs a, StampRing stamps) {
  begin_kernel(a.overlaps_previous, stamps);
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, kThreads = Cfg::kThreads;
  constexpr int kRowStep = kThreads / BK;                          // rows between one thread's slab elements
  constexpr int kElemsA = BM / kRowStep, kElemsB = BN / kRowStep;  // slab elements per thread
  static_assert(kThreads % BK == 0 && BM % kRowStep == 0 && BN % kRowStep == 0,
                "conv loaders: each thread loads one slab column, threads/BK rows apart");
  static_assert(Cfg::kGroupPartialFloats <= Cfg::kPipelineFloats, "the k-groups' tiles are parked in the stages");
  __shared__ __align__(16) float smem[Cfg::kPipelineFloats];
  __shared__ int4 columns[BN];

  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN, split = blockIdx.z;
  for (int i = threadIdx.x; i < BN; i += kThreads) columns[i] = Pass::column(a, n0 + i);
  __syncthreads();

  const int kl = threadIdx.x % BK, rl = threadIdx.x / BK;  // this thread's slab column and first row
  const int group = threadIdx.x / Cfg::kGroupThreads;      // its k-group: k-rows [group·BK/KG, ...) of each slab
  const int warp = threadIdx.x % Cfg::kGroupThreads / 32, lane = threadIdx.x % 32;
  const int a_off = (warp / Cfg::kWarpsN) * Cfg::WM + (lane / Cfg::kLaneCols) * 4;
  const int b_off = (warp % Cfg::kWarpsN) * Cfg::WN + (lane % Cfg::kLaneCols) * 4;

  const int slabs_total = (a.K + BK - 1) / BK;
  const int slab_begin = min(split * a.slabs_per_split, slabs_total);
  const int n_slabs = min(slab_begin + a.slabs_per_split, slabs_total) - slab_begin;

  const bool row_sums = Pass::kRowSums && a.out_rows != nullptr && blockIdx.x == 0 && threadIdx.x < BM;
  float row_sum = 0.f;

  float acc[Cfg::TM][Cfg::TN];
#pragma unroll
  for (int i = 0; i < Cfg::TM; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::TN; ++j) acc[i][j] = 0.f;

  float a_next[kElemsA], b_next[kElemsB];
  auto load_slab = [&](int slab) {
    load_slab_elements<Pass, BK, kRowStep>(a, slab, kl, rl, m0, columns, a_next, b_next);
  };
  auto stage_a = [&](int st) { return smem + st * Cfg::kStageFloats; };
  auto stage_b = [&](int st) { return smem + st * Cfg::kStageFloats + BK * Cfg::kLdA; };
  auto store_slab = [&](int st) {
    float* As = stage_a(st);
    float* Bs = stage_b(st);
#pragma unroll
    for (int j = 0; j < kElemsA; ++j) As[kl * Cfg::kLdA + rl + j * kRowStep] = a_next[j];
#pragma unroll
    for (int j = 0; j < kElemsB; ++j) Bs[kl * Cfg::kLdB + rl + j * kRowStep] = b_next[j];
  };

  run_two_stages(slab_begin, n_slabs, load_slab, store_slab, [&](int cur) {
    const float* As = stage_a(cur);
    if (row_sums) {
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) row_sum += As[kk * Cfg::kLdA + threadIdx.x];
    }
    multiply_slab<Cfg>(acc, As, stage_b(cur), a_off, b_off, group);
  });
  end_kernel(a.overlaps_previous, stamps);
  reduce_k_groups<Cfg>(acc, smem, group);  // the stages are free: every thread passed the last barrier
  if constexpr (Pass::kStaged) {
    if (a.split == 1) {  // uniform: k-group 0's sums through shared memory, then y and the statistics from there
      static_assert(BM * kStagedLd<BN> <= Cfg::kPipelineFloats, "the finished tile is staged in the stages");
      __syncthreads();  // k-group 0 has read the parked tiles
      if (group == 0) {
#pragma unroll
        for (int i = 0; i < Cfg::TM; ++i)
#pragma unroll
          for (int j = 0; j < Cfg::TN; ++j)
            stage<Pass, BN>(a, smem, m0, a_off + row_step<Cfg>(i), b_off + col_step<Cfg>(j), acc[i][j]);
      }
      write_staged<Pass, BM, BN, kThreads>(a, smem, m0, n0, columns);
      return;
    }
  }
  if (group != 0) return;  // k-group 0 holds the sums (and the row sums: threads < BM)

  float* part = a.partial + static_cast<size_t>(split) * a.partial_stride;  // split > 1: (M, N), then M rows
  if (a.split == 1) {
#pragma unroll
    for (int i = 0; i < Cfg::TM; ++i) {
      const int m = m0 + a_off + row_step<Cfg>(i);
      if (m >= a.M) continue;
#pragma unroll
      for (int j = 0; j < Cfg::TN; ++j) {
        const int cl = b_off + col_step<Cfg>(j);
        if (n0 + cl < a.N) Pass::store(a, m, n0 + cl, columns[cl], acc[i][j]);
      }
    }
  } else {
    gemm_tile::store_partial<Cfg>(acc, part, a.M, a.N, m0 + a_off, n0 + b_off);
  }
  if (row_sums && m0 + threadIdx.x < a.M) store_row_sum(a, part, m0 + threadIdx.x, row_sum);
}

// ---- the tensor-core kernel (Exec::math TF32 or BF16) ---------------------------------------------------------

// The same GEMM, operand addressing, two-stage register prefetch and epilogue as conv_gemm_kernel; the slabs are
// stored as rows of k (As[m][k], Bs[n][k], row stride Cfg::kLd: a loader warp writes 32 consecutive k of one
// row, 32 banks) and multiplied by m16n8k8 TF32 MMAs (kernels/cuda/mma_tf32.cuh). The MMAs make the multiply
// nearly free, so what is left is the gathers and their latency (docs/conv.md: tried with cp.async, slower).
// kMath: the operands rounded to TF32 as the fragments are loaded, or to BF16 (Exec::math) as the slabs are stored
// (once per element and block, and what backward_weight's dbias sums), then multiplied exactly by the same TF32 MMAs.
template <class Cfg, class Pass, Math kMath>
__global__ void __launch_bounds__(Cfg::kThreads) conv_mma_kernel(ConvArgs a, StampRing stamps) {
  begin_kernel(a.overlaps_previous, stamps);
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, kThreads = Cfg::kThreads, kLd = Cfg::kLd;
  constexpr int kRowStep = kThreads / BK;
  constexpr int kElemsA = BM / kRowStep, kElemsB = BN / kRowStep;
  static_assert(kThreads % BK == 0 && BM % kRowStep == 0 && BN % kRowStep == 0,
                "conv loaders: each thread loads one slab column, threads/BK rows apart");
  __shared__ __align__(16) float smem[2 * Cfg::kStageFloats];
  __shared__ int4 columns[BN];

  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN, split = blockIdx.z;
  for (int i = threadIdx.x; i < BN; i += kThreads) columns[i] = Pass::column(a, n0 + i);
  __syncthreads();

  const int kl = threadIdx.x % BK, rl = threadIdx.x / BK;
  const int warp = threadIdx.x / 32;
  const int wm = (warp / Cfg::kWarpsN) * Cfg::WM, wn = (warp % Cfg::kWarpsN) * Cfg::WN;

  const int slabs_total = (a.K + BK - 1) / BK;
  const int slab_begin = min(split * a.slabs_per_split, slabs_total);
  const int n_slabs = min(slab_begin + a.slabs_per_split, slabs_total) - slab_begin;

  const bool row_sums = Pass::kRowSums && a.out_rows != nullptr && blockIdx.x == 0 && threadIdx.x < BM;
  float row_sum = 0.f;

  float acc[Cfg::kTilesM][Cfg::kTilesN][4];
  mma_tf32::zero(acc);

  float a_next[kElemsA], b_next[kElemsB];
  auto load_slab = [&](int slab) {
    load_slab_elements<Pass, BK, kRowStep>(a, slab, kl, rl, m0, columns, a_next, b_next);
  };
  auto stage_a = [&](int st) { return smem + st * Cfg::kStageFloats; };
  auto stage_b = [&](int st) { return smem + st * Cfg::kStageFloats + BM * kLd; };
  auto store_slab = [&](int st) {
    float* As = stage_a(st);
    float* Bs = stage_b(st);
    constexpr bool kBf16 = kMath == Math::bf16;
#pragma unroll
    for (int j = 0; j < kElemsA; ++j) As[(rl + j * kRowStep) * kLd + kl] = kBf16 ? round_to_bf16(a_next[j]) : a_next[j];
#pragma unroll
    for (int j = 0; j < kElemsB; ++j) Bs[(rl + j * kRowStep) * kLd + kl] = kBf16 ? round_to_bf16(b_next[j]) : b_next[j];
  };

  run_two_stages(slab_begin, n_slabs, load_slab, store_slab, [&](int cur) {
    const float* As = stage_a(cur);
    if (row_sums) {  // dbias in fp32, from dy as the slab holds it: rounded under BF16, not under TF32 (operand.h)
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) row_sum += As[threadIdx.x * kLd + kk];
    }
    constexpr auto kFragments = kMath == Math::bf16 ? mma_tf32::Rounding::staged : mma_tf32::Rounding::tf32;
    mma_tf32::multiply_slab<Cfg, kFragments>(acc, As, stage_b(cur), wm, wn);
  });
  end_kernel(a.overlaps_previous, stamps);

  if constexpr (Pass::kStaged) {
    if (a.split == 1) {  // uniform; the stages are free: every thread passed the last barrier
      static_assert(BM * kStagedLd<BN> <= 2 * Cfg::kStageFloats, "the finished tile is staged in the stages");
      conv_epilogue::stage_accumulators<Pass, BN>(a, smem, m0, wm, wn, acc);
      write_staged<Pass, BM, BN, kThreads>(a, smem, m0, n0, columns);
      return;
    }
  }
  float* part = a.partial + static_cast<size_t>(split) * a.partial_stride;  // split > 1: (M, N), then M rows
#pragma unroll
  for (int i = 0; i < Cfg::kTilesM; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = m0 + wm + 16 * i + mma_tf32::row_of(e);
      if (m >= a.M) continue;
#pragma unroll
      for (int j = 0; j < Cfg::kTilesN; ++j) {
        const int cl = wn + 8 * j + mma_tf32::col_of(e);
        if (n0 + cl >= a.N) continue;
        if (a.split == 1) {
          Pass::store(a, m, n0 + cl, columns[cl], acc[i][j][e]);
        } else {
          part[static_cast<size_t>(m) * a.N + n0 + cl] = acc[i][j][e];
        }
      }
    }
  if (row_sums && m0 + threadIdx.x < a.M) store_row_sum(a, part, m0 + threadIdx.x, row_sum);
}

// Split-K reduction (gemm_tile::sum_split_partials): one thread per output of the flattened (M·N [+ M])
// result, the S partials added in a fixed tree, then the epilogue.
template <class Pass>
__global__ void __launch_bounds__(32 * gemm_tile::kSplitReduceRows)
    conv_split_reduce_kernel(ConvArgs a, int total, StampRing stamps) {
  begin_dependent_kernel(stamps);
  float sum;
  if (!gemm_tile::sum_split_partials(a.partial, a.partial_stride, a.split, total, sum)) return;
  const int e = blockIdx.x * 32 + threadIdx.x, mn = a.M * a.N;
  if (e >= mn) {  // backward_weight's bias rows
    a.out_rows[e - mn] = sum;
    return;
  }
  int m, n;
  a.by_n.divmod(e, m, n);
  Pass::store_flat(a, m, n, sum);
}

// ---- launchers -----------------------------------------------------------------------------------------------

using Tile = lab::ConvTile;  // the tiles the plan picks among and the lab forces (kernels/conv_lab.h)

constexpr auto kTf32 = channels_last::Format::tf32;

// The channels-last tiles come last in Tile: conv_channels_last.cu's kernel, not this file's implicit GEMM.
bool is_channels_last(Tile tile) { return tile >= Tile::channels_last_64x64; }

// The channels-last kernel's tile of a lab tile (channels_last_*): rows, columns, warps, the operands' format and the
// MMA instruction (the lab names the one it times).
channels_last::Tile channels_last_tile_of(Tile tile) {
  constexpr auto kBf16 = channels_last::Format::bf16;
  constexpr auto kSync = channels_last::Mma::sync, kWarpgroup = channels_last::Mma::warpgroup;
  switch (tile) {
    case Tile::channels_last_64x64:
      return {.bm = 64, .bn = 64, .warps = 4, .mma = kSync};
    case Tile::channels_last_64x32:
      return {.bm = 64, .bn = 32, .warps = 4, .mma = kSync};
    case Tile::channels_last_32x64:
      return {.bm = 32, .bn = 64, .warps = 4, .mma = kSync};
    case Tile::channels_last_32x32:
      return {.bm = 32, .bn = 32, .warps = 4, .mma = kSync};
    case Tile::channels_last_64x64_8w:
      return {.bm = 64, .bn = 64, .warps = 8, .mma = kSync};
    case Tile::channels_last_32x64_8w:
      return {.bm = 32, .bn = 64, .warps = 8, .mma = kSync};
    case Tile::channels_last_bf16_64x64_8w:
      return {.bm = 64, .bn = 64, .warps = 8, .format = kBf16, .mma = kSync};
    case Tile::channels_last_bf16_32x64_8w:
      return {.bm = 32, .bn = 64, .warps = 8, .format = kBf16, .mma = kSync};
    case Tile::channels_last_bf16_64x32:
      return {.bm = 64, .bn = 32, .warps = 4, .format = kBf16, .mma = kSync};
    case Tile::channels_last_64x96_12w:
      return {.bm = 64, .bn = 96, .warps = 12, .mma = kSync};
    case Tile::channels_last_64x48_6w:
      return {.bm = 64, .bn = 48, .warps = 6, .mma = kSync};
    case Tile::channels_last_32x96_12w:
      return {.bm = 32, .bn = 96, .warps = 12, .mma = kSync};
    case Tile::channels_last_32x48_6w:
      return {.bm = 32, .bn = 48, .warps = 6, .mma = kSync};
    case Tile::channels_last_bf16_64x96_12w:
      return {.bm = 64, .bn = 96, .warps = 12, .format = kBf16, .mma = kSync};
    case Tile::channels_last_bf16_64x48_6w:
      return {.bm = 64, .bn = 48, .warps = 6, .format = kBf16, .mma = kSync};
    case Tile::channels_last_bf16_32x96_12w:
      return {.bm = 32, .bn = 96, .warps = 12, .format = kBf16, .mma = kSync};
    case Tile::channels_last_bf16_32x48_6w:
      return {.bm = 32, .bn = 48, .warps = 6, .format = kBf16, .mma = kSync};
    case Tile::channels_last_64x128_16w:
      return {.bm = 64, .bn = 128, .warps = 16, .mma = kSync};
    case Tile::channels_last_32x128_16w:
      return {.bm = 32, .bn = 128, .warps = 16, .mma = kSync};
    case Tile::channels_last_64x96_8w:
      return {.bm = 64, .bn = 96, .warps = 8, .mma = kSync};
    case Tile::channels_last_bf16_64x128_16w:
      return {.bm = 64, .bn = 128, .warps = 16, .format = kBf16, .mma = kSync};
    case Tile::channels_last_bf16_32x128_16w:
      return {.bm = 32, .bn = 128, .warps = 16, .format = kBf16, .mma = kSync};
    case Tile::channels_last_bf16_64x96_8w:
      return {.bm = 64, .bn = 96, .warps = 8, .format = kBf16, .mma = kSync};
    case Tile::channels_last_wg_64x64:
      return {.bm = 64, .bn = 64, .warps = 4, .mma = kWarpgroup};
    case Tile::channels_last_wg_64x96:
      return {.bm = 64, .bn = 96, .warps = 8, .mma = kWarpgroup};
    case Tile::channels_last_wg_64x128:
      return {.bm = 64, .bn = 128, .warps = 8, .mma = kWarpgroup};
    case Tile::channels_last_wg_32x64:
      return {.bm = 32, .bn = 64, .warps = 4, .mma = kWarpgroup};
    case Tile::channels_last_wg_32x96:
      return {.bm = 32, .bn = 96, .warps = 8, .mma = kWarpgroup};
    case Tile::channels_last_wg_32x128:
      return {.bm = 32, .bn = 128, .warps = 8, .mma = kWarpgroup};
    case Tile::channels_last_bf16_wg_64x64:
      return {.bm = 64, .bn = 64, .warps = 4, .format = kBf16, .mma = kWarpgroup};
    case Tile::channels_last_bf16_wg_64x96:
      return {.bm = 64, .bn = 96, .warps = 8, .format = kBf16, .mma = kWarpgroup};
    case Tile::channels_last_bf16_wg_64x128:
      return {.bm = 64, .bn = 128, .warps = 8, .format = kBf16, .mma = kWarpgroup};
    case Tile::channels_last_bf16_wg_32x64:
      return {.bm = 32, .bn = 64, .warps = 4, .format = kBf16, .mma = kWarpgroup};
    case Tile::channels_last_bf16_wg_32x96:
      return {.bm = 32, .bn = 96, .warps = 8, .format = kBf16, .mma = kWarpgroup};
    case Tile::channels_last_bf16_wg_32x128:
      return {.bm = 32, .bn = 128, .warps = 8, .format = kBf16, .mma = kWarpgroup};
    default:
      NT_CHECK(false, "conv lab: tile ", static_cast<int>(tile), " is no channels-last tile");
      return {};
  }
}

struct Plan {
  Tile tile = Tile::small;
  int split = 1;
};

int slab_depth(Tile tile) {
  switch (tile) {
    case Tile::narrow_grouped:
      return ConvNarrowGrouped::BK;
    case Tile::small_grouped:
      return ConvSmallGrouped::BK;
    case Tile::tall_grouped:
      return ConvTallGrouped::BK;
    case Tile::wide_grouped:
      return ConvWideGrouped::BK;
    case Tile::mma_64x64:
    case Tile::mma_64x32:
    case Tile::mma_32x64:
    case Tile::mma_32x32:
      return ConvMma64x64::BK;
    default:
      return ConvSmall::BK;
  }
}

int64_t tiles_for(int64_t M, int64_t N, int64_t bm, int64_t bn) {
  return ((M + bm - 1) / bm) * std::max<int64_t>((N + bn - 1) / bn, 1);
}

// The tile's rows and columns (BM, BN).
std::pair<int, int> tile_extent(Tile tile) {
  if (is_channels_last(tile)) {
    const channels_last::Tile t = channels_last_tile_of(tile);
    return {t.bm, t.bn};
  }
  switch (tile) {
    case Tile::medium:
      return {ConvMedium::BM, ConvMedium::BN};
    case Tile::narrow:
      return {ConvNarrow::BM, ConvNarrow::BN};
    case Tile::small:
      return {ConvSmall::BM, ConvSmall::BN};
    case Tile::narrow_grouped:
      return {ConvNarrowGrouped::BM, ConvNarrowGrouped::BN};
    case Tile::small_grouped:
      return {ConvSmallGrouped::BM, ConvSmallGrouped::BN};
    case Tile::tall_grouped:
      return {ConvTallGrouped::BM, ConvTallGrouped::BN};
    case Tile::wide_grouped:
      return {ConvWideGrouped::BM, ConvWideGrouped::BN};
    case Tile::mma_64x64:
      return {ConvMma64x64::BM, ConvMma64x64::BN};
    case Tile::mma_64x32:
      return {ConvMma64x32::BM, ConvMma64x32::BN};
    case Tile::mma_32x64:
      return {ConvMma32x64::BM, ConvMma32x64::BN};
    case Tile::mma_32x32:
      return {ConvMma32x32::BM, ConvMma32x32::BN};
    case Tile::halo_64:
      return {64, halo::kTileColumns};
    case Tile::halo_32:
      return {32, halo::kTileColumns};
    default:  // the channels-last tiles, above
      return {1, 1};
  }
}

// The small tile holds one warp per SM quadrant at the cnn's sizes (a few hundred blocks of 64 threads), too few
// to hide the gathers' latency; where Kg spans at least two of its grouped twin's slabs, the twin runs 4 copies
// of the warp grid over the k-rows of each slab instead (same FMAs and loads per thread, 4x fewer slab round
// trips; the copies' tiles are added in group order). The narrow tile gets a grouped twin (2 k-groups) only
// where its tiles fall short of one wave of three 256-thread blocks per SM: conv2's forward at batch 64 (392
// tiles) ran faster inside the cnn's step as NarrowGrouped than as Narrow, while with 784 tiles (backward_data
// at batch 256) Narrow was faster (docs/conv.md, 'Tiles, split-K, workspace': 'Why grouped').
//
// Below the medium tile's two blocks per SM, more than 32 rows (output channels) take the tall tile: 64×32
// with 8×4 per thread, two float4 of A and one of B per 32 FMAs where the 4×4 tiles load two per 16, in 3
// k-groups. bench_conv's variant table (conv2): the forward is faster as Tall than as NarrowGrouped at batch
// 64, backward_weight split 44 ways than as SmallGrouped split 22 (batch 64 and 256); backward_data (32 rows)
// stays SmallGrouped, faster than the 4×8 tile (docs/conv.md, 'Tiles, split-K, workspace': 'The tall tile').
// Kg split over S blocks per tile so that tiles·S reaches `target` blocks, each block keeping at least
// kMinSplitDepth of Kg: the blocks fill the GPU once, where a second, partial wave would leave most SMs idle
// while it runs (288 blocks of the grouped tile, three per SM, ran as 2.2 waves on 132 SMs).
int split_to_fill(int64_t tiles, int K, Tile tile, int64_t target) {
  const int depth = slab_depth(tile);
  const int64_t slabs = (int64_t(K) + depth - 1) / depth;
  const int64_t min_slabs = (kMinSplitDepth + depth - 1) / depth;
  const int64_t most = std::min<int64_t>(kMaxSplit, std::max<int64_t>(slabs / min_slabs, 1));
  return static_cast<int>(std::clamp<int64_t>((target + tiles - 1) / tiles, 1, most));
}

Plan choose_fp32_plan(int M, int N, int K) {
  if (M > ConvNarrow::BM && tiles_for(M, N, ConvMedium::BM, ConvMedium::BN) >= kTargetBlocks)
    return {.tile = Tile::medium, .split = 1};
  const bool tall = M > ConvNarrow::BM && K >= 2 * ConvTallGrouped::BK;
  const int64_t tall_tiles = tiles_for(M, N, ConvTallGrouped::BM, ConvTallGrouped::BN);
  if (tall && tall_tiles >= kTargetBlocks) return {.tile = Tile::tall_grouped, .split = 1};
  if (const int64_t narrow = tiles_for(M, N, ConvNarrow::BM, ConvNarrow::BN);
      N > ConvSmall::BN && narrow >= kTargetBlocks)
    return {
        .tile = K >= 2 * ConvNarrowGrouped::BK && narrow < kGroupedSplitBlocks ? Tile::narrow_grouped : Tile::narrow,
        .split = 1};
  Plan plan{.tile = tall                            ? Tile::tall_grouped
                    : K >= 2 * ConvSmallGrouped::BK ? Tile::small_grouped
                                                    : Tile::small,
            .split = 1};
  const int64_t tiles = tall ? tall_tiles : tiles_for(M, N, ConvSmall::BM, ConvSmall::BN);
  if (tiles < kTargetBlocks)
    plan.split = split_to_fill(tiles, K, plan.tile, plan.tile == Tile::small ? kTargetBlocks : kGroupedSplitBlocks);
  return plan;
}

// TF32: the MMAs cost little next to the gathers, and a block's A slab (the weights in the forward) is loaded
// again for every column tile, so the tile is as wide as the grid allows: 64 columns where that still gives
// kGroupedSplitBlocks tiles, else 32; 64 rows where M exceeds 32. Below kTargetBlocks tiles, Kg is split as
// for the fp32 tiles, to one wave of kGroupedSplitBlocks blocks.
Plan choose_mma_plan(int M, int N, int K) {
  const bool tall = M > 32;
  const bool wide = tiles_for(M, N, tall ? 64 : 32, 64) >= kGroupedSplitBlocks;
  Plan plan{.tile = tall ? (wide ? Tile::mma_64x64 : Tile::mma_64x32) : (wide ? Tile::mma_32x64 : Tile::mma_32x32),
            .split = 1};
  const int64_t tiles = tiles_for(M, N, tall ? 64 : 32, wide ? 64 : 32);
  if (tiles < kTargetBlocks) plan.split = split_to_fill(tiles, K, plan.tile, kGroupedSplitBlocks);
  return plan;
}

// Under TF32 and BF16 alike the MMA tiles (their operands rounded as Exec::math says); else the FFMA tiles.
Plan choose_plan(int M, int N, int K, Math math) {
  return math == Math::fp32 ? choose_fp32_plan(M, N, K) : choose_mma_plan(M, N, K);
}

// The three GEMMs of a shape.
struct PassGemm {
  int M, N, K;
};
PassGemm forward_gemm(const Conv2dShape& s) { return {.M = s.k, .N = s.n * s.p() * s.q(), .K = s.c * s.r * s.s}; }
PassGemm backward_data_gemm(const Conv2dShape& s) { return {.M = s.c, .N = s.n * s.h * s.w, .K = s.k * s.r * s.s}; }
PassGemm backward_weight_gemm(const Conv2dShape& s) {
  return {.M = s.k, .N = s.c * s.r * s.s, .K = s.n * s.p() * s.q()};
}

// Every math mode's plan: the workspace serves them all (Exec::math is the caller's to change between calls).
size_t split_floats(const PassGemm& g, int extra_rows) {
  if (g.M == 0 || g.N + extra_rows == 0) return 0;
  const int split =
      std::max(choose_plan(g.M, g.N, g.K, Math::fp32).split, choose_plan(g.M, g.N, g.K, Math::tf32).split);
  return split > 1 ? size_t(split) * (size_t(g.M) * g.N + size_t(extra_rows)) : 0;
}

ConvArgs make_args(const Exec& exec, const Conv2dShape& s, const PassGemm& g);

// ---- the channels-last plan (kernels/cuda/conv_channels_last.cu) -------------------------------------------
// With TF32 (BF16), a forward whose input channels are a multiple of 4 (8) and that is no direct kernel's, and a
// backward_data at stride 1 whose output channels are, run on the channels-last kernel in that format: its operands
// staged channels-last by one kernel, then 16-byte copies in a 4-stage pipeline (docs/conv.md, 'Tensor cores that are
// fed'). It has no split-K, so it is taken only where its tiles give about every SM a block (channels_last::kMinTiles);
// fewer tiles keep the implicit GEMM, which splits Kg to fill the GPU. Like every plan here, this depends on the shape
// only.

// The forward convolution the channels-last kernel runs for a pass: the forward itself, or backward_data at stride 1
// as the forward of dy (N, K, P, Q) with the flipped filters (C, K, R, S) and pads R−1−pad and S−1−pad, whose
// output is dx (N, C, H, W) (the inverse of the forward's P = H + 2·pad − R + 1 for each axis).
ConvArgs channels_last_args(const Exec& exec, const Conv2dShape& s, bool backward_data) {
  if (!backward_data) return make_args(exec, s, forward_gemm(s));
  const Conv2dShape flipped{
      .n = s.n, .c = s.k, .h = s.p(), .w = s.q(), .k = s.c, .r = s.r, .s = s.s, .stride = 1, .pad = s.r - 1 - s.pad};
  ConvArgs a = make_args(exec, flipped, backward_data_gemm(s));
  a.pad_w = s.s - 1 - s.pad;  // the shape holds one pad: the output's extent and the width's pad follow
  a.p = s.h, a.q = s.w, a.pq = s.h * s.w, a.kpq = s.c * a.pq, a.by_pq = FastDivmod(a.pq), a.by_q = FastDivmod(a.q);
  return a;
}

std::optional<channels_last::Tile> channels_last_plan(const Conv2dShape& s, bool backward_data, Math math) {
  if (math == Math::fp32 || (backward_data ? s.stride != 1 : direct_taps(s))) return std::nullopt;
  const auto format = channels_last::format_of(math);
  const ConvArgs f = channels_last_args(Exec{}, s, backward_data);
  if (!channels_last::serves(f, format)) return std::nullopt;
  channels_last::Tile tile = channels_last::choose_tile(f.M, f.N);
  if (channels_last::tiles(tile, f.M, f.N) < channels_last::kMinTiles) return std::nullopt;
  tile.format = format;
  return tile;
}

// The staged operands' floats where the plan takes the channels-last kernel for the pass in some math mode, else 0
// (TF32's: BF16 stages the same operands in half the bytes, and serves fewer shapes).
size_t channels_last_floats(const Conv2dShape& s, bool backward_data) {
  return channels_last_plan(s, backward_data, Math::tf32)
             ? channels_last::staging_floats(channels_last_args(Exec{}, s, backward_data))
             : 0;
}

// Offsets into the workspace stay 16-byte aligned (the channels-last kernel's copies).
size_t align4(size_t floats) { return (floats + 3) / 4 * 4; }

// ---- backward_weight on the channels-last kernel (TF32 and BF16) ----
// Where backward_data runs channels-last (so dy is staged anyway) and x's and dy's channels are a multiple of the
// format's vector (4 TF32, 8 BF16), backward_weight multiplies the same staged dy and x staged beside it (one stage
// kernel for both), on k-major slabs of 32 pixels, where conv.cu's MMA kernel gathers and rounds every operand itself
// (docs/conv.md, 'backward_weight on staged operands'). Its tiles are few (M × R·S·C: 3 of 64×96 for the cnn's
// conv2), so the pixels are split over parts, and this file's reduction adds the parts: as many as give kTargetBlocks
// blocks (two an SM), each part at least kMinWeightSlabs slabs deep. Measured in the cnn's epochs (docs/conv.md): at
// batch 64, 44 parts of 9 slabs (88.7–89.8 ms) beat 88 of 4.5 (90.4–90.7), whose blocks crowded backward_data beside
// them; at batch 256, 88 parts of 18 (53.6–53.8) beat 44 of 36 (54.7–55.1).
// TF32 takes it without a bias only: the TF32 contract sums dbias over the unrounded dy, and the staged dy is rounded.
// A TF32 block's four stages take 90 KB of shared memory (BF16's 45); the kernel asks for the SM's largest shared
// memory carveout so that backward_data's blocks still fit beside it (conv_channels_last.cu, weight_gradient).
constexpr int kMinWeightSlabs = 9;  // 288 pixels a part at least

std::optional<channels_last::WeightPlan> channels_last_weight_plan(const Conv2dShape& s, Math math, bool bias) {
  const auto data_tile = channels_last_plan(s, true, math);
  if (!data_tile || (math == Math::tf32 && bias)) return std::nullopt;
  const auto format = channels_last::format_of(math);
  const ConvArgs f = make_args(Exec{}, s, forward_gemm(s));
  if (!channels_last::serves_weight(f, format)) return std::nullopt;
  channels_last::Tile tile = f.M > 32 ? channels_last::Tile{.bm = 64, .bn = 96, .warps = 8}
                                      : channels_last::Tile{.bm = 32, .bn = 96, .warps = 12};
  tile.format = format;
  const int64_t tiles = channels_last::tiles(tile, f.M, f.K), slabs = (int64_t(f.N) + 31) / 32;
  const int64_t deepest = (slabs + kMinWeightSlabs - 1) / kMinWeightSlabs;  // parts of kMinWeightSlabs
  const int64_t split = std::clamp<int64_t>((kTargetBlocks + tiles - 1) / tiles, 1, deepest);
  return channels_last::WeightPlan{.tile = tile, .split = static_cast<int>(split)};
}

// conv2d_backward's workspace holds backward_weight's partials first, backward_data's part after them. The weight's
// region: the partials of either kernel in any math mode (dbias rows included).
size_t weight_region_floats(const Conv2dShape& s) {
  size_t floats = split_floats(backward_weight_gemm(s), s.k);
  for (const Math math : {Math::bf16, Math::tf32})
    if (const auto plan = channels_last_weight_plan(s, math, /*bias=*/false))
      floats = std::max(floats,
                        channels_last::weight_partial_floats(make_args(Exec{}, s, forward_gemm(s)), plan->split, true));
  return floats;
}

// The staged operands of the channels-last backward_weight, after `partials` floats of partials: dy (with room for
// backward_data's flipped filters) at source_at, then x channels-last at input_at. conv2d_backward and
// conv2d_backward_weight alone lay out the same (partials = weight_region_floats); the kernel lab sizes the partials of
// its forced split.
struct StagedWeightLayout {
  size_t source_at, input_at, floats;
};
StagedWeightLayout staged_weight_layout(const Conv2dShape& s, size_t partials, channels_last::Format format) {
  const ConvArgs flipped = channels_last_args(Exec{}, s, true);
  const size_t source_at = align4(partials);
  const size_t input_at = source_at + align4(channels_last::staging_floats(flipped, format));
  return {
      .source_at = source_at, .input_at = input_at, .floats = input_at + channels_last::input_floats(flipped, format)};
}

// With the channels-last weight plan, backward_data's part also holds x staged.
size_t workspace_for(const Conv2dShape& s) {
  const PassGemm bw = backward_weight_gemm(s);
  const size_t weight =
      direct_taps(s) ? size_t(direct_weight_blocks(s)) * (size_t(bw.M) * bw.N + bw.M) : weight_region_floats(s);
  const size_t data = std::max(split_floats(backward_data_gemm(s), 0), channels_last_floats(s, true));
  const size_t forward =
      direct_taps(s) ? 0 : std::max(split_floats(forward_gemm(s), 0), channels_last_floats(s, false));
  size_t staged = 0;
  for (const Math math : {Math::bf16, Math::tf32})
    if (const auto plan = channels_last_weight_plan(s, math, /*bias=*/false))
      staged = std::max(staged, staged_weight_layout(s, weight, plan->tile.format).floats);
  return std::max({forward, (direct_taps(s) ? 0 : align4(weight)) + data, weight, staged});
}

void check_shape(const Conv2dShape& s) {
  NT_CHECK(s.n >= 0 && s.c >= 0 && s.h >= 0 && s.w >= 0 && s.k >= 0 && s.r >= 0 && s.s >= 0,
           "conv2d: negative size in shape");
  NT_CHECK(s.stride >= 1 && s.pad >= 0, "conv2d: stride ", s.stride, " / pad ", s.pad, " out of range");
  constexpr int64_t kMax = (int64_t(1) << 31) - 64;  // 32-bit indexing, with room for a slab past the end
  const int64_t x = int64_t(s.n) * s.c * s.h * s.w, y = int64_t(s.n) * s.k * s.p() * s.q();
  const int64_t wts = int64_t(s.k) * s.c * s.r * s.s;
  NT_CHECK(x < kMax && y < kMax && wts < kMax, "conv2d: tensors of 2^31 elements or more are not supported");
}

ConvArgs make_args(const Exec& exec, const Conv2dShape& s, const PassGemm& g) {
  ConvArgs a{};
  a.math = exec.math;
  a.n = s.n, a.c = s.c, a.h = s.h, a.w = s.w, a.k = s.k, a.r = s.r, a.s = s.s, a.stride = s.stride, a.pad = s.pad;
  a.p = s.p(), a.q = s.q();
  a.hw = s.h * s.w, a.pq = a.p * a.q, a.rs = s.r * s.s, a.chw = s.c * a.hw, a.kpq = s.k * a.pq;
  a.M = g.M, a.N = g.N, a.K = g.K;
  a.by_rs = FastDivmod(a.rs), a.by_s = FastDivmod(s.s), a.by_pq = FastDivmod(a.pq), a.by_q = FastDivmod(a.q);
  a.by_hw = FastDivmod(a.hw), a.by_w = FastDivmod(s.w), a.by_n = FastDivmod(g.N);
  a.by_c = FastDivmod(s.c), a.pad_w = s.pad;
  return a;
}

template <class Cfg>
dim3 tile_grid(const ConvArgs& a) {
  return dim3(static_cast<unsigned>(std::max((a.N + Cfg::BN - 1) / Cfg::BN, 1)),
              static_cast<unsigned>((a.M + Cfg::BM - 1) / Cfg::BM), static_cast<unsigned>(a.split));
}

template <class Cfg, class Pass>
void launch_tile(const Exec& exec, const char* name, const profile::OpCost& cost, const ConvArgs& a) {
  launch(exec, name, cost, conv_gemm_kernel<Cfg, Pass>, tile_grid<Cfg>(a), dim3(Cfg::kThreads), 0, a);
}

// Launched without the programmatic attribute: its blocks are placed only once the kernel before has finished.
// Placed early (the default), the same kernels ran much longer inside the cnn's step, and the epoch was slower;
// in bench_conv, back to back, they ran as fast either way. The FFMA tiles, tried the same way, gain nothing at
// batch 64 (docs/conv.md, 'TF32 tensor cores': 'Launched after its predecessor', has the CUPTI times and
// epochs).
// Launched after its predecessor has completed (not placed early by programmatic dependent launch: docs/conv.md),
// unless it overlaps its predecessor by design.
template <class Cfg, class Pass>
void launch_mma_tile(const Exec& exec, const char* name, const profile::OpCost& cost, const ConvArgs& a) {
  require_tf32_code(name);
  Exec placed = exec;
  placed.programmatic_launch = exec.programmatic_launch && a.overlaps_previous;
  const auto kernel =
      exec.math == Math::bf16 ? conv_mma_kernel<Cfg, Pass, Math::bf16> : conv_mma_kernel<Cfg, Pass, Math::tf32>;
  launch(placed, name, cost, kernel, tile_grid<Cfg>(a), dim3(Cfg::kThreads), 0, a);
}

// ---- stride 1 on TF32 tensor cores from a halo tile (kernels/cuda/conv_halo.cuh) ------------------------------

// The forward and backward_data as the halo kernel's stride-1 convolution of a source with a filter bank.
halo::Args halo_forward_args(const Conv2dShape& s, const float* x, const float* w, float* y) {
  halo::Args a{};
  a.n = s.n, a.cs = s.c, a.hs = s.h, a.ws = s.w, a.m = s.k, a.ho = s.p(), a.wo = s.q();
  a.r = s.r, a.s = s.s, a.pad_h = s.pad, a.pad_w = s.pad, a.flipped = false;
  a.src = x, a.w = w, a.dst = y;
  return a;
}
halo::Args halo_backward_data_args(const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  halo::Args a{};
  a.n = s.n, a.cs = s.k, a.hs = s.p(), a.ws = s.q(), a.m = s.c, a.ho = s.h, a.wo = s.w;
  a.r = s.r, a.s = s.s, a.pad_h = s.r - 1 - s.pad, a.pad_w = s.s - 1 - s.pad, a.flipped = true;
  a.src = dy, a.w = w, a.dst = dx;
  return a;
}

// The halo kernel serves a pass in TF32 at stride 1 where its padded source row fits the tile (halo_plan). The
// kernel lab's only: slower than the implicit GEMM at the cnn's shapes (conv_halo.cuh, docs/conv.md).
halo::Plan halo_plan_for(const Exec& exec, const Conv2dShape& s, const halo::Args& a, int bm = 0) {
  if (exec.math != Math::tf32 || s.stride != 1) return {};
  return halo::halo_plan(a, bm);
}

void launch_halo(const Exec& exec, const char* name, const profile::OpCost& cost, const halo::Plan& plan) {
  require_tf32_code(name);
  const auto kernel = plan.bm == 64 ? halo::conv_halo_kernel<64> : halo::conv_halo_kernel<32>;
  static const bool opted_in = [] {  // dynamic shared memory above the default 48 KB
    for (auto k : {halo::conv_halo_kernel<64>, halo::conv_halo_kernel<32>})
      NT_CUDA_CHECK(
          cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(halo::kSharedBudget)));
    return true;
  }();
  (void)opted_in;
  Exec placed = exec;  // after its predecessor, as the other TF32 kernels (launch_mma_tile)
  placed.programmatic_launch = false;
  launch(placed, name, cost, kernel, halo::halo_grid(plan), dim3(halo::kThreads), plan.smem_bytes, plan.args);
}

// Adds the a.split partials of a.partial (stride a.partial_stride) into the pass's outputs: the M·N of C,
// then `rows` bias rows (0 or M).
template <class Pass>
void launch_split_reduce(const Exec& exec, const char* reduce_name, const ConvArgs& a, int rows) {
  const int total = a.M * a.N + rows;
  const profile::OpCost reduce_cost{.bytes = 4.0 * total * (a.split + 1), .flops = double(total) * a.split};
  launch(exec, reduce_name, reduce_cost, conv_split_reduce_kernel<Pass>, gemm_tile::split_reduce_grid(total),
         gemm_tile::split_reduce_block(a.split, total), 0, a, total);
}

// Runs one pass: the GEMM kernel, then (split > 1) the reduction. rows: the bias rows written (0 or M).
// A pass in two halves, so that another kernel can go between them (conv2d_backward): launch_pass launches the
// GEMM kernel and returns its args (the plan's split set), finish_pass the split-K reduction where there is one.
template <class Pass>
ConvArgs launch_pass(const Exec& exec, const char* name, ConvArgs a, int rows, double flops, double bytes,
                     float* workspace, const Plan* forced = nullptr) {
  const Plan plan = forced ? *forced : choose_plan(a.M, a.N, a.K, exec.math);
  const int slabs = (a.K + slab_depth(plan.tile) - 1) / slab_depth(plan.tile);
  a.split = plan.split;
  a.slabs_per_split = (slabs + plan.split - 1) / plan.split;
  a.partial_stride = a.M * a.N + rows;
  a.partial = workspace;
  NT_CHECK(plan.split == 1 || workspace != nullptr, name, ": needs a workspace (conv2d_workspace_floats)");
  const bool tensor_cores = plan.tile >= Tile::mma_64x64;  // the MMA and halo tiles
  const profile::OpCost cost{.bytes = bytes,
                             .flops = flops,
                             .math = !tensor_cores             ? Math::fp32
                                     : exec.math == Math::bf16 ? Math::bf16
                                                               : Math::tf32,
                             .overlaps_previous = a.overlaps_previous};
  switch (plan.tile) {
    case Tile::medium:
      launch_tile<ConvMedium, Pass>(exec, name, cost, a);
      break;
    case Tile::narrow:
      launch_tile<ConvNarrow, Pass>(exec, name, cost, a);
      break;
    case Tile::small:
      launch_tile<ConvSmall, Pass>(exec, name, cost, a);
      break;
    case Tile::narrow_grouped:
      launch_tile<ConvNarrowGrouped, Pass>(exec, name, cost, a);
      break;
    case Tile::small_grouped:
      launch_tile<ConvSmallGrouped, Pass>(exec, name, cost, a);
      break;
    case Tile::tall_grouped:
      launch_tile<ConvTallGrouped, Pass>(exec, name, cost, a);
      break;
    case Tile::wide_grouped:
      launch_tile<ConvWideGrouped, Pass>(exec, name, cost, a);
      break;
    case Tile::mma_64x64:
      launch_mma_tile<ConvMma64x64, Pass>(exec, name, cost, a);
      break;
    case Tile::mma_64x32:
      launch_mma_tile<ConvMma64x32, Pass>(exec, name, cost, a);
      break;
    case Tile::mma_32x64:
      launch_mma_tile<ConvMma32x64, Pass>(exec, name, cost, a);
      break;
    case Tile::mma_32x32:
      launch_mma_tile<ConvMma32x32, Pass>(exec, name, cost, a);
      break;
    default:
      NT_CHECK(false, name, ": the halo and channels-last tiles are not this file's implicit GEMM");
      break;
  }
  return a;
}

template <class Pass>
void finish_pass(const Exec& exec, const char* reduce_name, const ConvArgs& a, int rows) {
  if (a.split > 1) launch_split_reduce<Pass>(exec, reduce_name, a, rows);
}

template <class Pass>
void run_pass(const Exec& exec, const char* name, const char* reduce_name, ConvArgs a, int rows, double flops,
              double bytes, float* workspace, const Plan* forced = nullptr) {
  finish_pass<Pass>(exec, reduce_name, launch_pass<Pass>(exec, name, a, rows, flops, bytes, workspace, forced), rows);
}

// The chunks of the forward's epilogue statistics for one math mode: the plan's column tiles, where it runs
// the implicit GEMM without a split; else 0.
int statistics_chunks(const Conv2dShape& s, Math math) {
  const PassGemm g = forward_gemm(s);
  if (direct_taps(s) || g.M == 0 || g.N == 0) return 0;
  if (const auto tile = channels_last_plan(s, false, math)) return (g.N + tile->bn - 1) / tile->bn;
  const Plan plan = choose_plan(g.M, g.N, g.K, math);
  if (plan.split != 1) return 0;
  return (g.N + tile_extent(plan.tile).second - 1) / tile_extent(plan.tile).second;
}

// The largest f(shape) over every batch size n' <= s.n: a layer plans with its full batch and may run any
// smaller one (whose plan may split where the full batch's does not).
template <class F>
size_t most_over_batches(const Conv2dShape& s, const F& f) {
  check_shape(s);
  size_t most = 0;
  for (int n = 1; n <= s.n; ++n) {
    Conv2dShape t = s;
    t.n = n;
    most = std::max(most, f(t));
  }
  return most;
}

double conv_flops(const Conv2dShape& s) { return 2.0 * s.n * s.k * s.p() * s.q() * double(s.c) * s.r * s.s; }
double conv_bytes(const Conv2dShape& s) {
  return 4.0 * (double(s.n) * s.c * s.h * s.w + double(s.k) * s.c * s.r * s.s + double(s.n) * s.k * s.p() * s.q());
}
profile::OpCost tensor_core_cost(const Conv2dShape& s, channels_last::Format format) {
  return profile::OpCost{.bytes = conv_bytes(s),
                         .flops = conv_flops(s),
                         .math = format == channels_last::Format::bf16 ? Math::bf16 : Math::tf32};
}

// One forward (or, flipped, backward_data) on the channels-last kernel: its operands staged into `workspace`, then
// the multiply (conv2d_backward, which runs backward_weight between the two, calls them itself).
// staged (nullable): the source as the layer's neighbour wrote it (conv2d's staged operands), so that only the filters
// are staged, beside the kernel before where the caller promises it (Conv2dArgs::overlaps_previous), or not at all
// where that neighbour staged them too (filters_staged).
void run_channels_last(const Exec& exec, const profile::OpCost& cost, const ConvArgs& f, const float* src,
                       const float* w, bool flipped, float* workspace, const channels_last::Tile& tile,
                       const void* staged = nullptr, bool overlaps_previous = false, bool filters_staged = false) {
  if (!filters_staged)
    channels_last::stage(exec, f, tile.format, staged ? nullptr : src, w, flipped, workspace, nullptr, nullptr,
                         staged && overlaps_previous);
  channels_last::multiply(exec, flipped ? "conv2d_backward_data" : "conv2d_forward", cost, f, workspace, tile, staged);
}

// The weight GEMM on staged dy_cl and x_cl into `partials` (or dw, dbias nullable); returns the args of its split-K
// reduction (finish_pass<ChannelsLastWeightPass>), with weight_gradient's partial stride.
ConvArgs launch_channels_last_weight(const Exec& exec, const Conv2dShape& s, const float* dy_cl, const float* x_cl,
                                     float* dw, float* dbias, float* partials, const channels_last::WeightPlan& plan) {
  ConvArgs f = make_args(exec, s, forward_gemm(s));
  f.out = dw, f.out_rows = dbias, f.partial = partials;
  ConvArgs wa = make_args(exec, s, backward_weight_gemm(s));
  wa.out = dw, wa.out_rows = dbias, wa.split = plan.split, wa.partial = partials;
  wa.partial_stride = channels_last::weight_gradient(exec, "conv2d_backward_weight",
                                                     tensor_core_cost(s, plan.tile.format), f, dy_cl, x_cl, plan);
  return wa;
}

// backward_weight alone on the channels-last kernel: dy and x staged by one kernel, the GEMM, the split-K reduction.
// partials: the floats the partials may take (the layout's offset). staged: its x_staged and dy_staged (nullable), as
// the layer's neighbours wrote them (conv2d's staged operands), are not staged again.
void channels_last_backward_weight(const Exec& exec, const Conv2dShape& s, const float* x, const float* dy,
                                   const Conv2dArgs<float>& staged, float* dw, float* dbias, float* workspace,
                                   const channels_last::WeightPlan& plan, size_t partials) {
  const StagedWeightLayout layout = staged_weight_layout(s, partials, plan.tile.format);
  const auto* x_cl = staged.x_staged ? reinterpret_cast<const float*>(staged.x_staged) : workspace + layout.input_at;
  const auto* dy_cl =
      staged.dy_staged ? reinterpret_cast<const float*>(staged.dy_staged) : workspace + layout.source_at;
  if (!staged.x_staged || !staged.dy_staged)
    channels_last::stage(exec, channels_last_args(exec, s, true), plan.tile.format, staged.dy_staged ? nullptr : dy,
                         /*w=*/nullptr, /*flipped=*/true, workspace + layout.source_at, staged.x_staged ? nullptr : x,
                         staged.x_staged ? nullptr : workspace + layout.input_at);
  finish_pass<ChannelsLastWeightPass>(exec, "conv2d_backward_weight_reduce",
                                      launch_channels_last_weight(exec, s, dy_cl, x_cl, dw, dbias, workspace, plan),
                                      dbias ? s.k : 0);
}

// Checks a call's staged operands against the plan (the layer asks conv2d_takes_staged first). bias: the pass sums
// dbias (a TF32 plan stages nothing for it); a forward's bias changes nothing.
void check_staged(const Exec& exec, const Conv2dArgs<float>& args, const char* op, bool bias) {
  NT_CHECK((args.x_staged == nullptr && args.dy_staged == nullptr) || conv2d_takes_staged(args.shape, exec.math, bias),
           op, ": staged (channels-last) operands, but this shape's plan does not multiply them");
}

}  // namespace

bool conv2d_takes_staged(const Conv2dShape& s, Math math, bool bias) {
  return stages_activations(math) && channels_last_plan(s, false, math) && channels_last_weight_plan(s, math, bias);
}

size_t conv2d_statistics_floats(const Conv2dShape& s) {
  return most_over_batches(s, [](const Conv2dShape& t) {  // either math mode
    return size_t(3) * size_t(t.k) *
           std::max(
               {statistics_chunks(t, Math::fp32), statistics_chunks(t, Math::tf32), statistics_chunks(t, Math::bf16)});
  });
}

size_t conv2d_workspace_floats(const Conv2dShape& s) { return most_over_batches(s, workspace_for); }

Conv2dFilterStage conv2d_filter_stage(const Conv2dShape& s, Math math, const float* w, float* workspace) {
  check_shape(s);
  const PassGemm g = forward_gemm(s);
  if (!stages_activations(math) || g.M == 0 || g.N == 0 || direct_taps(s)) return {};
  const auto tile = channels_last_plan(s, false, math);
  if (!tile) return {};
  Exec exec;  // the geometry alone
  exec.math = math;
  return Conv2dFilterStage{.w = w,
                           .filters = channels_last::staged_filters(make_args(exec, s, g), tile->format, workspace),
                           .k = s.k,
                           .c = s.c,
                           .r = s.r,
                           .s = s.s};
}

int conv2d_forward(const Exec& exec, const Conv2dArgs<float>& args) {
  const Conv2dShape& s = args.shape;
  check_shape(s);
  check_staged(exec, args, "conv2d_forward", /*bias=*/false);
  NT_CHECK(!args.filters_staged || args.x_staged != nullptr,
           "conv2d_forward: filters_staged without x_staged (only the writer of a staged input stages the filters)");
  const PassGemm g = forward_gemm(s);
  if (g.M == 0 || g.N == 0) return 0;  // y is empty
  ConvArgs a = make_args(exec, s, g);
  a.a_src = args.w, a.b_src = args.x, a.bias = args.bias, a.out = args.y;
  if (direct_taps(s)) {
    launch_direct_forward(exec, profile::OpCost{.bytes = conv_bytes(s), .flops = conv_flops(s)}, a);
    return 0;
  }
  const int chunks = args.statistics ? statistics_chunks(s, exec.math) : 0;
  a.stats = chunks > 0 ? args.statistics : nullptr;
  if (const auto tile = channels_last_plan(s, false, exec.math)) {
    run_channels_last(exec, tensor_core_cost(s, tile->format), a, args.x, args.w, /*flipped=*/false, args.workspace,
                      *tile, args.x_staged, args.overlaps_previous, args.filters_staged);
    return chunks;
  }
  run_pass<ForwardPass>(exec, "conv2d_forward", "conv2d_forward_reduce", a, 0, conv_flops(s), conv_bytes(s),
                        args.workspace);
  return chunks;
}

void conv2d_backward_data(const Exec& exec, const Conv2dArgs<float>& args) {
  const Conv2dShape& s = args.shape;
  check_shape(s);
  check_staged(exec, args, "conv2d_backward_data", /*bias=*/false);
  const PassGemm g = backward_data_gemm(s);
  if (g.M == 0 || g.N == 0) return;  // dx is empty
  if (const auto tile = channels_last_plan(s, true, exec.math)) {
    ConvArgs f = channels_last_args(exec, s, true);
    f.out = args.dx;
    return run_channels_last(exec, tensor_core_cost(s, tile->format), f, args.dy, args.w, /*flipped=*/true,
                             args.workspace, *tile, args.dy_staged, args.overlaps_previous);
  }
  ConvArgs a = make_args(exec, s, g);
  a.a_src = args.w, a.b_src = args.dy, a.out = args.dx;
  run_pass<BackwardDataPass>(exec, "conv2d_backward_data", "conv2d_backward_data_reduce", a, 0, conv_flops(s),
                             conv_bytes(s), args.workspace);
}

void conv2d_backward_weight(const Exec& exec, const Conv2dArgs<float>& args) {
  const Conv2dShape& s = args.shape;
  const float *x = args.x, *dy = args.dy;
  float *dbias = args.dbias, *workspace = args.workspace;
  check_shape(s);
  check_staged(exec, args, "conv2d_backward_weight", args.dbias != nullptr);
  const PassGemm g = backward_weight_gemm(s);
  if (g.M == 0 || (g.N == 0 && dbias == nullptr)) return;  // nothing to write
  ConvArgs a = make_args(exec, s, g);
  a.a_src = dy, a.b_src = x, a.out = args.dw, a.out_rows = dbias;
  if (direct_taps(s) && g.K > 0) {
    NT_CHECK(workspace != nullptr, "conv2d_backward_weight: needs a workspace (conv2d_workspace_floats)");
    ConvArgs d = make_args(exec, s, forward_gemm(s));
    d.a_src = dy, d.b_src = x, d.partial = workspace, d.partial_stride = g.M * g.N + g.M;
    launch_direct_backward_weight(exec, profile::OpCost{.bytes = conv_bytes(s), .flops = conv_flops(s)}, s, d);
    a.split = direct_weight_blocks(s), a.partial = workspace, a.partial_stride = d.partial_stride;
    launch_split_reduce<BackwardWeightPass>(exec, "conv2d_backward_weight_reduce", a, dbias ? g.M : 0);
    return;
  }
  if (const auto plan = channels_last_weight_plan(s, exec.math, dbias != nullptr)) {
    NT_CHECK(workspace != nullptr, "conv2d_backward_weight: needs a workspace (conv2d_workspace_floats)");
    return channels_last_backward_weight(exec, s, x, dy, args, args.dw, dbias, workspace, *plan,
                                         weight_region_floats(s));
  }
  run_pass<BackwardWeightPass>(exec, "conv2d_backward_weight", "conv2d_backward_weight_reduce", a, dbias ? g.M : 0,
                               conv_flops(s), conv_bytes(s), workspace);
}

bool conv2d_backward(const Exec& exec, const Conv2dArgs<float>& args) {
  const Conv2dShape& s = args.shape;
  const float *x = args.x, *dy = args.dy, *w = args.w;
  float *dw = args.dw, *dbias = args.dbias, *dx = args.dx, *workspace = args.workspace;
  check_shape(s);
  check_staged(exec, args, "conv2d_backward", args.dbias != nullptr);
  const PassGemm gw = backward_weight_gemm(s), gd = backward_data_gemm(s);
  if (!dx || gd.M == 0 || gd.N == 0 || direct_taps(s) || gw.M == 0 || gw.N == 0 || gw.K == 0) {
    cuda::conv2d_backward_weight(exec, args);
    if (dx) cuda::conv2d_backward_data(exec, args);
    return false;  // not claimed: the last kernel may be backward_data's
  }
  // backward_weight's GEMM, then backward_data beside it (it reads dy and w, writes dx and its own part of the
  // workspace, none of which backward_weight touches), then the split-K reductions, after both. Beside: the
  // TF32 GEMMs of the cnn's conv2 hold a small share of the SMs' warps each, gather-bound (docs/conv.md).
  const int rows = dbias ? gw.M : 0;
  const size_t weight_region = weight_region_floats(s);
  float* data_workspace = workspace ? workspace + align4(weight_region) : nullptr;
  // backward_data on the channels-last kernel: its operands are staged first, before backward_weight's GEMM, so that
  // what runs beside that GEMM reads only what kernels before it wrote. With the channels-last weight plan the same
  // kernel stages x, and backward_weight multiplies the staged dy and x.
  const auto channels_last_tile = channels_last_plan(s, true, exec.math);
  const auto weight_plan = channels_last_weight_plan(s, exec.math, dbias != nullptr);
  ConvArgs flipped{};
  // x and dy channels-last: staged here, or as the layer's neighbours wrote them (x_staged, dy_staged). With both
  // given, only the filters are staged, beside the kernel before where the caller promises it.
  float* x_cl = weight_plan && workspace && !args.x_staged
                    ? workspace + staged_weight_layout(s, weight_region, weight_plan->tile.format).input_at
                    : nullptr;
  if (channels_last_tile) {
    flipped = channels_last_args(exec, s, true);
    flipped.out = dx;
    const bool filters_alone = args.dy_staged && !x_cl;
    channels_last::stage(exec, flipped, channels_last_tile->format, args.dy_staged ? nullptr : dy, w,
                         /*flipped=*/true, data_workspace, x_cl ? x : nullptr, x_cl,
                         filters_alone && args.overlaps_previous);
  }
  const auto* dy_cl = args.dy_staged ? reinterpret_cast<const float*>(args.dy_staged) : data_workspace;
  // backward_weight's GEMM into its partials (or dw), and their reduction.
  const auto weight_gemm = [&](const Exec& e) {
    if (weight_plan) {  // channels_last_weight_plan implies channels_last_tile
      NT_CHECK(workspace != nullptr, "conv2d_backward: needs a workspace (conv2d_workspace_floats)");
      return launch_channels_last_weight(e, s, dy_cl,
                                         args.x_staged ? reinterpret_cast<const float*>(args.x_staged) : x_cl, dw,
                                         dbias, workspace, *weight_plan);
    }
    ConvArgs wa = make_args(e, s, gw);
    wa.a_src = dy, wa.b_src = x, wa.out = dw, wa.out_rows = dbias;
    return launch_pass<BackwardWeightPass>(e, "conv2d_backward_weight", wa, rows, conv_flops(s), conv_bytes(s),
                                           workspace);
  };
  const auto weight_reduction = [&](const Exec& e, const ConvArgs& wa) {
    if (weight_plan)
      finish_pass<ChannelsLastWeightPass>(e, "conv2d_backward_weight_reduce", wa, rows);
    else
      finish_pass<BackwardWeightPass>(e, "conv2d_backward_weight_reduce", wa, rows);
  };
  // backward_data (with its reduction, if split), launched beside backward_weight's GEMM where `beside_weight`: only
  // while its grid fits one wave (of three blocks per SM): a larger one crowded the other's blocks (the cnn at batch
  // 256, whose backward_data has 1568 blocks, was slower side by side; batch 64 gained: docs/conv.md, 'The two
  // backward passes side by side').
  const auto data_pass = [&](bool beside_weight) {
    if (channels_last_tile) {
      flipped.overlaps_previous = beside_weight && exec.programmatic_launch &&
                                  channels_last::tiles(*channels_last_tile, gd.M, gd.N) <= kGroupedSplitBlocks;
      profile::OpCost cost = tensor_core_cost(s, channels_last_tile->format);
      cost.overlaps_previous = flipped.overlaps_previous;
      channels_last::multiply(exec, "conv2d_backward_data", cost, flipped, data_workspace, *channels_last_tile,
                              args.dy_staged);
      return;
    }
    const Plan data_plan = choose_plan(gd.M, gd.N, gd.K, exec.math);
    const auto [bm, bn] = tile_extent(data_plan.tile);
    const bool one_wave = tiles_for(gd.M, gd.N, bm, bn) * data_plan.split <= kGroupedSplitBlocks;
    ConvArgs da = make_args(exec, s, gd);
    da.a_src = w, da.b_src = dy, da.out = dx;
    da.overlaps_previous = beside_weight && exec.programmatic_launch && one_wave;
    da = launch_pass<BackwardDataPass>(exec, "conv2d_backward_data", da, 0, conv_flops(s), conv_bytes(s),
                                       data_workspace);
    finish_pass<BackwardDataPass>(exec, "conv2d_backward_data_reduce", da, 0);
  };
  if (args.weight_side) {
    // backward_weight and its reduction on the side stream, once the stage above (if any) has run: beside
    // backward_data and whatever the caller enqueues after it (the backward of the layers before), since only the
    // optimizer reads dw. backward_data then waits for the stage alone.
    args.weight_side->fork();
    const Exec side = args.weight_side->beside(exec);
    weight_reduction(side, weight_gemm(side));
    data_pass(/*beside_weight=*/false);
    return false;  // this stream's last kernel is backward_data's
  }
  const ConvArgs wa = weight_gemm(exec);
  data_pass(/*beside_weight=*/true);
  weight_reduction(exec, wa);
  return wa.split > 1;  // then the last kernel is backward_weight's reduction (conv_split_reduce_kernel)
}

// Kernel-lab entry (kernels/conv_lab.h): one pass with the tile and split forced.
namespace lab {
size_t conv2d_variant_workspace_floats(int pass, const Conv2dShape& s, int split) {
  const PassGemm g = pass == 0 ? forward_gemm(s) : pass == 1 ? backward_data_gemm(s) : backward_weight_gemm(s);
  const size_t partials = split > 1 ? size_t(split) * (size_t(g.M) * g.N + g.M) : 0;
  if (g.M == 0 || g.N == 0) return partials;
  if (pass == 2)  // TF32's staging, the larger format's
    return std::max(partials, staged_weight_layout(s, partials, kTf32).floats);
  if (pass == 1 && s.stride != 1) return partials;
  const ConvArgs f = channels_last_args(Exec{}, s, pass == 1);  // a channels-last tile's staged operands
  return std::max(partials, channels_last::serves(f) ? channels_last::staging_floats(f) : 0);
}

void conv2d_variant(const Exec& exec, int pass, const Conv2dArgs<float>& args, int tile, int split) {
  const Conv2dShape& s = args.shape;
  const float *x = args.x, *w = args.w, *dy = args.dy;
  float* out = pass == 0 ? args.y : pass == 1 ? args.dx : args.dw;
  float* workspace = args.workspace;
  check_shape(s);
  NT_CHECK(pass >= 0 && pass <= 2 && tile >= 0 && tile < lab::conv_tile_count && split >= 1, "conv lab: pass ", pass,
           " tile ", tile, " split ", split, " out of range");
  const Plan plan{.tile = static_cast<Tile>(tile), .split = split};
  const double flops = conv_flops(s), bytes = conv_bytes(s);
  if (plan.tile == Tile::halo_64 || plan.tile == Tile::halo_32) {
    NT_CHECK(pass != 2, "conv lab: the halo kernel has no backward_weight");
    Exec tf32 = exec;
    tf32.math = Math::tf32;
    const halo::Args a = pass == 0 ? halo_forward_args(s, x, w, out) : halo_backward_data_args(s, dy, w, out);
    const halo::Plan halo_plan = halo_plan_for(tf32, s, a, plan.tile == Tile::halo_64 ? 64 : 32);
    NT_CHECK(halo_plan.fits, "conv lab: the halo kernel does not serve this shape");
    return launch_halo(tf32, pass == 0 ? "conv2d_forward" : "conv2d_backward_data",
                       profile::OpCost{.bytes = bytes, .flops = flops, .math = profile::Math::tf32}, halo_plan);
  }
  if (is_channels_last(plan.tile)) {
    NT_CHECK(pass == 0 || pass == 2 || s.stride == 1, "conv lab: the channels-last backward_data needs stride 1");
    const channels_last::Tile tile = channels_last_tile_of(plan.tile);
    Exec tensor_cores = exec;
    tensor_cores.math = tile.format == kTf32 ? Math::tf32 : Math::bf16;
    if (pass == 2) {
      const channels_last::WeightPlan weight_plan{.tile = tile, .split = split};
      const size_t partials =
          channels_last::weight_partial_floats(make_args(Exec{}, s, forward_gemm(s)), split, /*bias_rows=*/true);
      return channels_last_backward_weight(tensor_cores, s, x, dy, /*staged=*/{}, out, /*dbias=*/nullptr, workspace,
                                           weight_plan, partials);
    }
    ConvArgs f = channels_last_args(tensor_cores, s, pass == 1);
    f.out = out;
    return run_channels_last(tensor_cores, tensor_core_cost(s, tile.format), f, pass == 0 ? x : dy, w,
                             /*flipped=*/pass == 1, workspace, tile);
  }
  if (pass == 0) {
    ConvArgs a = make_args(exec, s, forward_gemm(s));
    a.a_src = w, a.b_src = x, a.out = out;
    run_pass<ForwardPass>(exec, "conv2d_forward", "conv2d_forward_reduce", a, 0, flops, bytes, workspace, &plan);
  } else if (pass == 1) {
    ConvArgs a = make_args(exec, s, backward_data_gemm(s));
    a.a_src = w, a.b_src = dy, a.out = out;
    run_pass<BackwardDataPass>(exec, "conv2d_backward_data", "conv2d_backward_data_reduce", a, 0, flops, bytes,
                               workspace, &plan);
  } else {
    ConvArgs a = make_args(exec, s, backward_weight_gemm(s));
    a.a_src = dy, a.b_src = x, a.out = out;
    run_pass<BackwardWeightPass>(exec, "conv2d_backward_weight", "conv2d_backward_weight_reduce", a, 0, flops, bytes,
                                 workspace, &plan);
  }
}
}  // namespace lab

}  // namespace nt::kernels::cuda
