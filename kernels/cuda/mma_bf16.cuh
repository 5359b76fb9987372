// BF16 tensor-core pieces of the channels-last convolution (kernels/cuda/conv_channels_last.cu): the tile
// configuration, the m16n8k16 MMA and its fragment loads from shared memory, from slabs stored as rows of k (the
// forward) or k-major (backward_weight, below). The TF32 twin: mma_tf32.cuh.
//
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (sm_80+): D(16×8) = A(16×16)·B(16×8) + C for one warp, fp32
// accumulators. Lane l has group g = l / 4 and place t = l % 4; each A and B register holds two bf16 of consecutive k
// (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"):
//   A: a0 = A[g][2t, 2t+1]   a1 = A[g+8][2t, 2t+1]   a2 = A[g][2t+8, 2t+9]   a3 = A[g+8][2t+8, 2t+9]
//   B: b0 = B[2t, 2t+1][g]   b1 = B[2t+8, 2t+9][g]
//   C: as m16n8k8's (mma_tf32.cuh): c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
//
// Shared memory: both operands stored as rows of k, As[m][k] and Bs[n][k], row stride kLd = BK + 8 bf16 (80 bytes,
// 20 words). A fragment register is one 32-bit load of a k pair; its 8 rows g at 4 places t touch words 20g + t:
// banks 0, 20, 8, 28, 16, 4, 24, 12 (+ t), all 32 distinct. The operands arrive rounded (cvt.rn.bf16.f32 as they are
// staged), so a product of two is exact in fp32 and the sums are fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/mma_tf32.cuh"

namespace nt::kernels::cuda::mma_bf16 {

// BF16 slabs of BK = 32 k (two m16n8k16 steps) on mma_tf32's warp tiling: As[BM][kLd], then Bs[BN][kLd].
template <int BM_, int BN_, int WarpsM_, int WarpsN_>
struct MmaConfig : mma_tf32::WarpTiling<BM_, BN_, WarpsM_, WarpsN_> {
  static constexpr int BK = 32;
  static constexpr int kLd = BK + 8;
  static constexpr int kStageElements = (BM_ + BN_) * kLd;
  static_assert((kLd * 2) % 16 == 0, "rows stay 16-byte aligned for the copies");
};

// d += a·b on one 16×8×16 tile.
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // unreachable: the host runs the BF16 kernels only with sm_80+ code (require_tf32_code)
#endif
}

// Two consecutive bf16 of a row as one register.
__device__ __forceinline__ uint32_t pair(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// acc += As·Bsᵀ over one BK-deep slab. wm, wn: the warp's first row and column in the block tile.
template <class Cfg>
__device__ __forceinline__ void multiply_slab(float (&acc)[Cfg::kTilesM][Cfg::kTilesN][4], const __nv_bfloat16* As,
                                              const __nv_bfloat16* Bs, int wm, int wn) {
  constexpr int kLd = Cfg::kLd;
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
  for (int kk = 0; kk < Cfg::BK; kk += 16) {
    uint32_t a[Cfg::kTilesM][4], b[Cfg::kTilesN][2];
#pragma unroll
    for (int i = 0; i < Cfg::kTilesM; ++i) {
      const __nv_bfloat16* p = As + (wm + 16 * i + g) * kLd + kk + 2 * t;
      a[i][0] = pair(p), a[i][1] = pair(p + 8 * kLd), a[i][2] = pair(p + 8), a[i][3] = pair(p + 8 * kLd + 8);
    }
#pragma unroll
    for (int j = 0; j < Cfg::kTilesN; ++j) {
      const __nv_bfloat16* p = Bs + (wn + 8 * j + g) * kLd + kk + 2 * t;
      b[j][0] = pair(p), b[j][1] = pair(p + 8);
    }
#pragma unroll
    for (int i = 0; i < Cfg::kTilesM; ++i)
#pragma unroll
      for (int j = 0; j < Cfg::kTilesN; ++j) mma_16x8x16(acc[i][j], a[i], b[j]);
  }
}

// ---- k-major slabs (the channels-last backward_weight) ------------------------------------------------------------
// A GEMM whose reduction runs over the rows of its channels-last operands (pixels) gets its slabs as rows of k:
// As[k][m] and Bs[k][n], BK = 32 pixels deep, row strides kLdA = BM + 8 and kLdB = BN + 8 bf16. An MMA fragment
// wants k pairs of one m (or n), which lie in two rows here, so the fragments come through ldmatrix.trans: each lane
// names one 16-byte row (8 consecutive m of one k) of an 8×8 matrix, and lane l receives the transposed matrix's
// elements (2t, g) and (2t + 1, g) (t = l % 4, g = l / 4), which are A[g][2t, 2t+1] of that 8×8 block. Four such
// matrices (k 0–7 and 8–15, m 0–7 and 8–15) are the four A registers; two (k 0–7, 8–15) are an n8 tile's B. With the
// row strides ≡ 16 bytes (mod 32) the 8 rows of a matrix lie in 8 distinct 16-byte bank groups: conflict-free.
template <class Cfg>
struct KMajor {
  static constexpr int kLdA = Cfg::BM + 8, kLdB = Cfg::BN + 8;
  static constexpr int kStageElements = Cfg::BK * (kLdA + kLdB);  // As[BK][kLdA], then Bs[BK][kLdB]
  static constexpr bool kConflictFree = (kLdA * 2) % 32 == 16 && (kLdB * 2) % 32 == 16;
};

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four (two) transposed 8×8 bf16 matrices; lane l names row l % 8 of matrix l / 8.
__device__ __forceinline__ void load_matrices_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#else
  (void)row, r[0] = r[1] = r[2] = r[3] = 0, __trap();  // unreachable, as mma_16x8x16
#endif
}

