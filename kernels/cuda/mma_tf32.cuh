// TF32 tensor-core pieces of the implicit-GEMM convolution (kernels/cuda/conv.cu, Exec::math TF32 or BF16): the tile
// configuration, the operand rounding, the m16n8k8 MMA and its fragment loads from shared memory.
//
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (sm_80+): D(16×8) = A(16×8)·B(8×8) + C for one warp,
// fp32 accumulators. Lane l has group g = l / 4 and place t = l % 4; its fragments (PTX ISA, "Matrix
// Fragments for mma.m16n8k8"):
//   A: a0 = A[g][t]    a1 = A[g+8][t]    a2 = A[g][t+4]    a3 = A[g+8][t+4]
//   B: b0 = B[t][g]    b1 = B[t+4][g]
//   C: c0 = C[g][2t]   c1 = C[g][2t+1]   c2 = C[g+8][2t]   c3 = C[g+8][2t+1]
//
// Shared memory: both operands of a slab are stored as rows of k, A as As[m][k] and B as Bs[n][k], row stride
// kLd = BK + 4 floats. kLd ≡ 4 (mod 32), so a fragment load, 8 rows g at 4 columns t, touches banks 4g + t:
// all 32 distinct; and a loader warp storing 32 consecutive k of one row is conflict-free as well.
//
// Rounding: every operand element is rounded to TF32 (cvt.rna: to nearest, ties away from zero; 10 mantissa
// bits) as its fragment is loaded, or to BF16 (to nearest even; 7 bits) under Exec::math BF16. A product of two
// TF32 (or BF16) values is exact in fp32, so the GPU differs from the CPU's fp32 sums of the rounded operands
// (kernels/operand.h) only by the order of the fp32 additions.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/tf32.h"

namespace nt::kernels::cuda::mma_tf32 {

// A block of kWarpsM × kWarpsN warps owns a BM×BN tile of C; warp (i, j) the WM×WN piece at (i·WM, j·WN),
// made of kTilesM × kTilesN MMA tiles of 16×8: the accumulators' shape, whatever the operands' format
// (mma_bf16.cuh's configuration shares it).
template <int BM_, int BN_, int WarpsM_, int WarpsN_>
struct WarpTiling {
  static constexpr int BM = BM_, BN = BN_;
  static constexpr int kWarpsM = WarpsM_, kWarpsN = WarpsN_, kThreads = 32 * WarpsM_ * WarpsN_;
  static constexpr int WM = BM / kWarpsM, WN = BN / kWarpsN;
  static constexpr int kTilesM = WM / 16, kTilesN = WN / 8;
  static_assert(WM % 16 == 0 && WN % 8 == 0, "a warp's piece is a whole number of 16x8 MMA tiles");
};

// TF32 slabs of BK = 32 k: As[BM][kLd], then Bs[BN][kLd].
template <int BM_, int BN_, int WarpsM_, int WarpsN_>
struct MmaConfig : WarpTiling<BM_, BN_, WarpsM_, WarpsN_> {
  static constexpr int BK = 32;
  static constexpr int kLd = BK + 4;
  static constexpr int kStageFloats = (BM_ + BN_) * kLd;
  static constexpr int kStageElements = kStageFloats;
  static_assert(32 * WarpsM_ * WarpsN_ >= BM_, "one thread per tile row sums op(A) (backward_weight's dbias)");
};

__device__ __forceinline__ uint32_t to_tf32(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
  return r;
#else
  return __float_as_uint(round_to_tf32(v));  // the same rounding in integer operations: cvt.rna.tf32 needs sm_80
#endif
}

// d += a·b on one 16×8×8 tile.
__device__ __forceinline__ void mma_16x8x8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();                                  // unreachable: the host enables TF32 only on sm_80+ (engine/context.cpp)
#endif
}

// How a slab's fp32 element becomes an MMA operand: rounded to TF32 here, or taken as it is, rounded already where it
// was staged (the channels-last kernels; BF16 values in conv.cu's MMA kernel, which the TF32 MMA multiplies exactly
// since a BF16 value is a TF32 value: kernels/bf16.h).
enum class Rounding { tf32, staged };

