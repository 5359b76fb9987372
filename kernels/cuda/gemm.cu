// CUDA GEMM with fused epilogues, deterministic: fp32 SIMT (FFMA only, no TF32). Under Exec::math BF16 the operands are
// rounded to BF16 as each slab is staged and multiplied on tensor cores (m16n8k16, fp32 sums; 'BF16 operands on
// tensor cores' below) where the plan takes the shape, else on the same FFMA tiles (round_slab).
//
// Math (contract in kernels/gemm.h):
//   C(M,N) = epilogue(op(A)(M,K) · op(B)(K,N)), written with `=`;
//   optionally a_row_sums[m] = Σ_k op(A)[m,k], written with `=`.
// Layouts, row-major with leading dimensions:
//   A (M,K) lda  | trans_a: stored (K,M) lda       B (K,N) ldb | trans_b: stored (N,K) ldb       C (M,N) ldc
//   bias (N); mask (M,N) with ldc; a_row_sums (M).
//
// Tiling. A block owns a BM×BN tile of C and walks K in BK-wide slabs. Each slab of op(A) is stored in
// shared memory transposed, As[k][m], and the slab of op(B) as Bs[k][n], so the inner loop reads both
// operands as float4 along m and n. A transposed operand changes only how a slab is loaded (template
// parameters TransA/TransB): the side that is contiguous along k in memory (A, or B with trans_b) is
// read as float4 along k and written to shared memory column-wise; the side contiguous along m or n is
// read and written as float4 rows. Global loads are float4 when the pointer is 16-byte aligned and the
// leading dimension a multiple of 4 (checked at run time; otherwise the same kernel with scalar loads,
// template parameter Vec), always bounds-checked with zero fill, so M, N, K need not be multiples
// of anything.
//   Threads: each warp's 32 lanes form a 4×8 grid; a thread owns a TM×TN micro-tile made of (TM/4)×(TN/4)
//   4×4 pieces spaced 16 rows and 32 columns apart, so one warp-wide float4 read of As touches 4 distinct
//   vectors (broadcast) and one of Bs 8 consecutive vectors (all 32 banks), both conflict-free; the warp
//   tile is (4·TM)×(8·TN), the block (BM/(4·TM))×(BN/(8·TN)) warps.
//   Pipeline: two shared-memory stages; while a slab is multiplied, each thread already holds the next
//   slab's global loads in registers and stores them to the other stage afterwards: one __syncthreads
//   per slab.
//   Shared memory per block = 2 · BK · ((BM + 4) + (BN + 4)) · 4 bytes (+4 floats of padding per row keep
//   float4 alignment and spread the column-wise stores over the banks). With split-K the stages are
//   reused afterwards for the block's partial tile: max(that, (BM·BN + BM) · 4) bytes.
//
// Configurations (the launcher picks one from M, N and the SM count; rule in choose_plan):
//   large  128×128×8,  8×8 per thread, 256 threads, 16.9 KB smem: the classic SIMT SGEMM shape; 64 FFMA per
//          4 shared loads, so the FMA pipes, not shared memory, are the limit.
//   medium  64×64×16,  8×4 per thread, 128 threads, 17.4 KB: 4× more blocks for mid-sized problems.
//   small   32×32×16,  4×4 per thread,  64 threads,  9.2 KB: the MNIST MLP's GEMMs (M = 64 batch rows), where
//          the large tile would leave all but a handful of SMs idle.
//   small grouped  32×32×64, the small tile's warps ×4 k-groups (gemm_tile.cuh), 256 threads, 36.9 KB: each
//          64-deep slab is shared by 4 copies of the small tile's warps, 16 k-rows each, and their tiles are
//          added at the end. Same FMAs per thread per slab as the small tile, a quarter of the slabs: the
//          small tile's time on the MLP's shapes is a chain of slab round trips run by 2 warps per SM
//          (Nsight Compute: low occupancy, shared-memory and fixed-latency stalls; docs/gemm-lab.md).
//   The first whose tile count reaches the SM count wins; below that the small grouped tile, or the small
//   one where K fits one of its slabs or fits one grouped slab over two tiles or more per SM; when that gives
//   fewer blocks than SMs, K is split over S ∈ {2, 4, 8}
//   blocks of a thread-block cluster (sm_90). Where even 8 splits leave SMs idle and K is long (the cnn's
//   3136→128 layer: 8 tiles at batch 64) and the caller passed a workspace, K is split over up to 256 blocks
//   of the small grouped tile through that workspace instead, one 64-deep slab or more each, and a second
//   kernel adds the partials (gemm_tile::sum_split_partials) and applies the epilogue.
//
// Determinism. Every output's K-sum runs in one fixed order: k ascending inside a block; with split-K
// each block of a cluster sums one contiguous K range and block `rank` then adds the S partial tiles
// from the cluster's distributed shared memory in rank order 0..S-1 before the epilogue: no atomics,
// no workspace, one launch. Split through a workspace, block z writes its raw partial to
// workspace[z][M·N + M] (the tile, then the row sums) and the reduction sums them in a fixed tree. The split factor
// depends only on (M, N, K) and the device's SM count, so a given problem on a given GPU always gives the same bits.
// a_row_sums is computed by the blocks of tile column 0, k ascending from the shared-memory slabs (zero-filled past K),
// and written once.
//
// Epilogue at the store: bias adds bias[n]; bias_relu then clamps with (v < 0 ? 0 : v) so a NaN
// propagates as in std::max(v, 0); relu_mask selects (mask[m*ldc+n] > 0 ? v : 0). Each output element's
// mask is read by the thread that writes that element, just before, so relu_mask may run in place
// (mask == C).
#include "kernels/gemm.h"
#include "kernels/gemm_lab.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "kernels/cuda/gemm_tile.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/operand.h"