__device__ __forceinline__ void load_matrices_x2_trans(uint32_t (&r)[2], const __nv_bfloat16* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(row)));
#else
  (void)row, r[0] = r[1] = 0, __trap();
#endif
}

// acc += A·B over one slab of k-major As[BK][kLdA], Bs[BK][kLdB]. wm, wn: the warp's first row and column.
template <class Cfg>
__device__ __forceinline__ void multiply_k_major_slab(float (&acc)[Cfg::kTilesM][Cfg::kTilesN][4],
                                                      const __nv_bfloat16* As, const __nv_bfloat16* Bs, int wm,
                                                      int wn) {
  using Layout = KMajor<Cfg>;
  const int lane = threadIdx.x % 32, matrix = lane / 8, row = lane % 8;
#pragma unroll
  for (int kk = 0; kk < Cfg::BK; kk += 16) {
    uint32_t a[Cfg::kTilesM][4], b[Cfg::kTilesN][2];
    // A: matrices (k 0–7, m 0–7), (k 0–7, m 8–15), (k 8–15, m 0–7), (k 8–15, m 8–15) = a0, a1, a2, a3
#pragma unroll
    for (int i = 0; i < Cfg::kTilesM; ++i)
      load_matrices_x4_trans(a[i], As + (kk + (matrix / 2) * 8 + row) * Layout::kLdA + wm + 16 * i + (matrix % 2) * 8);
      // B: matrices (k 0–7), (k 8–15) of n tile j, then of tile j + 1 = b[j][0], b[j][1], b[j+1][0], b[j+1][1]
#pragma unroll
    for (int j = 0; j + 1 < Cfg::kTilesN; j += 2) {
      uint32_t r[4];
      load_matrices_x4_trans(r, Bs + (kk + (matrix % 2) * 8 + row) * Layout::kLdB + wn + 8 * (j + matrix / 2));
      b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
    }
    if constexpr (Cfg::kTilesN % 2 == 1) {  // lanes 16–31 name rows that the x2 form ignores
      constexpr int j = Cfg::kTilesN - 1;
      load_matrices_x2_trans(b[j], Bs + (kk + (matrix % 2) * 8 + row) * Layout::kLdB + wn + 8 * j);
    }
#pragma unroll
    for (int i = 0; i < Cfg::kTilesM; ++i)
#pragma unroll
      for (int j = 0; j < Cfg::kTilesN; ++j) mma_16x8x16(acc[i][j], a[i], b[j]);
  }
}

}  // namespace nt::kernels::cuda::mma_bf16