template <Rounding kRounding>
__device__ __forceinline__ uint32_t operand(float v) {
  if constexpr (kRounding == Rounding::staged) {
    return __float_as_uint(v);
  } else {
    return to_tf32(v);
  }
}

// Where element (row, k) of a slab's operand lives in shared memory. RowsOfK: rows of k, As[m][k] and Bs[n][k],
// row stride Cfg::kLd (above). KMajor: As[k][m] and Bs[k][n], the layout of a GEMM whose reduction runs over rows
// of its channels-last operands (the channels-last backward_weight, over pixels); row strides BM + 8 and BN + 8,
// ≡ 8 (mod 32), so a fragment load, 4 rows t at 8 columns g, touches banks 8t + g: all 32 distinct.
template <class Cfg>
struct RowsOfK {
  static constexpr int kLdA = Cfg::kLd, kLdB = Cfg::kLd;
  __device__ static constexpr int a(int m, int k) { return m * kLdA + k; }
  __device__ static constexpr int b(int n, int k) { return n * kLdB + k; }
};

template <class Cfg>
struct KMajor {
  static constexpr int kLdA = Cfg::BM + 8, kLdB = Cfg::BN + 8;
  static constexpr int kStageFloats = Cfg::BK * (kLdA + kLdB);  // As[BK][kLdA], then Bs[BK][kLdB]
  static constexpr int kStageElements = kStageFloats;
  static constexpr bool kConflictFree = kLdA % 32 == 8 && kLdB % 32 == 8;  // the kernels using it assert it
  __device__ static constexpr int a(int m, int k) { return k * kLdA + m; }
  __device__ static constexpr int b(int n, int k) { return k * kLdB + n; }
};

template <int kTilesM, int kTilesN>
__device__ __forceinline__ void zero(float (&acc)[kTilesM][kTilesN][4]) {
#pragma unroll
  for (int i = 0; i < kTilesM; ++i)
#pragma unroll
    for (int j = 0; j < kTilesN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// acc += A·Bᵀ over one BK-deep slab of As and Bs, laid out as Layout says. wm, wn: the warp's first row and column
// in the block tile. kRounding: how an element becomes an operand (above).
template <class Cfg, Rounding kRounding = Rounding::tf32, class Layout = RowsOfK<Cfg>>
__device__ __forceinline__ void multiply_slab(float (&acc)[Cfg::kTilesM][Cfg::kTilesN][4], const float* As,
                                              const float* Bs, int wm, int wn) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
  for (int kk = 0; kk < Cfg::BK; kk += 8) {
    uint32_t a[Cfg::kTilesM][4], b[Cfg::kTilesN][2];
#pragma unroll
    for (int i = 0; i < Cfg::kTilesM; ++i) {
      const int m = wm + 16 * i + g, k = kk + t;
      a[i][0] = operand<kRounding>(As[Layout::a(m, k)]), a[i][1] = operand<kRounding>(As[Layout::a(m + 8, k)]),
      a[i][2] = operand<kRounding>(As[Layout::a(m, k + 4)]), a[i][3] = operand<kRounding>(As[Layout::a(m + 8, k + 4)]);
    }
#pragma unroll
    for (int j = 0; j < Cfg::kTilesN; ++j) {
      const int n = wn + 8 * j + g, k = kk + t;
      b[j][0] = operand<kRounding>(Bs[Layout::b(n, k)]), b[j][1] = operand<kRounding>(Bs[Layout::b(n, k + 4)]);
    }
#pragma unroll
    for (int i = 0; i < Cfg::kTilesM; ++i)
#pragma unroll
      for (int j = 0; j < Cfg::kTilesN; ++j) mma_16x8x8(acc[i][j], a[i], b[j]);
  }
}

// Accumulator e of MMA tile (i, j) lies at tile row wm + 16i + row_of(e), column wn + 8j + col_of(e).
__device__ __forceinline__ int row_of(int e) { return threadIdx.x % 32 / 4 + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int col_of(int e) { return 2 * (threadIdx.x % 4) + (e & 1); }

}  // namespace nt::kernels::cuda::mma_tf32
