// BatchNorm (PyTorch's nn.BatchNorm1d / BatchNorm2d) with an optional fused ReLU.
//
// Shapes: x, y, dy, dx hold n·c·hw values; per-channel arrays (gamma, beta, save_*, running_*, dgamma,
// dbeta) hold c. BatchNorm1d is (n, c) with hw = 1.
//   Layout::nchw  x[(n·C + c)·hw + i]          Layout::nhwc  x[(n·hw + i)·C + c]
// Statistics are per channel over the count = n·hw values.
//
//   forward_train  mean = Σx / count, var = Σ(x - mean)² / count (biased), invstd = 1/sqrt(var + eps)
//                  y = gamma·(x - mean)·invstd + beta, then y = max(y, 0) when hyper.relu (NaN kept)
//                  save_mean, save_invstd (c) written for the backward;
//                  running_mean = (1-m)·running_mean + m·mean
//                  running_var  = (1-m)·running_var  + m·var·count/(count-1)   (m = hyper.momentum)
//                  *num_batches_tracked += 1 (device int64) when not null; running_* may be null
//                  (no running statistics). count == 1 throws nt::Error (as PyTorch); count == 0 (an
//                  empty batch) and c == 0 write nothing.
//   forward_eval   y = gamma·(x - running_mean)/sqrt(running_var + eps) + beta, ReLU when hyper.relu.
//   backward       dy' = hyper.relu ? (y > 0 ? dy : 0) : dy     (y is the forward OUTPUT; nullptr without relu)
//                  xhat = (x - save_mean)·save_invstd
//                  dgamma = Σ dy'·xhat,  dbeta = Σ dy'
//                  dx = gamma·invstd/count · (count·dy' - Σdy' - xhat·Σdy'·xhat)
// gamma/beta null: affine = false (gamma 1, beta 0); dgamma/dbeta null: not computed; dx null: only the
// parameter gradients. Everything is written with `=`, never accumulated. No pointer may alias another.
// workspace: batchnorm_workspace_floats(backend, shape) elements of the op's element type, per call
// (forward_train and backward); may be null when that is 0. It never grows when n shrinks, so the size
// for the largest batch serves every smaller one. Deterministic: fixed reduction order, no
// floating-point atomics; no allocation, no synchronization (CUDA-graph capturable).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/exec.h"

namespace nt::kernels {

enum class Layout { nchw, nhwc };
struct BatchNormShape {
  int64_t n = 0, c = 0, hw = 1;  // BatchNorm1d: (N, C) with hw = 1
  Layout layout = Layout::nchw;
};
struct BatchNormHyper {
  double eps = 1e-5;
  double momentum = 0.1;
  bool relu = false;
};

namespace cpu {
size_t batchnorm_workspace_floats(const BatchNormShape& s);
void batchnorm_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const float* x,
                             const float* gamma, const float* beta, float* y, float* save_mean, float* save_invstd,
                             float* running_mean, float* running_var, int64_t* num_batches_tracked, float* workspace);
void batchnorm_forward_eval(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const float* x,
                            const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, float* y);
void batchnorm_backward(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const float* x,
                        const float* y, const float* dy, const float* gamma, const float* save_mean,
                        const float* save_invstd, float* dx, float* dgamma, float* dbeta, float* workspace);
void batchnorm_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const double* x,
                             const double* gamma, const double* beta, double* y, double* save_mean,
                             double* save_invstd, double* running_mean, double* running_var,
                             int64_t* num_batches_tracked, double* workspace);
void batchnorm_forward_eval(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const double* x,
                            const double* gamma, const double* beta, const double* running_mean,
                            const double* running_var, double* y);
void batchnorm_backward(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const double* x,
                        const double* y, const double* dy, const double* gamma, const double* save_mean,
                        const double* save_invstd, double* dx, double* dgamma, double* dbeta, double* workspace);
}  // namespace cpu

namespace cuda {
size_t batchnorm_workspace_floats(const BatchNormShape& s);
void batchnorm_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const float* x,
                             const float* gamma, const float* beta, float* y, float* save_mean, float* save_invstd,
                             float* running_mean, float* running_var, int64_t* num_batches_tracked, float* workspace);
void batchnorm_forward_eval(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const float* x,
                            const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, float* y);
void batchnorm_backward(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const float* x,
                        const float* y, const float* dy, const float* gamma, const float* save_mean,
                        const float* save_invstd, float* dx, float* dgamma, float* dbeta, float* workspace);
}  // namespace cuda

// Workspace elements one forward_train or backward call needs on `backend` (0 on the CPU).
inline size_t batchnorm_workspace_floats(Backend backend, const BatchNormShape& s) {
#if NT_WITH_CUDA
  if (backend == Backend::cuda) return cuda::batchnorm_workspace_floats(s);
#else
  if (backend == Backend::cuda) throw Error("this build of nanotrain has no CUDA backend");
#endif
  return cpu::batchnorm_workspace_floats(s);
}

inline void batchnorm_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h,
                                    const float* x, const float* gamma, const float* beta, float* y,
                                    float* save_mean, float* save_invstd, float* running_mean, float* running_var,
                                    int64_t* num_batches_tracked, float* workspace) {
  NT_DISPATCH(exec, batchnorm_forward_train, s, h, x, gamma, beta, y, save_mean, save_invstd, running_mean,
              running_var, num_batches_tracked, workspace);
}
inline void batchnorm_forward_eval(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h,
                                   const float* x, const float* gamma, const float* beta,
                                   const float* running_mean, const float* running_var, float* y) {
  NT_DISPATCH(exec, batchnorm_forward_eval, s, h, x, gamma, beta, running_mean, running_var, y);
}
inline void batchnorm_backward(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const float* x,
                               const float* y, const float* dy, const float* gamma, const float* save_mean,
                               const float* save_invstd, float* dx, float* dgamma, float* dbeta, float* workspace) {
  NT_DISPATCH(exec, batchnorm_backward, s, h, x, y, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta,
              workspace);
}

inline void batchnorm_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h,
                                    const double* x, const double* gamma, const double* beta, double* y,
                                    double* save_mean, double* save_invstd, double* running_mean,
                                    double* running_var, int64_t* num_batches_tracked, double* workspace) {
  NT_CPU_ONLY(exec, batchnorm_forward_train, s, h, x, gamma, beta, y, save_mean, save_invstd, running_mean,
              running_var, num_batches_tracked, workspace);
}
inline void batchnorm_forward_eval(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h,
                                   const double* x, const double* gamma, const double* beta,
                                   const double* running_mean, const double* running_var, double* y) {
  NT_CPU_ONLY(exec, batchnorm_forward_eval, s, h, x, gamma, beta, running_mean, running_var, y);
}
inline void batchnorm_backward(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const double* x,
                               const double* y, const double* dy, const double* gamma, const double* save_mean,
                               const double* save_invstd, double* dx, double* dgamma, double* dbeta,
                               double* workspace) {
  NT_CPU_ONLY(exec, batchnorm_backward, s, h, x, y, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta,
              workspace);
}

}  // namespace nt::kernels
