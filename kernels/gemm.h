// GEMM with fused epilogues: the workhorse of Linear (and later of Conv2d as implicit GEMM).
//
//   C(M,N) = op(A)(M,K) · op(B)(K,N), then the epilogue, written with `=` (never accumulated).
//
// Layouts, all row-major with leading dimensions (elements between consecutive rows):
//   A: (M,K) with lda >= K, or with trans_a its transpose stored (K,M) with lda >= M
//   B: (K,N) with ldb >= N, or with trans_b its transpose stored (N,K) with ldb >= K
//   C: (M,N) with ldc >= N
// Epilogues:
//   none       C = A·B
//   bias       C = A·B + bias[n]                          (Linear forward)
//   bias_relu  C = max(A·B + bias[n], 0)                  (Linear+ReLU forward)
//   relu_mask  C = mask[m,n] > 0 ? A·B : 0, mask has ldc  (input gradient through a ReLU whose output is mask;
//              a select, not a product, so an infinite A·B under a closed mask gives 0, not NaN)
// Optionally a_row_sums[m] = Σ_k op(A)[m,k] (written with `=`): the bias gradient of the weight-gradient
// GEMM dW = dYᵀ·X comes out of the same pass over dY.
//
// C must not alias A, B or bias; relu_mask may run in place (mask == C).
// Numerics: fp32 products accumulated in fp32; each output's K-sum runs in one fixed order on a given
// backend, so results are bit-reproducible run to run. M, N or K may be any size >= 0 (K == 0 gives
// C = epilogue(0)).
#pragma once

#include <cstddef>

#include "kernels/dispatch.h"

namespace nt::kernels {

enum class Epilogue { none, bias, bias_relu, relu_mask };

template <class T>
struct GemmArgs {
  int M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  const T* A = nullptr;
  int lda = 0;
  const T* B = nullptr;
  int ldb = 0;
  T* C = nullptr;
  int ldc = 0;
  Epilogue epilogue = Epilogue::none;
  const T* bias = nullptr;  // (N), for bias and bias_relu
  const T* mask = nullptr;  // (M,N) with ldc, for relu_mask
  T* a_row_sums = nullptr;  // (M) or nullptr
  // The caller's promise that this GEMM reads nothing the op launched just before it on the stream writes,
  // and writes nothing that op reads or writes, and that op is not itself overlapping. The CUDA kernel then
  // runs beside it (Linear's input gradient beside its weight gradient) and waits for it only before
  // finishing; the result is the same. Ignored on the CPU.
  bool overlaps_previous = false;
  // Optional scratch of gemm_workspace_floats(M, N, K) floats (or more). Given one, the CUDA GEMM may split a
  // long K over many blocks where few output tiles would leave SMs idle, a second kernel adding the partials
  // in a fixed order; without one it never does. Not read before written; the CPU ignores it.
  T* workspace = nullptr;
};
using GemmDesc = GemmArgs<float>;
using GemmDescF64 = GemmArgs<double>;  // CPU only: double-precision gradient checks

const char* gemm_kernel_name(Epilogue e);  // "gemm", "gemm_bias", "gemm_bias_relu", "gemm_relu_mask"

namespace cpu {
template <class T>
void gemm(const Exec& exec, const GemmArgs<T>& d);
template <>
void gemm(const Exec& exec, const GemmArgs<float>& d);  // kernels/cpu/gemm.cpp
template <>
void gemm(const Exec& exec, const GemmArgs<double>& d);  // plain loops in f64 (kernels/cpu/gemm_f64.cpp)
}  // namespace cpu
namespace cuda {
void gemm(const Exec& exec, const GemmDesc& d);
// Floats of GemmArgs::workspace for (M', N, K) with every M' <= M (a layer plans with its full batch and may
// run a smaller one); 0 where no such GEMM would use it.
size_t gemm_workspace_floats(int M, int N, int K);
}  // namespace cuda

template <class T>
void gemm(const Exec& exec, const GemmArgs<T>& d) {
  dispatch<cpu::gemm<T>, cuda::gemm>(exec, d);
}
// The CPU GEMM needs none.
inline size_t gemm_workspace_floats(Backend backend, int M, int N, int K) {
  return by_backend<nullptr, cuda::gemm_workspace_floats>(backend, M, N, K);
}

}  // namespace nt::kernels