namespace nt::kernels::cuda {

namespace {

namespace cg = cooperative_groups;

// Everything a kernel needs, by value (one parameter block).
struct KernelArgs {
  int M, N, K;
  const float* A;
  int lda;
  const float* B;
  int ldb;
  float* C;
  int ldc;
  const float* bias;
  const float* mask;
  float* a_row_sums;
  int tiles_m, tiles_n;    // grid of BM×BN output tiles (tiles_n >= 1 even when N == 0, for the row sums)
  bool store_vec;          // C is 16-byte aligned and ldc % 4 == 0: float4 stores
  bool overlaps_previous;  // GemmArgs::overlaps_previous (launch.cuh: begin/end_overlapping_kernel)
  float* partial;          // split through the workspace: S partials of partial_stride = M·N + M floats
  int partial_stride;
};

// ---- tile configurations, slab loaders, microkernel: kernels/cuda/gemm_tile.cuh (shared with conv.cu) ---

using gemm_tile::col_step;
using gemm_tile::load4;
using gemm_tile::multiply_slab;
using gemm_tile::reduce_k_groups;
using gemm_tile::row_step;
using gemm_tile::SlabLoader;
using gemm_tile::TileConfig;

using LargeTile = TileConfig<128, 128, 8, 8, 8, 2>;
using MediumTile = TileConfig<64, 64, 16, 8, 4, 4>;
using SmallTile = TileConfig<32, 32, 16, 4, 4, 8>;
using SmallGroupedTile = TileConfig<32, 32, 64, 4, 4, 2, 4>;  // the small tile ×4 k-groups: 256 threads

constexpr int kMaxSplitK = 8;    // the portable thread-block cluster size
constexpr int kMinSplitK = 128;  // below this K a split-K cluster costs more than it saves (choose_plan)
// Template split factor of gemm_block meaning "split over gridDim.z blocks through the workspace".
constexpr int kWorkspaceSplit = 0;
constexpr int kMaxWorkspaceSplit = 256;
constexpr int kMinWorkspaceSplitK = 16 * SmallGroupedTile::BK;  // twice the cluster's splits of one slab or more

// ---- epilogue --------------------------------------------------------------------------------------

template <Epilogue E>
__device__ __forceinline__ float finish(float v, int m, int n, const KernelArgs& p) {
  if constexpr (E == Epilogue::bias) return v + __ldg(&p.bias[n]);
  if constexpr (E == Epilogue::bias_relu) {
    const float x = v + __ldg(&p.bias[n]);
    return x < 0.f ? 0.f : x;
  }
  // A plain load, not __ldg: the mask may be C itself (in place), read here by the thread that then writes it.
  if constexpr (E == Epilogue::relu_mask) return p.mask[static_cast<size_t>(m) * p.ldc + n] > 0.f ? v : 0.f;
  return v;
}

// Writes this thread's micro-tile: C[m][n] = finish(acc), bounds-checked, float4 where the row allows.
template <class Cfg, Epilogue E>
__device__ __forceinline__ void store_micro_tile(const float (&acc)[Cfg::TM][Cfg::TN], int m_base, int n_base,
                                                 const KernelArgs& p) {
#pragma unroll
  for (int i = 0; i < Cfg::TM; ++i) {
    const int m = m_base + row_step<Cfg>(i);
    if (m >= p.M) continue;
    float* crow = p.C + static_cast<size_t>(m) * p.ldc;
#pragma unroll
    for (int d = 0; d < Cfg::TN / 4; ++d) {
      const int n = n_base + col_step<Cfg>(4 * d);
      if (p.store_vec && n + 3 < p.N) {
        *reinterpret_cast<float4*>(crow + n) =
            make_float4(finish<E>(acc[i][4 * d + 0], m, n + 0, p), finish<E>(acc[i][4 * d + 1], m, n + 1, p),
                        finish<E>(acc[i][4 * d + 2], m, n + 2, p), finish<E>(acc[i][4 * d + 3], m, n + 3, p));
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (n + j < p.N) crow[n + j] = finish<E>(acc[i][4 * d + j], m, n + j, p);
      }
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void store_micro_tile(const float (&acc)[Cfg::TM][Cfg::TN], int m_base, int n_base,
                                                 const KernelArgs& p, Epilogue e) {
  switch (e) {  // uniform across the grid; one specialised store loop per epilogue
    case Epilogue::none:
      store_micro_tile<Cfg, Epilogue::none>(acc, m_base, n_base, p);
      break;
    case Epilogue::bias:
      store_micro_tile<Cfg, Epilogue::bias>(acc, m_base, n_base, p);
      break;
    case Epilogue::bias_relu:
      store_micro_tile<Cfg, Epilogue::bias_relu>(acc, m_base, n_base, p);
      break;
    case Epilogue::relu_mask:
      store_micro_tile<Cfg, Epilogue::relu_mask>(acc, m_base, n_base, p);
      break;
  }
}

// Split-K: this block's share of the tile, reduced over the cluster's S partial tiles in rank order.
template <class Cfg, int S, Epilogue E>
__device__ __forceinline__ void reduce_and_store(float* const (&parts)[S], int rank, int m0, int n0,
                                                 const KernelArgs& p) {
  constexpr int kElems = Cfg::BM * Cfg::BN, kShare = kElems / S;
  static_assert(kElems % S == 0, "split factor must divide the tile");
  for (int e = rank * kShare + threadIdx.x; e < (rank + 1) * kShare; e += Cfg::kThreads) {
    const int m = m0 + e / Cfg::BN, n = n0 + e % Cfg::BN;
    if (m >= p.M || n >= p.N) continue;
    float v = parts[0][e];
#pragma unroll
    for (int q = 1; q < S; ++q) v += parts[q][e];
    p.C[static_cast<size_t>(m) * p.ldc + n] = finish<E>(v, m, n, p);
  }
}

// ---- the block's work ------------------------------------------------------------------------------

// RoundBf16 (Exec::math BF16, a template parameter so that the fp32 kernels' code is what it was): a slab's values are
// rounded in registers on their way to shared memory, once per block rather than once per use. The row sums then read
// the rounded op(A), as the CPU twin's do.
template <bool RoundBf16, int N>
__device__ __forceinline__ void round_slab(float4 (&v)[N]) {
  if constexpr (RoundBf16) {
#pragma unroll
    for (int j = 0; j < N; ++j)
      v[j] = make_float4(round_to_bf16(v[j].x), round_to_bf16(v[j].y), round_to_bf16(v[j].z), round_to_bf16(v[j].w));
  }
}

// Shared memory after the K loop: with cluster split-K (S > 1) the block's partial tile and its row sums,
// then the k-groups' parked tiles; the pipeline's stages before that.
template <class Cfg, int S>
constexpr int kGroupParkOffset = S > 1 ? Cfg::BM* Cfg::BN + Cfg::BM : 0;
template <class Cfg, int S>
constexpr int kBlockSmemFloats = std::max(Cfg::kPipelineFloats, kGroupParkOffset<Cfg, S> + Cfg::kGroupPartialFloats);

// Output tile (tile_m, tile_n) of the grid, grouped 8 tile rows at a time so that concurrently running
// blocks share slabs of A and B in L2.
__device__ __forceinline__ void tile_of_block(const KernelArgs& p, int& tile_m, int& tile_n) {
  constexpr int kGroup = 8;
  const int pid = blockIdx.x;
  const int per_group = kGroup * p.tiles_n;
  const int first_m = (pid / per_group) * kGroup;
  const int group_rows = min(p.tiles_m - first_m, kGroup);
  tile_m = first_m + (pid % per_group) % group_rows;
  tile_n = (pid % per_group) / group_rows;
}

// C tile (or, with S != 1, this block's partial of it over K-range `split`) for the tile (tile_m, tile_n).
// S: 1 (no split), 2..8 (the blocks of a cluster), kWorkspaceSplit (gridDim.z blocks, partials to
// p.partial). smem: Cfg::kPipelineFloats floats (and BM·BN + BM with S > 1), 16-byte aligned.
template <class Cfg, bool TransA, bool TransB, bool Vec, int S, bool RoundBf16>
__device__ __forceinline__ void gemm_block(const KernelArgs& p, float* smem, Epilogue epilogue, int split) {
  using LoadA = SlabLoader<Cfg::BM, Cfg::BK, Cfg::kThreads, !TransA, Vec>;  // op(A) as (M, K)
  using LoadB = SlabLoader<Cfg::BN, Cfg::BK, Cfg::kThreads, TransB, Vec>;   // op(B)ᵀ as (N, K)

  int tile_m, tile_n;
  tile_of_block(p, tile_m, tile_n);
  const int m0 = tile_m * Cfg::BM, n0 = tile_n * Cfg::BN;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / (Cfg::kWarpsM * Cfg::kWarpsN), w = warp % (Cfg::kWarpsM * Cfg::kWarpsN);
  const int a_off = (w / Cfg::kWarpsN) * Cfg::WM + (lane / Cfg::kLaneCols) * 4;
  const int b_off = (w % Cfg::kWarpsN) * Cfg::WN + (lane % Cfg::kLaneCols) * 4;

  // This block's K range in steps of one k-group's rows (kGroupK; a whole slab when KG == 1):
  // [step_begin, step_end), all of K when S == 1. Slabs start at step_begin and are zero-filled past
  // k_end, so a slab reaching into the next split's range adds nothing from it.
  const int splits = S == kWorkspaceSplit ? static_cast<int>(gridDim.z) : S;
  const int steps_total = (p.K + Cfg::kGroupK - 1) / Cfg::kGroupK;
  const int steps_per_split = (steps_total + splits - 1) / splits;
  const int step_begin = min(split * steps_per_split, steps_total);
  const int n_steps = min(step_begin + steps_per_split, steps_total) - step_begin;
  const int n_slabs = (n_steps + Cfg::KG - 1) / Cfg::KG;
  const int k_begin = step_begin * Cfg::kGroupK, k_end = min(p.K, (step_begin + n_steps) * Cfg::kGroupK);

  // Row sums of op(A): tile column 0 only, thread r (of k-group 0) owns tile row r.
  const bool row_sums = p.a_row_sums != nullptr && tile_n == 0;
  float row_sum = 0.f;

  float acc[Cfg::TM][Cfg::TN];
#pragma unroll
  for (int i = 0; i < Cfg::TM; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::TN; ++j) acc[i][j] = 0.f;

  float4 a_next[LoadA::kVecs], b_next[LoadB::kVecs];
  auto stage_a = [&](int s) { return smem + s * Cfg::kStageFloats; };
  auto stage_b = [&](int s) { return smem + s * Cfg::kStageFloats + Cfg::BK * Cfg::kLdA; };

  if (n_slabs > 0) {
    LoadA::load(a_next, p.A, p.lda, p.M, k_end, m0, k_begin);
    LoadB::load(b_next, p.B, p.ldb, p.N, k_end, n0, k_begin);
    round_slab<RoundBf16>(a_next), round_slab<RoundBf16>(b_next);
    LoadA::store(stage_a(0), a_next);
    LoadB::store(stage_b(0), b_next);
  }
  __syncthreads();

  // The same two-stage loop as the convolution's run_two_stages (conv.cu), written out: through that helper's
  // lambdas the compiler placed this kernel's index math differently and the mlp's epoch slowed by a sixth
  // (docs/gemm-lab.md, "One K-loop for the GEMM and the convolution").
  for (int t = 0; t < n_slabs; ++t) {
    const int cur = t & 1;
    const bool has_next = t + 1 < n_slabs;
    if (has_next) {  // issue the next slab's global loads now; they land while this slab is multiplied
      const int k0 = k_begin + (t + 1) * Cfg::BK;
      LoadA::load(a_next, p.A, p.lda, p.M, k_end, m0, k0);
      LoadB::load(b_next, p.B, p.ldb, p.N, k_end, n0, k0);
    }
    const float* As = stage_a(cur);
    if (row_sums && threadIdx.x < Cfg::BM) {
#pragma unroll
      for (int kk = 0; kk < Cfg::BK; ++kk) row_sum += As[kk * Cfg::kLdA + threadIdx.x];
    }
    if (t * Cfg::KG + group < n_steps) multiply_slab<Cfg>(acc, As, stage_b(cur), a_off, b_off, group);
    if (has_next) {
      round_slab<RoundBf16>(a_next), round_slab<RoundBf16>(b_next);
      LoadA::store(stage_a(cur ^ 1), a_next);
      LoadB::store(stage_b(cur ^ 1), b_next);
    }
    __syncthreads();
  }
  // The stages are free (the loop ended on a barrier): k-groups 1.. park their tiles past the split-K
  // partial's place, and group 0 adds them up.
  reduce_k_groups<Cfg>(acc, smem + kGroupParkOffset<Cfg, S>, group);

  if constexpr (S == 1) {
    if (group == 0) store_micro_tile<Cfg>(acc, m0 + a_off, n0 + b_off, p, epilogue);
    if (row_sums && threadIdx.x < Cfg::BM && m0 + threadIdx.x < p.M) p.a_row_sums[m0 + threadIdx.x] = row_sum;
  } else if constexpr (S == kWorkspaceSplit) {
    float* part = p.partial + static_cast<size_t>(split) * p.partial_stride;  // (M, N) row-major, then M row sums
    if (group == 0) gemm_tile::store_partial<Cfg>(acc, part, p.M, p.N, m0 + a_off, n0 + b_off);
    if (row_sums && threadIdx.x < Cfg::BM && m0 + threadIdx.x < p.M)
      part[static_cast<size_t>(p.M) * p.N + m0 + threadIdx.x] = row_sum;
  } else {
#if NT_CLUSTERS
    // Park the block's partial tile and row sums at the start of shared memory.
    float* part = smem;  // (BM, BN) row-major, then BM row sums
    if (group == 0) {
#pragma unroll
      for (int i = 0; i < Cfg::TM; ++i)
#pragma unroll
        for (int d = 0; d < Cfg::TN / 4; ++d)
          *reinterpret_cast<float4*>(&part[(a_off + row_step<Cfg>(i)) * Cfg::BN + b_off + col_step<Cfg>(4 * d)]) =
              make_float4(acc[i][4 * d + 0], acc[i][4 * d + 1], acc[i][4 * d + 2], acc[i][4 * d + 3]);
    }
    if (threadIdx.x < Cfg::BM) part[Cfg::BM * Cfg::BN + threadIdx.x] = row_sum;

    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every partial of the cluster is in place
    float* parts[S];
#pragma unroll
    for (int q = 0; q < S; ++q) parts[q] = cluster.map_shared_rank(part, q);
    const int rank = static_cast<int>(cluster.block_rank());
    switch (epilogue) {
      case Epilogue::none:
        reduce_and_store<Cfg, S, Epilogue::none>(parts, rank, m0, n0, p);
        break;
      case Epilogue::bias:
        reduce_and_store<Cfg, S, Epilogue::bias>(parts, rank, m0, n0, p);
        break;
      case Epilogue::bias_relu:
        reduce_and_store<Cfg, S, Epilogue::bias_relu>(parts, rank, m0, n0, p);
        break;
      case Epilogue::relu_mask:
        reduce_and_store<Cfg, S, Epilogue::relu_mask>(parts, rank, m0, n0, p);
        break;
    }
    if (row_sums && rank == 0 && threadIdx.x < Cfg::BM && m0 + threadIdx.x < p.M) {
      float v = parts[0][Cfg::BM * Cfg::BN + threadIdx.x];
#pragma unroll
      for (int q = 1; q < S; ++q) v += parts[q][Cfg::BM * Cfg::BN + threadIdx.x];
      p.a_row_sums[m0 + threadIdx.x] = v;
    }
    cluster_exit_barrier();
#endif
  }
}

// ---- kernels ---------------------------------------------------------------------------------------

// grid: (tiles_m · tiles_n); one block per output tile.
template <class Cfg, bool TransA, bool TransB, bool Vec, bool RoundBf16>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    gemm_kernel(KernelArgs p, Epilogue epilogue, StampRing stamps) {
  begin_kernel(p.overlaps_previous, stamps);
  __shared__ __align__(16) float smem[kBlockSmemFloats<Cfg, 1>];
  gemm_block<Cfg, TransA, TransB, Vec, 1, RoundBf16>(p, smem, epilogue, 0);
  end_kernel(p.overlaps_previous, stamps);
}

// grid: (tiles_m · tiles_n, 1, S); the S blocks of a cluster share one output tile and split K.
template <class Cfg, bool TransA, bool TransB, bool Vec, int S, bool RoundBf16>
__global__ void NT_CLUSTER_DIMS(1, 1, S) __launch_bounds__(Cfg::kThreads)
    gemm_splitk_kernel(KernelArgs p, Epilogue epilogue, StampRing stamps) {
  begin_kernel(p.overlaps_previous, stamps);
  static_assert(S >= 2 && S <= kMaxSplitK, "split-K factor must fit a portable cluster (2..8)");
#if NT_CLUSTERS
  __shared__ __align__(16) float smem[kBlockSmemFloats<Cfg, S>];
  gemm_block<Cfg, TransA, TransB, Vec, S, RoundBf16>(p, smem, epilogue,
                                                     static_cast<int>(cg::this_cluster().block_rank()));
  end_kernel(p.overlaps_previous, stamps);
#else
  __trap();  // clusters need sm_90; the launcher never picks split-K where this image would run
#endif
}

// grid: (tiles_m · tiles_n, 1, S); block z writes its partial over K-range z to the workspace.
template <class Cfg, bool TransA, bool TransB, bool Vec, bool RoundBf16>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    gemm_workspace_split_kernel(KernelArgs p, Epilogue epilogue, StampRing stamps) {
  begin_kernel(p.overlaps_previous, stamps);
  __shared__ __align__(16) float smem[kBlockSmemFloats<Cfg, kWorkspaceSplit>];
  gemm_block<Cfg, TransA, TransB, Vec, kWorkspaceSplit, RoundBf16>(p, smem, epilogue, static_cast<int>(blockIdx.z));
  end_kernel(p.overlaps_previous, stamps);
}

// The workspace split's second kernel: output e of (M·N, then M row sums) = the S partials added in a fixed
// tree (gemm_tile::sum_split_partials), then the epilogue. total: M·N, + M with row sums;
// grid split_reduce_grid(total).
template <Epilogue E>
__global__ void __launch_bounds__(32 * gemm_tile::kSplitReduceRows)
    gemm_split_reduce_kernel(KernelArgs p, int splits, int total, StampRing stamps) {
  begin_dependent_kernel(stamps);  // the partials come from the kernel before
  float sum;
  if (!gemm_tile::sum_split_partials(p.partial, p.partial_stride, splits, total, sum)) return;
  const int e = blockIdx.x * 32 + threadIdx.x, mn = p.M * p.N;
  if (e >= mn) {
    p.a_row_sums[e - mn] = sum;
    return;
  }
  const int m = e / p.N, n = e % p.N;
  p.C[static_cast<size_t>(m) * p.ldc + n] = finish<E>(sum, m, n, p);
}

// ---- BF16 operands on tensor cores (Exec::math BF16) -------------------------------------------------
//
// The same contract, epilogues, row sums and workspace split as gemm_block; the multiply is m16n8k16 MMAs on BF16
// operands (mma_bf16.cuh) instead of FFMA tiles. A slab is loaded by SlabLoader (float4 along whichever axis of the
// operand is contiguous in memory, zero outside), rounded to BF16 in registers (cvt.rn, as round_slab rounds for the
// FFMA tiles) and stored as rows of k, As[m][k] and Bs[n][k] with row stride BK + 8: four consecutive k of a row as
// one 8-byte store where the operand runs along k (A; B with trans_b), else four 2-byte stores down a column. Two
// stages, the next slab's loads in registers while the current one is multiplied, one barrier a slab. A product of
// two BF16 values is exact in fp32 and the MMA sums in fp32, so the twin (fp32 sums of the rounded operands) differs
// by the order of the additions only. Each output's sum has one order on a given plan: slabs in k order, the MMA's
// own order within one, the split's partials added in a fixed tree (gemm_tile::sum_split_partials).
//   Tiles (4 warps, 128 threads, each warp a (BM/2)×(BN/2) piece): 64×64, 32×64 (the kernel lab's only), 32×32;
//   shared memory 2·(BM + BN)·40 bytes (20 KB at 64×64). The plan: choose_mma_plan.

using MmaTile64x64 = mma_bf16::MmaConfig<64, 64, 2, 2>;
using MmaTile32x64 = mma_bf16::MmaConfig<32, 64, 2, 2>;
using MmaTile32x32 = mma_bf16::MmaConfig<32, 32, 2, 2>;

// One operand's slab (rows R = BM or BN) through registers into BF16 rows of k.
template <class Cfg, int R, bool KContig, bool Vec>
struct Bf16Slab {
  using Loader = SlabLoader<R, Cfg::BK, Cfg::kThreads, KContig, Vec>;
  static_assert(R * Cfg::BK % (4 * Cfg::kThreads) == 0, "every thread loads the same number of float4 a slab");
  float4 v[Loader::kVecs];

  __device__ void load(const float* p, int ld, int rows, int K, int r0, int k0) {
    Loader::load(v, p, ld, rows, K, r0, k0);
  }

  __device__ void store(__nv_bfloat16* s) const {
#pragma unroll
    for (int j = 0; j < Loader::kVecs; ++j) {
      const int idx = threadIdx.x + j * Cfg::kThreads;
      const int r = Loader::r_of(idx), k = Loader::k_of(idx);
      if constexpr (KContig) {  // k..k+3 of row r: one 8-byte store (k is a multiple of 4, rows are 80 bytes)
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v[j].x, v[j].y), hi = __floats2bfloat162_rn(v[j].z, v[j].w);
        *reinterpret_cast<uint2*>(&s[r * Cfg::kLd + k]) =
            make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
      } else {  // rows r..r+3 at k
        s[(r + 0) * Cfg::kLd + k] = __float2bfloat16_rn(v[j].x);
        s[(r + 1) * Cfg::kLd + k] = __float2bfloat16_rn(v[j].y);
        s[(r + 2) * Cfg::kLd + k] = __float2bfloat16_rn(v[j].z);
        s[(r + 3) * Cfg::kLd + k] = __float2bfloat16_rn(v[j].w);
      }
    }
  }
};

// C[m][n] = finish(acc) for this warp's MMA tiles, bounds-checked; the two adjacent columns of a row as one
// 8-byte store where C allows (store_vec: 16-byte aligned, ldc a multiple of 4; the column is even).
template <class Cfg, Epilogue E>
__device__ __forceinline__ void store_mma_tile(const float (&acc)[Cfg::kTilesM][Cfg::kTilesN][4], int m_base,
                                               int n_base, const KernelArgs& p) {
#pragma unroll
  for (int i = 0; i < Cfg::kTilesM; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::kTilesN; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // accumulators 2·half and 2·half + 1: one row, two columns
        const int m = m_base + 16 * i + mma_tf32::row_of(2 * half), n = n_base + 8 * j + mma_tf32::col_of(0);
        if (m >= p.M) continue;
        float* c = p.C + static_cast<size_t>(m) * p.ldc + n;
        const float v0 = acc[i][j][2 * half], v1 = acc[i][j][2 * half + 1];
        if (p.store_vec && n + 1 < p.N) {
          *reinterpret_cast<float2*>(c) = make_float2(finish<E>(v0, m, n, p), finish<E>(v1, m, n + 1, p));
        } else {
          if (n < p.N) c[0] = finish<E>(v0, m, n, p);
          if (n + 1 < p.N) c[1] = finish<E>(v1, m, n + 1, p);
        }
      }
}

// C tile (tile_m, tile_n), or with Split this block's partial of it over K-range `split` (gridDim.z ranges,
// partials to p.partial as gemm_block writes them). smem: two stages of Cfg::kStageElements.
template <class Cfg, bool TransA, bool TransB, bool Vec, bool Split>
__device__ __forceinline__ void gemm_mma_block(const KernelArgs& p, __nv_bfloat16* smem, Epilogue epilogue, int split) {
  Bf16Slab<Cfg, Cfg::BM, !TransA, Vec> a_next;  // op(A) as (M, K)
  Bf16Slab<Cfg, Cfg::BN, TransB, Vec> b_next;   // op(B)ᵀ as (N, K)

  int tile_m, tile_n;
  tile_of_block(p, tile_m, tile_n);
  const int m0 = tile_m * Cfg::BM, n0 = tile_n * Cfg::BN;
  const int warp = threadIdx.x / 32;
  const int wm = (warp / Cfg::kWarpsN) * Cfg::WM, wn = (warp % Cfg::kWarpsN) * Cfg::WN;

  // This block's slabs [slab_begin, slab_begin + n_slabs) and their K range; all of K without a split.
  const int splits = Split ? static_cast<int>(gridDim.z) : 1;
  const int slabs_total = (p.K + Cfg::BK - 1) / Cfg::BK;
  const int slabs_per_split = (slabs_total + splits - 1) / splits;
  const int slab_begin = min(split * slabs_per_split, slabs_total);
  const int n_slabs = min(slab_begin + slabs_per_split, slabs_total) - slab_begin;
  const int k_begin = slab_begin * Cfg::BK, k_end = min(p.K, (slab_begin + n_slabs) * Cfg::BK);

  const bool row_sums = p.a_row_sums != nullptr && tile_n == 0;  // thread r < BM owns tile row r
  float row_sum = 0.f;

  float acc[Cfg::kTilesM][Cfg::kTilesN][4];
  mma_tf32::zero(acc);
  auto stage_a = [&](int st) { return smem + st * Cfg::kStageElements; };
  auto stage_b = [&](int st) { return smem + st * Cfg::kStageElements + Cfg::BM * Cfg::kLd; };

  if (n_slabs > 0) {
    a_next.load(p.A, p.lda, p.M, k_end, m0, k_begin);
    b_next.load(p.B, p.ldb, p.N, k_end, n0, k_begin);
    a_next.store(stage_a(0));
    b_next.store(stage_b(0));
  }
  __syncthreads();
  for (int t = 0; t < n_slabs; ++t) {
    const int cur = t & 1;
    const bool has_next = t + 1 < n_slabs;
    if (has_next) {
      const int k0 = k_begin + (t + 1) * Cfg::BK;
      a_next.load(p.A, p.lda, p.M, k_end, m0, k0);
      b_next.load(p.B, p.ldb, p.N, k_end, n0, k0);
    }
    const __nv_bfloat16* As = stage_a(cur);
    if (row_sums && threadIdx.x < Cfg::BM) {
#pragma unroll
      for (int kk = 0; kk < Cfg::BK; ++kk) row_sum += __bfloat162float(As[threadIdx.x * Cfg::kLd + kk]);
    }
    mma_bf16::multiply_slab<Cfg>(acc, As, stage_b(cur), wm, wn);
    if (has_next) {
      a_next.store(stage_a(cur ^ 1));
      b_next.store(stage_b(cur ^ 1));
    }
    __syncthreads();
  }

  const bool sums_here = row_sums && threadIdx.x < Cfg::BM && m0 + threadIdx.x < p.M;
  if constexpr (Split) {
    float* part = p.partial + static_cast<size_t>(split) * p.partial_stride;  // (M, N) row-major, then M row sums
#pragma unroll
    for (int i = 0; i < Cfg::kTilesM; ++i)
#pragma unroll
      for (int j = 0; j < Cfg::kTilesN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int m = m0 + wm + 16 * i + mma_tf32::row_of(e), n = n0 + wn + 8 * j + mma_tf32::col_of(e);
          if (m < p.M && n < p.N) part[static_cast<size_t>(m) * p.N + n] = acc[i][j][e];
        }
    if (sums_here) part[static_cast<size_t>(p.M) * p.N + m0 + threadIdx.x] = row_sum;
  } else {
    switch (epilogue) {  // uniform across the grid
      case Epilogue::none:
        store_mma_tile<Cfg, Epilogue::none>(acc, m0 + wm, n0 + wn, p);
        break;
      case Epilogue::bias:
        store_mma_tile<Cfg, Epilogue::bias>(acc, m0 + wm, n0 + wn, p);
        break;
      case Epilogue::bias_relu:
        store_mma_tile<Cfg, Epilogue::bias_relu>(acc, m0 + wm, n0 + wn, p);
        break;
      case Epilogue::relu_mask:
        store_mma_tile<Cfg, Epilogue::relu_mask>(acc, m0 + wm, n0 + wn, p);
        break;
    }
    if (sums_here) p.a_row_sums[m0 + threadIdx.x] = row_sum;
  }
}

// grid: (tiles_m · tiles_n, 1, splits); with Split block z writes its partial over K-range z to the workspace.
template <class Cfg, bool TransA, bool TransB, bool Vec, bool Split>
__global__ void __launch_bounds__(Cfg::kThreads)
    gemm_bf16_mma_kernel(KernelArgs p, Epilogue epilogue, StampRing stamps) {
  begin_kernel(p.overlaps_previous, stamps);
  __shared__ __align__(16) __nv_bfloat16 smem[2 * Cfg::kStageElements];
  gemm_mma_block<Cfg, TransA, TransB, Vec, Split>(p, smem, epilogue, static_cast<int>(blockIdx.z));
  end_kernel(p.overlaps_previous, stamps);
}

// ---- launchers -------------------------------------------------------------------------------------

// The FFMA tiles, then the BF16 tensor-core tiles (lab::GemmTile numbers them in this order).
enum class TileKind { large, medium, small, small_grouped, mma_64x64, mma_32x64, mma_32x32 };

template <class Cfg>
constexpr bool kTensorCoreTile =
    std::is_same_v<Cfg, MmaTile64x64> || std::is_same_v<Cfg, MmaTile32x64> || std::is_same_v<Cfg, MmaTile32x32>;

struct Plan {
  TileKind tile = TileKind::large;
  int split_k = 1;
  bool through_workspace = false;  // split_k blocks write partials to the caller's workspace (any split_k >= 2)
};

int tiles_for(int M, int N, int bm, int bn) { return div_up(M, bm) * std::max(div_up(N, bn), 1); }

// Whether the split-K kernels can run here: a cluster-capable device and an image compiled for one.
bool clusters_available() {
  static const bool available = cluster_kernels_run(gemm_splitk_kernel<SmallTile, false, false, true, 2, false>);
  return available;
}

// The rule: the largest tile that still gives at least one block per SM; if even the small tile gives
// fewer, split K over a cluster so that tiles·S approaches two blocks per SM, keeping at least two
// slabs (2·BK) of K per block; where that still leaves SMs idle and K is long, split through the workspace
// (if any; that split needs no cluster, so it runs without sm_90 code too). Depends only on (M, N, K), the SM
// count and whether there is a workspace: deterministic per device.
Plan choose_plan(int M, int N, int K, int sms, bool can_split, bool has_workspace) {
  if (tiles_for(M, N, LargeTile::BM, LargeTile::BN) >= sms) return {TileKind::large, 1};
  if (tiles_for(M, N, MediumTile::BM, MediumTile::BN) >= sms) return {TileKind::medium, 1};
  // The grouped tile wins every shape with more than one small slab of K, the small tile where K fits one
  // slab: bench_gemm's variant table, graph replays of the mlp's GEMMs at batch 64 (the numbers behind this
  // rule and the two below are in docs/gemm-lab.md, 'Why the plan picks the grouped tile, the small tile
  // or a split').
  if (K <= SmallTile::BK) return {TileKind::small, 1};
  Plan plan{TileKind::small_grouped, 1};
  const int tiles = tiles_for(M, N, SmallGroupedTile::BM, SmallGroupedTile::BN);
  // One grouped slab of K over at least two tiles per SM (the cnn's 3136->128 weight gradient at batch 64:
  // 392 tiles, K = 64): the small tile's four pipelined slabs win, while with fewer tiles the grouped one
  // still does (mlp dW1 320x784x64, 250 tiles).
  if (K <= SmallGroupedTile::BK && tiles >= 2 * sms) return {TileKind::small, 1};
  // Splitting K pays from K >= 128 on while each split block keeps two k-group steps (dX2 64x320x160:
  // split 4 beats split 8), while at K = 64 (the weight gradients at batch 64) the cluster reduction costs
  // more than it saves (dW2 runs faster unsplit than split in two).
  if (K < kMinSplitK) return plan;
  // A long K over few tiles (the cnn's 3136->128 layer at batch 64: 8 tiles, 64 blocks as an 8-way cluster
  // split, slow inside the step): split over one wave of three blocks per SM through the workspace, each
  // block keeping at least one 64-deep slab (docs/gemm-lab.md, 'Split through a workspace'). It needs no
  // cluster, so it serves GPUs without them too.
  if (has_workspace && tiles * kMaxSplitK < sms && K >= kMinWorkspaceSplitK) {
    plan.split_k = std::clamp(div_up(3 * sms, tiles), 2, std::min(kMaxWorkspaceSplit, K / SmallGroupedTile::BK));
    plan.through_workspace = true;
    return plan;
  }
  while (plan.split_k < kMaxSplitK && tiles * plan.split_k * 2 <= 2 * sms &&
         K / (plan.split_k * 2) >= 2 * SmallGroupedTile::kGroupK)
    plan.split_k *= 2;
  if (can_split) return plan;  // over a cluster
  // Without clusters the same split goes through the workspace, where it is the full 8 ways: a split in 2 or 4 did
  // not repay its reduction kernel (the mlp at batch 256 with compute_80 code; docs/gemm-lab.md).
  if (has_workspace && plan.split_k == kMaxSplitK) return {TileKind::small_grouped, kMaxSplitK, true};
  return {TileKind::small_grouped, 1};
}

// BF16 on tensor cores (gemm_mma_block), where its tiles keep enough SMs busy: 64×64 where its tiles give every SM a
// block; else 32×32 where its tiles do; else, where the caller gave a workspace and K is long, 32×32 with K split
// through it over about two blocks an SM, two slabs or more a block; else 32×32 unsplit where its tiles still give
// a quarter of the SMs a block. Elsewhere nullopt: the FFMA plan, whose cluster split-K and k-groups win on fewer
// tiles (bench_gemm's BF16 table, docs/gemm-lab.md, 'BF16 on tensor cores'). Depends only on (M, N, K), the SM count
// and the workspace.
std::optional<Plan> choose_mma_plan(int M, int N, int K, int sms, bool has_workspace) {
  if (tiles_for(M, N, MmaTile64x64::BM, MmaTile64x64::BN) >= sms) return Plan{TileKind::mma_64x64, 1};
  const int tiles = tiles_for(M, N, MmaTile32x32::BM, MmaTile32x32::BN);
  if (tiles >= sms) return Plan{TileKind::mma_32x32, 1};
  const int slabs = div_up(K, MmaTile32x32::BK);
  if (has_workspace && slabs >= 4) {
    const int split = std::min({div_up(2 * sms, tiles), div_up(slabs, 2), kMaxWorkspaceSplit});
    if (tiles * split >= sms) return Plan{TileKind::mma_32x32, split, true};
  }
  if (4 * tiles >= sms) return Plan{TileKind::mma_32x32, 1};
  return std::nullopt;
}

// The plan for Exec::math: under BF16 the tensor-core plan where the device runs sm_80 code and the plan takes the
// shape, else the FFMA tiles' (which round BF16 operands as they stage them).
Plan choose_plan(const Exec& exec, int M, int N, int K, bool has_workspace) {
  const int sms = multiprocessor_count();
  if (gemm_rounds_operands(exec.math) && runs_tensor_core_code())
    if (const std::optional<Plan> plan = choose_mma_plan(M, N, K, sms, has_workspace)) return *plan;
  return choose_plan(M, N, K, sms, clusters_available(), has_workspace);
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

using KernelFn = void (*)(KernelArgs, Epilogue, StampRing);

template <class Cfg, bool TransA, bool TransB, bool Vec, bool R>
KernelFn pick_split(int split_k, bool through_workspace) {
  if constexpr (std::is_same_v<Cfg, SmallTile> || std::is_same_v<Cfg, SmallGroupedTile>) {
    if (through_workspace) return gemm_workspace_split_kernel<Cfg, TransA, TransB, Vec, R>;
    switch (split_k) {
      case 2:
        return gemm_splitk_kernel<Cfg, TransA, TransB, Vec, 2, R>;
      case 4:
        return gemm_splitk_kernel<Cfg, TransA, TransB, Vec, 4, R>;
      case 8:
        return gemm_splitk_kernel<Cfg, TransA, TransB, Vec, 8, R>;
      default:
        break;
    }
  }
  NT_CHECK(split_k == 1 && !through_workspace, "gemm: split-K ", split_k, " is not instantiated for this tile");
  return gemm_kernel<Cfg, TransA, TransB, Vec, R>;
}

// f(TransA, TransB, Vec) as std::bool_constant values: one instantiation per operand layout.
template <class F>
KernelFn by_layout(bool trans_a, bool trans_b, bool vec, F&& f) {
  const auto with_vec = [&](auto ta, auto tb) {
    return vec ? f(ta, tb, std::true_type{}) : f(ta, tb, std::false_type{});
  };
  const auto with_b = [&](auto ta) {
    return trans_b ? with_vec(ta, std::true_type{}) : with_vec(ta, std::false_type{});
  };
  return trans_a ? with_b(std::true_type{}) : with_b(std::false_type{});
}

// R: the operands rounded to BF16 (Exec::math BF16).
template <class Cfg, bool R>
KernelFn pick_kernel(bool trans_a, bool trans_b, bool vec, const Plan& plan) {
  return by_layout(trans_a, trans_b, vec, [&](auto ta, auto tb, auto v) {
    return pick_split<Cfg, decltype(ta)::value, decltype(tb)::value, decltype(v)::value, R>(plan.split_k,
                                                                                            plan.through_workspace);
  });
}

template <class Cfg>
KernelFn pick_mma_kernel(bool trans_a, bool trans_b, bool vec, const Plan& plan) {
  NT_CHECK(plan.split_k == 1 || plan.through_workspace, "gemm: the tensor-core tiles split K through a workspace only");
  return by_layout(trans_a, trans_b, vec, [&](auto ta, auto tb, auto v) -> KernelFn {
    constexpr bool kTransA = decltype(ta)::value, kTransB = decltype(tb)::value, kVec = decltype(v)::value;
    return plan.through_workspace ? gemm_bf16_mma_kernel<Cfg, kTransA, kTransB, kVec, true>
                                  : gemm_bf16_mma_kernel<Cfg, kTransA, kTransB, kVec, false>;
  });
}

using ReduceFn = void (*)(KernelArgs, int, int, StampRing);
ReduceFn pick_reduce(Epilogue e) {
  switch (e) {
    case Epilogue::bias:
      return gemm_split_reduce_kernel<Epilogue::bias>;
    case Epilogue::bias_relu:
      return gemm_split_reduce_kernel<Epilogue::bias_relu>;
    case Epilogue::relu_mask:
      return gemm_split_reduce_kernel<Epilogue::relu_mask>;
    default:
      return gemm_split_reduce_kernel<Epilogue::none>;
  }
}

template <class Cfg>
void launch_gemm(const Exec& exec, const GemmDesc& d, const Plan& plan) {
  KernelArgs p{};
  p.M = d.M, p.N = d.N, p.K = d.K;
  p.A = d.A, p.lda = d.lda, p.B = d.B, p.ldb = d.ldb, p.C = d.C, p.ldc = d.ldc;
  p.bias = d.bias, p.mask = d.mask, p.a_row_sums = d.a_row_sums;
  p.tiles_m = div_up(d.M, Cfg::BM);
  p.tiles_n = std::max(div_up(d.N, Cfg::BN), 1);  // N == 0: one tile column still produces the row sums
  p.store_vec = aligned16(d.C) && d.ldc % 4 == 0;
  p.overlaps_previous = d.overlaps_previous;
  p.partial = plan.through_workspace ? d.workspace : nullptr;
  p.partial_stride = d.M * d.N + d.M;
  const bool vec = aligned16(d.A) && d.lda % 4 == 0 && aligned16(d.B) && d.ldb % 4 == 0;

  const double M = d.M, N = d.N, K = d.K;
  double bytes = 4.0 * (M * K + K * N + M * N);
  if (d.epilogue == Epilogue::bias || d.epilogue == Epilogue::bias_relu) bytes += 4.0 * N;
  if (d.epilogue == Epilogue::relu_mask) bytes += 4.0 * M * N;
  if (d.a_row_sums) bytes += 4.0 * M;
  const profile::OpCost cost{.bytes = bytes,
                             .flops = 2.0 * M * N * K,
                             .math = kTensorCoreTile<Cfg> ? Math::bf16 : Math::fp32,
                             .overlaps_previous = static_cast<bool>(d.overlaps_previous)};

  const dim3 grid(static_cast<unsigned>(p.tiles_m) * static_cast<unsigned>(p.tiles_n), 1,
                  static_cast<unsigned>(plan.split_k));
  KernelFn kernel = nullptr;
  if constexpr (kTensorCoreTile<Cfg>) {
    require_tf32_code("gemm");
    kernel = pick_mma_kernel<Cfg>(d.trans_a, d.trans_b, vec, plan);
  } else {
    kernel = gemm_rounds_operands(exec.math) ? pick_kernel<Cfg, true>(d.trans_a, d.trans_b, vec, plan)
                                             : pick_kernel<Cfg, false>(d.trans_a, d.trans_b, vec, plan);
  }
  launch(exec, gemm_kernel_name(d.epilogue), cost, kernel, grid, dim3(Cfg::kThreads), 0, p, d.epilogue);
  if (!plan.through_workspace) return;
  const int total = d.M * d.N + (d.a_row_sums ? d.M : 0);
  const profile::OpCost reduce_cost{4.0 * total * (plan.split_k + 1), double(total) * plan.split_k};
  launch(exec, "gemm_split_reduce", reduce_cost, pick_reduce(d.epilogue), gemm_tile::split_reduce_grid(total),
         gemm_tile::split_reduce_block(plan.split_k, total), 0, p, plan.split_k, total);
}

void check_invariants(const GemmDesc& d) {
  NT_CHECK(d.M >= 0 && d.N >= 0 && d.K >= 0, "gemm: negative size M=", d.M, " N=", d.N, " K=", d.K);
  NT_CHECK(d.lda >= (d.trans_a ? d.M : d.K), "gemm: lda=", d.lda, " shorter than a row of A");
  NT_CHECK(d.ldb >= (d.trans_b ? d.K : d.N), "gemm: ldb=", d.ldb, " shorter than a row of B");
  NT_CHECK(d.ldc >= d.N, "gemm: ldc=", d.ldc, " shorter than a row of C (N=", d.N, ")");
  NT_CHECK(d.M == 0 || d.N == 0 || d.C != nullptr, "gemm: C is null");
  NT_CHECK(d.K == 0 || d.M == 0 || ((d.N == 0 || d.B) && d.A), "gemm: A or B is null");
  NT_CHECK(!(d.epilogue == Epilogue::bias || d.epilogue == Epilogue::bias_relu) || d.N == 0 || d.bias,
           "gemm: bias epilogue without bias");
  NT_CHECK(d.epilogue != Epilogue::relu_mask || d.N == 0 || d.M == 0 || d.mask, "gemm: relu_mask without mask");
}

void run_plan(const Exec& exec, const GemmDesc& d, const Plan& plan) {
  if (d.M == 0 || (d.N == 0 && !d.a_row_sums)) return;  // nothing to write
  NT_CHECK(!plan.through_workspace || d.workspace, "gemm: a workspace split without a workspace");
  switch (plan.tile) {
    case TileKind::large:
      launch_gemm<LargeTile>(exec, d, plan);
      break;
    case TileKind::medium:
      launch_gemm<MediumTile>(exec, d, plan);
      break;
    case TileKind::small:
      launch_gemm<SmallTile>(exec, d, plan);
      break;
    case TileKind::small_grouped:
      launch_gemm<SmallGroupedTile>(exec, d, plan);
      break;
    case TileKind::mma_64x64:
      launch_gemm<MmaTile64x64>(exec, d, plan);
      break;
    case TileKind::mma_32x64:
      launch_gemm<MmaTile32x64>(exec, d, plan);
      break;
    case TileKind::mma_32x32:
      launch_gemm<MmaTile32x32>(exec, d, plan);
      break;
  }
}

size_t workspace_floats(const Plan& plan, int M, int N) {
  return plan.through_workspace ? size_t(plan.split_k) * (size_t(M) * N + M) : 0;
}

}  // namespace

void gemm(const Exec& exec, const GemmDesc& d) {
  check_invariants(d);
  run_plan(exec, d, choose_plan(exec, d.M, d.N, d.K, d.workspace != nullptr));
}

size_t gemm_workspace_floats(int M, int N, int K) {
  NT_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
  const int sms = multiprocessor_count();
  const bool can_split = clusters_available();
  // The most over every M' <= M (a layer plans with its full batch and may run a smaller one) and both kinds of
  // tile (Exec::math is the caller's to change between calls).
  size_t most = 0;
  for (int m = 1; m <= M; ++m) {
    const std::optional<Plan> mma = choose_mma_plan(m, N, K, sms, true);
    most = std::max({most, workspace_floats(choose_plan(m, N, K, sms, can_split, true), m, N),
                     mma ? workspace_floats(*mma, m, N) : 0});
  }
  return most;
}

// Kernel-lab entry (kernels/gemm_lab.h): the same op with the configuration forced.
namespace lab {
namespace {
void check_tile(const Exec& exec, int tile) {
  NT_CHECK(tile >= 0 && tile < gemm_tile_count, "gemm lab: tile ", tile, " out of range");
  NT_CHECK(tile < mma_64x64 || gemm_rounds_operands(exec.math), "gemm lab: the tensor-core tiles take BF16 operands");
}
}  // namespace

void gemm_variant(const Exec& exec, const GemmDesc& d, int tile, int split_k) {
  check_invariants(d);
  check_tile(exec, tile);
  NT_CHECK(split_k == 1 || ((tile == small || tile == small_grouped) && clusters_available()),
           "gemm lab: cluster split-K needs a small FFMA tile and sm_90");
  run_plan(exec, d, Plan{static_cast<TileKind>(tile), split_k});
}

void gemm_ffma_plan(const Exec& exec, const GemmDesc& d) {
  check_invariants(d);
  run_plan(exec, d, choose_plan(d.M, d.N, d.K, multiprocessor_count(), clusters_available(), d.workspace != nullptr));
}

void gemm_workspace_variant(const Exec& exec, const GemmDesc& d, int tile, int split_k) {
  check_invariants(d);
  check_tile(exec, tile);
  NT_CHECK(tile != large && tile != medium, "gemm lab: the large and medium tiles do not split through a workspace");
  NT_CHECK(split_k >= 2 && split_k <= kMaxWorkspaceSplit, "gemm lab: workspace split ", split_k, " out of 2..256");
  run_plan(exec, d, Plan{static_cast<TileKind>(tile), split_k, true});
}

size_t gemm_workspace_variant_floats(int M, int N, int split_k) {
  return workspace_floats(Plan{TileKind::small_grouped, split_k, true}, M, N);
}
}  // namespace lab

}  // namespace nt::kernels::cuda
