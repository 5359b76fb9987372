// Reusable pieces of the SIMT fp32 GEMM (kernels/cuda/gemm.cu), shared with the implicit-GEMM
// convolution (kernels/cuda/conv.cu): the tile configuration, the slab loader of a row-major operand,
// and the microkernel with its micro-tile index map. Moved verbatim out of gemm.cu; the design notes
// (tiling, warp layout, bank-conflict reasoning, shared-memory sizes) stay at the top of gemm.cu.
//
// Contract of the microkernel: a block owns a BM×BN tile of C and walks K in BK-wide slabs; a slab of
// op(A) sits in shared memory as As[k][m] (row stride kLdA = BM + 4) and one of op(B) as Bs[k][n]
// (row stride kLdB = BN + 4), both 16-byte aligned. multiply_slab adds As·Bs over one slab (or over
// k-group g's quarter of it, see below) to the thread's TM×TN accumulators; micro-tile element (i, j) is
// C[a_off + row_step(i)][b_off + col_step(j)], with w = warp % (kWarpsM·kWarpsN),
// a_off = (w / kWarpsN)·WM + (lane / 8)·4 and b_off = (w % kWarpsN)·WN + (lane % 8)·4.
//
// K-groups (KG > 1): the block holds KG copies of its warp grid; copy g multiplies only the k-rows
// [g·BK/KG, (g+1)·BK/KG) of each slab, so a slab KG times deeper costs each thread no more FMAs, and a
// skinny problem (M = 64 batch rows) runs KG times more threads per output tile with KG times fewer
// dependent slab round trips. The copies' accumulators are added in g order at the end (deterministic).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace nt::kernels::cuda::gemm_tile {
// ---- tile configurations -------------------------------------------------------------------------

template <int BM_, int BN_, int BK_, int TM_, int TN_, int MinBlocks_, int KGroups_ = 1>
struct TileConfig {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, TM = TM_, TN = TN_;
  static constexpr int kMinBlocks = MinBlocks_;                   // __launch_bounds__ occupancy target
  static constexpr int KG = KGroups_, kGroupK = BK / KG;          // k-groups, and the k-rows of a slab each one owns
  static constexpr int kLaneRows = 4, kLaneCols = 8;              // a warp's lanes as a 4×8 grid
  static constexpr int WM = kLaneRows * TM, WN = kLaneCols * TN;  // warp tile
  static constexpr int kWarpsM = BM / WM, kWarpsN = BN / WN;
  static constexpr int kGroupThreads = 32 * kWarpsM * kWarpsN;  // one copy of the warp grid
  static constexpr int kThreads = kGroupThreads * KG;
  static constexpr int kPad = 4;                            // floats; keeps rows 16-byte aligned
  static constexpr int kLdA = BM + kPad, kLdB = BN + kPad;  // shared-memory row strides
  static constexpr int kStageFloats = BK * (kLdA + kLdB);
  static constexpr int kPipelineFloats = 2 * kStageFloats;
  static constexpr int kGroupPartialFloats = (KG - 1) * BM * BN;  // k-groups 1.. park their tiles here

  static_assert(BK % KG == 0 && kGroupK % 4 == 0, "each k-group owns a whole number of float4 k-rows");

  static_assert(TM % 4 == 0 && TN % 4 == 0, "micro-tiles are made of 4x4 pieces: TM, TN multiples of 4");
  static_assert(BM % WM == 0 && BN % WN == 0, "block tile must be a whole number of warp tiles");
  static_assert(BK % 4 == 0 && BM % 4 == 0 && BN % 4 == 0, "tiles are loaded as float4: multiples of 4");
  static_assert(BM * BK % (4 * kThreads) == 0 && BN * BK % (4 * kThreads) == 0,
                "every thread must load the same number of float4 per slab: adjust BK or the thread count");
  static_assert(kGroupThreads >= BM, "one thread of k-group 0 per tile row sums op(A): need 32·warps >= BM");
};

// ---- global -> registers -> shared memory ----------------------------------------------------------

// Four consecutive elements of one line of a row-major matrix, zero outside [0,line_limit)×[0,u_limit).
template <bool Vec>
__device__ __forceinline__ float4 load4(const float* p, int ld, int line, int line_limit, int u, int u_limit) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (line >= line_limit) return v;
  const float* q = p + static_cast<size_t>(line) * ld + u;
  if (Vec && u + 3 < u_limit) return __ldg(reinterpret_cast<const float4*>(q));
  if (u + 0 < u_limit) v.x = __ldg(q + 0);
  if (u + 1 < u_limit) v.y = __ldg(q + 1);
  if (u + 2 < u_limit) v.z = __ldg(q + 2);
  if (u + 3 < u_limit) v.w = __ldg(q + 3);
  return v;
}

