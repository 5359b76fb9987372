// The GEMM of kernels/gemm.h in double precision: plain loops, for finite-difference gradient checks
// of the layers in f64 (where fp32 rounding would swamp the difference quotient). Not a training path.
//
//   C(M,N) = epilogue(op(A)·op(B)), a_row_sums[m] = Σ_k op(A)[m,k]; same layouts and epilogues as fp32.
#include <algorithm>

#include "kernels/cpu/op_scope.h"
#include "kernels/gemm.h"

namespace nt::kernels::cpu {

template <>
void gemm(const Exec& exec, const GemmArgs<double>& d) {
  OpScope scope(
      exec, gemm_kernel_name(d.epilogue),
      profile::OpCost{8.0 * (double(d.M) * d.K + double(d.K) * d.N + double(d.M) * d.N), 2.0 * d.M * d.N * d.K});
  auto a = [&](int m, int k) { return d.trans_a ? d.A[size_t(k) * d.lda + m] : d.A[size_t(m) * d.lda + k]; };
  auto b = [&](int k, int n) { return d.trans_b ? d.B[size_t(n) * d.ldb + k] : d.B[size_t(k) * d.ldb + n]; };
  for (int m = 0; m < d.M; ++m) {
    for (int n = 0; n < d.N; ++n) {
      double acc = 0;
      for (int k = 0; k < d.K; ++k) acc += a(m, k) * b(k, n);
      double& c = d.C[size_t(m) * d.ldc + n];
      switch (d.epilogue) {
        case Epilogue::none:
          c = acc;
          break;
        case Epilogue::bias:
          c = acc + d.bias[n];
          break;
        case Epilogue::bias_relu:
          c = std::max(acc + d.bias[n], 0.0);
          break;
        case Epilogue::relu_mask:
          c = d.mask[size_t(m) * d.ldc + n] > 0 ? acc : 0.0;
          break;
      }
    }
    if (d.a_row_sums) {
      double sum = 0;
      for (int k = 0; k < d.K; ++k) sum += a(m, k);
      d.a_row_sums[m] = sum;
    }
  }
}

}  // namespace nt::kernels::cpu