// One operand's R×BK slab, viewed as a (rows, K) matrix X: op(A) itself, or op(B)ᵀ (rows = N).
//   KContig:  X[r][k] at p[r*ld + k]   (A, or B with trans_b): float4 runs along k,
//   otherwise X[r][k] at p[k*ld + r]   (A with trans_a, or B): float4 runs along r.
// Shared memory holds the slab as s[k][r] with row stride R + kPad.
template <int R, int BK, int Threads, bool KContig, bool Vec>
struct SlabLoader {
  static constexpr int kVecs = R * BK / (4 * Threads);  // float4 per thread per slab
  static constexpr int kLd = R + 4;

  // Slab-local (r, k) of the first element of float4 number idx.
  __device__ static int r_of(int idx) { return KContig ? idx / (BK / 4) : (idx % (R / 4)) * 4; }
  __device__ static int k_of(int idx) { return KContig ? (idx % (BK / 4)) * 4 : idx / (R / 4); }

  __device__ static void load(float4 (&v)[kVecs], const float* p, int ld, int rows, int K, int r0, int k0) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int idx = threadIdx.x + j * Threads;
      const int r = r0 + r_of(idx), k = k0 + k_of(idx);
      v[j] = KContig ? load4<Vec>(p, ld, r, rows, k, K) : load4<Vec>(p, ld, k, K, r, rows);
    }
  }

  __device__ static void store(float* s, const float4 (&v)[kVecs]) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int idx = threadIdx.x + j * Threads;
      const int r = r_of(idx), k = k_of(idx);
      if constexpr (KContig) {  // transpose on the way in: four k rows of one column r
        s[(k + 0) * kLd + r] = v[j].x;
        s[(k + 1) * kLd + r] = v[j].y;
        s[(k + 2) * kLd + r] = v[j].z;
        s[(k + 3) * kLd + r] = v[j].w;
      } else {
        *reinterpret_cast<float4*>(&s[k * kLd + r]) = v[j];
      }
    }
  }
};

// ---- the multiply ---------------------------------------------------------------------------------

// acc += As·Bs over k-group `group`'s rows of one slab (all of it when KG == 1). a_off/b_off: this
// thread's first row/column inside the block tile.
template <class Cfg>
__device__ __forceinline__ void multiply_slab(float (&acc)[Cfg::TM][Cfg::TN], const float* As, const float* Bs,
                                              int a_off, int b_off, int group = 0) {
  As += group * Cfg::kGroupK * Cfg::kLdA;
  Bs += group * Cfg::kGroupK * Cfg::kLdB;
#pragma unroll
  for (int kk = 0; kk < Cfg::kGroupK; ++kk) {
    float a[Cfg::TM], b[Cfg::TN];
#pragma unroll
    for (int c = 0; c < Cfg::TM / 4; ++c) {
      const float4 v = *reinterpret_cast<const float4*>(&As[kk * Cfg::kLdA + a_off + c * Cfg::kLaneRows * 4]);
      a[4 * c + 0] = v.x, a[4 * c + 1] = v.y, a[4 * c + 2] = v.z, a[4 * c + 3] = v.w;
    }
#pragma unroll
    for (int d = 0; d < Cfg::TN / 4; ++d) {
      const float4 v = *reinterpret_cast<const float4*>(&Bs[kk * Cfg::kLdB + b_off + d * Cfg::kLaneCols * 4]);
      b[4 * d + 0] = v.x, b[4 * d + 1] = v.y, b[4 * d + 2] = v.z, b[4 * d + 3] = v.w;
    }
#pragma unroll
    for (int i = 0; i < Cfg::TM; ++i)
#pragma unroll
      for (int j = 0; j < Cfg::TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}

// Adds the KG k-groups' accumulators into k-group 0's, in g order; afterwards only group 0's acc holds
// the tile's sum. `park`: kGroupPartialFloats of shared memory that nobody else touches until the next
// barrier after this call.
template <class Cfg>
__device__ __forceinline__ void reduce_k_groups(float (&acc)[Cfg::TM][Cfg::TN], float* park, int group) {
  if constexpr (Cfg::KG > 1) {
    // park as float4[KG-1][TM·TN/4][kGroupThreads]: a warp's float4 accesses are consecutive (no conflicts)
    constexpr int kVecs = Cfg::TM * Cfg::TN / 4;
    float4* slots = reinterpret_cast<float4*>(park) + threadIdx.x % Cfg::kGroupThreads;
    auto slot = [&](int g, int i, int j) -> float4& {
      return slots[((g - 1) * kVecs + (i * Cfg::TN + j) / 4) * Cfg::kGroupThreads];
    };
    if (group > 0) {
#pragma unroll
      for (int i = 0; i < Cfg::TM; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::TN; j += 4)
          slot(group, i, j) = make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
    }
    __syncthreads();
    if (group == 0) {
#pragma unroll
      for (int g = 1; g < Cfg::KG; ++g)
#pragma unroll
        for (int i = 0; i < Cfg::TM; ++i)
#pragma unroll
          for (int j = 0; j < Cfg::TN; j += 4) {
            const float4 v = slot(g, i, j);
            acc[i][j] += v.x, acc[i][j + 1] += v.y, acc[i][j + 2] += v.z, acc[i][j + 3] += v.w;
          }
    }
  }
}

// Micro-tile element (i, j) of this thread lies at tile row a_off + row_step(i), column b_off + col_step(j).
template <class Cfg>
__device__ __forceinline__ int row_step(int i) {
  return (i / 4) * Cfg::kLaneRows * 4 + i % 4;
}
template <class Cfg>
__device__ __forceinline__ int col_step(int j) {
  return (j / 4) * Cfg::kLaneCols * 4 + j % 4;
}

// A micro-tile's raw sums into a row-major (M, N) partial of split-K, skipping what lies past M or N. m_base,
// n_base: the thread's a_off and b_off within the output (tile origin included).
template <class Cfg>
__device__ __forceinline__ void store_partial(const float (&acc)[Cfg::TM][Cfg::TN], float* part, int M, int N,
                                              int m_base, int n_base) {
#pragma unroll
  for (int i = 0; i < Cfg::TM; ++i) {
    const int m = m_base + row_step<Cfg>(i);
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < Cfg::TN; ++j) {
      const int n = n_base + col_step<Cfg>(j);
      if (n < N) part[static_cast<size_t>(m) * N + n] = acc[i][j];
    }
  }
}

// ---- split-K through a workspace -----------------------------------------------------------------------

// Split-K over more blocks than a cluster holds: block z of the GEMM writes its raw partial result to
// partial[z·stride + e] for every output e of [0, total), and a reduction kernel adds them. Block (32,
// kSplitReduceRows or fewer) of that kernel owns 32 consecutive outputs; thread (e, g) sums partials g,
// g + G, g + 2G, ... in order, then row 0 adds the G sums in g order: a fixed tree, no atomics, the same bits
// run to run (G depends on the shape only: split_reduce_block). Returns true in the thread holding output
// e's sum (row 0, e < total), with the sum in `sum`.
constexpr int kSplitReduceRows = 32;
// Threads the reduction aims at: G rows only as long as they are needed to reach it. Many outputs with
// few rows each keep several partials per thread in flight, instead of 1024-thread blocks whose threads
// add one or two partials and then wait at the barrier (conv2's backward_weight: 18496 outputs of 44
// partials; docs/conv.md, 'Tiles, split-K, workspace').
constexpr int kSplitReduceTargetThreads = 1 << 16;

__device__ __forceinline__ bool sum_split_partials(const float* partial, size_t stride, int splits, int total,
                                                   float& sum) {
  __shared__ float sums[kSplitReduceRows][33];
  const int e = blockIdx.x * 32 + threadIdx.x, g = threadIdx.y, rows = blockDim.y;
  float v = 0.f;
  if (e < total) {
#pragma unroll 4
    for (int z = g; z < splits; z += rows) v += partial[static_cast<size_t>(z) * stride + e];
  }
  sums[g][threadIdx.x] = v;
  __syncthreads();
  if (g != 0 || e >= total) return false;
  sum = sums[0][threadIdx.x];
  for (int i = 1; i < rows; ++i) sum += sums[i][threadIdx.x];
  return true;
}

inline dim3 split_reduce_grid(int total) { return dim3(static_cast<unsigned>((total + 31) / 32)); }
inline dim3 split_reduce_block(int splits, int total) {
  const int wanted = (kSplitReduceTargetThreads + total - 1) / (total > 0 ? total : 1);
  int rows = splits < kSplitReduceRows ? splits : kSplitReduceRows;
  if (wanted < rows) rows = wanted > 1 ? wanted : 1;
  return dim3(32, static_cast<unsigned>(rows));
}

}  // namespace nt::kernels::cuda::gemm_tile
