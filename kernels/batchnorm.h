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
// Statistics given (ChannelPartials, kernels/conv.h; the float forward_train ops): partials of x's per-channel
// statistics that the kernel before already computed (conv2d_forward's epilogue), NCHW only; the GPU then skips
// its statistics pass and combines them (same Chan combination, their count's order), the CPU computes its own.
// They must be of this x, written by the training forward just before.
// workspace: batchnorm_workspace_floats(backend, shape) elements of the op's element type, per call
// (forward_train and backward); may be null when that is 0. It never grows when n shrinks, so the size
// for the largest batch serves every smaller one. Deterministic: fixed reduction order, no
// floating-point atomics; no allocation, no synchronization (CUDA-graph capturable).
//
// Fused max-pool (batchnorm_pool_*): BatchNorm2d in NCHW, its ReLU when hyper.relu, then MaxPool2d(window,
// stride = window) (kernels/pool.h), as one op that never writes the full-resolution output:
//   x (n, c, h, w) with s.hw = h·w; y and argmax (n, c, P, Q), P = floor(h / window), Q = floor(w / window)
//   forward_train / forward_eval  y, argmax = maxpool2d_forward(batchnorm(x)): the statistics over all of x
//                  (and the running statistics) as above, argmax the chosen element's h·W + w with maxpool's rule
//   backward       dy (n, c, P, Q) is the gradient of the pooled output; the BatchNorm's own dy' is dy at each
//                  window's argmax and 0 elsewhere, through the ReLU as y > 0 (the pooled y is the value at the
//                  argmax); y (pooled) is read only with relu. dx, dgamma, dbeta as backward.
// workspace: batchnorm_pool_workspace_floats(backend, s, pool) (the CPU runs the two ops through a
// full-resolution scratch; the GPU needs only batchnorm_workspace_floats).
//
// Fused convolution stem (conv_batchnorm_pool_*): a model's first convolution, when it has few taps and no
// bias (conv_batchnorm_pool_fits: C·R·S <= 32 taps and a zero-padded image of at most 8192 values), then
// batchnorm_pool_* on its output, as one op that never writes that output (n, K, P, Q): the GPU recomputes each
// value from x's C·R·S taps (the direct convolution's arithmetic, TF32 with Exec::tf32) wherever the BatchNorm
// reads one, and takes the statistics and the weight gradient from moments of x's patches (kernels/cuda/
// conv_batchnorm_pool.cu). With conv = conv2d_forward(x, w) (kernels/conv.h) and dconv the dx of batchnorm_pool_backward:
//   forward_train / forward_eval  y, argmax = batchnorm_pool_*(conv): the statistics and running statistics
//                  of conv, argmax an index into conv's (P, Q) plane
//   backward       dw = conv2d_backward_weight(x, dconv); dgamma, dbeta as batchnorm_pool_backward. No dx: a
//                  stem is its model's first layer.
// On the GPU the training forward's pooled pass and the backward's reduce read x and w before they wait for
// the kernel launched just before them (programmatic dependent launch, kernels/cuda/launch.cuh): the kernel
// right before a backward call, or the training forward's own statistics pass, must not write x or w (in a
// training step x comes from the batch gather and w from the last update, both earlier). With
// Exec::after_gradient_only_kernel the backward's reduce runs beside the kernel before it, which must then read
// and write none of what the backward reads or writes (its own layer's workspace and gradients only).
// The arguments travel in ConvBatchNormPoolTensors (each op's comment says which fields it reads and writes);
// workspace: conv_batchnorm_pool_workspace_floats(backend, s) elements, 8-byte aligned (the CPU runs the ops
// through full-resolution scratch; the GPU keeps x's patch moments and the passes' partials). The backward
// reads the moments that the training forward of the same x left in it: pass the same workspace to both and
// nothing else in between (a layer's own workspace, as the static memory plan gives it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/conv.h"
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
struct BatchNormPool {
  int h = 0, w = 0;  // the input's plane (s.hw == h·w)
  int window = 2;    // and stride
  int p() const { return h / window; }
  int q() const { return w / window; }
};

struct ConvBatchNormPoolShape {
  Conv2dShape conv;  // x (n, C, H, W), w (K, C, R, S), no bias
  int window = 2;    // the max-pool's window and stride
  BatchNormShape batchnorm() const { return {conv.n, conv.k, int64_t(conv.p()) * conv.q(), Layout::nchw}; }
  BatchNormPool pool() const { return {conv.p(), conv.q(), window}; }
  int taps() const { return conv.c * conv.r * conv.s; }
};
constexpr int kConvBatchNormPoolMaxTaps = 32;      // a GPU thread keeps the filter in registers
constexpr int kConvBatchNormPoolMaxImage = 8192;   // C·(H+2·pad)·(W+2·pad) values: a GPU block stages an image
inline bool conv_batchnorm_pool_fits(const Conv2dShape& conv) {
  return int64_t(conv.c) * conv.r * conv.s <= kConvBatchNormPoolMaxTaps &&
         int64_t(conv.c) * (conv.h + 2 * conv.pad) * (conv.w + 2 * conv.pad) <= kConvBatchNormPoolMaxImage;
}
template <class T>
struct ConvBatchNormPoolTensors {
  const T* x = nullptr;       // (n, C, H, W)
  const T* w = nullptr;       // (K, C, R, S)
  const T* gamma = nullptr;   // (K), nullable: affine = false
  const T* beta = nullptr;
  T* y = nullptr;             // (n, K, P/window, Q/window): the pooled output
  int32_t* argmax = nullptr;  // the same shape
  T* save_mean = nullptr;     // (K)
  T* save_invstd = nullptr;
  T* running_mean = nullptr;  // (K), nullable in forward_train
  T* running_var = nullptr;
  int64_t* num_batches_tracked = nullptr;
  const T* dy = nullptr;      // backward: the pooled output's gradient
  T* dw = nullptr;            // backward: (K, C, R, S)
  T* dgamma = nullptr;        // backward, nullable
  T* dbeta = nullptr;
  T* workspace = nullptr;
};

inline void check_batchnorm_pool(const BatchNormShape& s, const BatchNormPool& pool) {
  NT_CHECK(s.layout == Layout::nchw, "batchnorm_pool: NCHW only");
  NT_CHECK(pool.window >= 1 && pool.h >= pool.window && pool.w >= pool.window, "batchnorm_pool: window ", pool.window,
           " does not fit the ", pool.h, "x", pool.w, " plane");
  NT_CHECK(s.hw == int64_t(pool.h) * pool.w, "batchnorm_pool: hw = ", s.hw, " is not ", pool.h, "x", pool.w);
}

namespace cpu {
size_t batchnorm_workspace_floats(const BatchNormShape& s);
void batchnorm_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const float* x,
                             const float* gamma, const float* beta, float* y, float* save_mean, float* save_invstd,
                             float* running_mean, float* running_var, int64_t* num_batches_tracked, float* workspace,
                             const ChannelPartials& given);
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
size_t batchnorm_pool_workspace_floats(const BatchNormShape& s, const BatchNormPool& pool);
void batchnorm_pool_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                                  const BatchNormHyper& h, const float* x, const float* gamma, const float* beta,
                                  float* y, int32_t* argmax, float* save_mean, float* save_invstd, float* running_mean,
                                  float* running_var, int64_t* num_batches_tracked, float* workspace,
                                  const ChannelPartials& given);
void batchnorm_pool_forward_eval(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                                 const BatchNormHyper& h, const float* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, float* y, int32_t* argmax,
                                 float* workspace);
void batchnorm_pool_backward(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                             const BatchNormHyper& h, const float* x, const float* y, const float* dy,
                             const int32_t* argmax, const float* gamma, const float* save_mean,
                             const float* save_invstd, float* dx, float* dgamma, float* dbeta, float* workspace);
void batchnorm_pool_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                                  const BatchNormHyper& h, const double* x, const double* gamma, const double* beta,
                                  double* y, int32_t* argmax, double* save_mean, double* save_invstd, double* running_mean,
                                  double* running_var, int64_t* num_batches_tracked, double* workspace);
void batchnorm_pool_forward_eval(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                                 const BatchNormHyper& h, const double* x, const double* gamma, const double* beta,
                                 const double* running_mean, const double* running_var, double* y, int32_t* argmax,
                                 double* workspace);
void batchnorm_pool_backward(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                             const BatchNormHyper& h, const double* x, const double* y, const double* dy,
                             const int32_t* argmax, const double* gamma, const double* save_mean,
                             const double* save_invstd, double* dx, double* dgamma, double* dbeta, double* workspace);
size_t conv_batchnorm_pool_workspace_floats(const ConvBatchNormPoolShape& s);
// forward_train reads x, w, gamma, beta, running_*; writes y, argmax, save_*, running_*, num_batches_tracked
// (and, on the GPU, the workspace's moments that backward reads).
void conv_batchnorm_pool_forward_train(const Exec& exec, const ConvBatchNormPoolShape& s, const BatchNormHyper& h,
                                       const ConvBatchNormPoolTensors<float>& t);
void conv_batchnorm_pool_forward_train(const Exec& exec, const ConvBatchNormPoolShape& s, const BatchNormHyper& h,
                                       const ConvBatchNormPoolTensors<double>& t);
// forward_eval reads x, w, gamma, beta, running_*; writes y, argmax.
void conv_batchnorm_pool_forward_eval(const Exec& exec, const ConvBatchNormPoolShape& s, const BatchNormHyper& h,
                                      const ConvBatchNormPoolTensors<float>& t);
void conv_batchnorm_pool_forward_eval(const Exec& exec, const ConvBatchNormPoolShape& s, const BatchNormHyper& h,
                                      const ConvBatchNormPoolTensors<double>& t);
// backward reads x, w, y (with relu), dy, argmax, gamma, save_* (and the forward's moments); writes dw, dgamma,
// dbeta.
void conv_batchnorm_pool_backward(const Exec& exec, const ConvBatchNormPoolShape& s, const BatchNormHyper& h,
                                  const ConvBatchNormPoolTensors<float>& t);
void conv_batchnorm_pool_backward(const Exec& exec, const ConvBatchNormPoolShape& s, const BatchNormHyper& h,
                                  const ConvBatchNormPoolTensors<double>& t);
}  // namespace cpu

namespace cuda {
size_t batchnorm_workspace_floats(const BatchNormShape& s);
void batchnorm_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const float* x,
                             const float* gamma, const float* beta, float* y, float* save_mean, float* save_invstd,
                             float* running_mean, float* running_var, int64_t* num_batches_tracked, float* workspace,
                             const ChannelPartials& given);
void batchnorm_forward_eval(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const float* x,
                            const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, float* y);
void batchnorm_backward(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const float* x,
                        const float* y, const float* dy, const float* gamma, const float* save_mean,
                        const float* save_invstd, float* dx, float* dgamma, float* dbeta, float* workspace);
size_t batchnorm_pool_workspace_floats(const BatchNormShape& s, const BatchNormPool& pool);
void batchnorm_pool_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                                  const BatchNormHyper& h, const float* x, const float* gamma, const float* beta,
                                  float* y, int32_t* argmax, float* save_mean, float* save_invstd, float* running_mean,
                                  float* running_var, int64_t* num_batches_tracked, float* workspace,
                                  const ChannelPartials& given);
void batchnorm_pool_forward_eval(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                                 const BatchNormHyper& h, const float* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, float* y, int32_t* argmax,
                                 float* workspace);
void batchnorm_pool_backward(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                             const BatchNormHyper& h, const float* x, const float* y, const float* dy,
                             const int32_t* argmax, const float* gamma, const float* save_mean,
                             const float* save_invstd, float* dx, float* dgamma, float* dbeta, float* workspace);
size_t conv_batchnorm_pool_workspace_floats(const ConvBatchNormPoolShape& s);
void conv_batchnorm_pool_forward_train(const Exec& exec, const ConvBatchNormPoolShape& s, const BatchNormHyper& h,
                                       const ConvBatchNormPoolTensors<float>& t);
void conv_batchnorm_pool_forward_eval(const Exec& exec, const ConvBatchNormPoolShape& s, const BatchNormHyper& h,
                                      const ConvBatchNormPoolTensors<float>& t);
void conv_batchnorm_pool_backward(const Exec& exec, const ConvBatchNormPoolShape& s, const BatchNormHyper& h,
                                  const ConvBatchNormPoolTensors<float>& t);
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
                                    int64_t* num_batches_tracked, float* workspace, const ChannelPartials& given = {}) {
  NT_DISPATCH(exec, batchnorm_forward_train, s, h, x, gamma, beta, y, save_mean, save_invstd, running_mean,
              running_var, num_batches_tracked, workspace, given);
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

// given: never any in f64 (the statistics come from the float GPU kernels); taken so that callers need not branch.
inline void batchnorm_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h,
                                    const double* x, const double* gamma, const double* beta, double* y,
                                    double* save_mean, double* save_invstd, double* running_mean,
                                    double* running_var, int64_t* num_batches_tracked, double* workspace,
                                    const ChannelPartials& given = {}) {
  NT_CHECK(given.chunks == 0, "batchnorm_forward_train: given statistics are f32");
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

inline size_t batchnorm_pool_workspace_floats(Backend backend, const BatchNormShape& s, const BatchNormPool& pool) {
#if NT_WITH_CUDA
  if (backend == Backend::cuda) return cuda::batchnorm_pool_workspace_floats(s, pool);
#else
  if (backend == Backend::cuda) throw Error("this build of nanotrain has no CUDA backend");
#endif
  return cpu::batchnorm_pool_workspace_floats(s, pool);
}

inline void batchnorm_pool_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                                         const BatchNormHyper& h, const float* x, const float* gamma,
                                         const float* beta, float* y, int32_t* argmax, float* save_mean,
                                         float* save_invstd, float* running_mean, float* running_var,
                                         int64_t* num_batches_tracked, float* workspace,
                                         const ChannelPartials& given = {}) {
  NT_DISPATCH(exec, batchnorm_pool_forward_train, s, pool, h, x, gamma, beta, y, argmax, save_mean, save_invstd,
              running_mean, running_var, num_batches_tracked, workspace, given);
}
inline void batchnorm_pool_forward_eval(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                                        const BatchNormHyper& h, const float* x, const float* gamma,
                                        const float* beta, const float* running_mean, const float* running_var,
                                        float* y, int32_t* argmax, float* workspace) {
  NT_DISPATCH(exec, batchnorm_pool_forward_eval, s, pool, h, x, gamma, beta, running_mean, running_var, y, argmax,
              workspace);
}
inline void batchnorm_pool_backward(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                                    const BatchNormHyper& h, const float* x, const float* y, const float* dy,
                                    const int32_t* argmax, const float* gamma, const float* save_mean,
                                    const float* save_invstd, float* dx, float* dgamma, float* dbeta,
                                    float* workspace) {
  NT_DISPATCH(exec, batchnorm_pool_backward, s, pool, h, x, y, dy, argmax, gamma, save_mean, save_invstd, dx, dgamma,
              dbeta, workspace);
}
inline void batchnorm_pool_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                                         const BatchNormHyper& h, const double* x, const double* gamma,
                                         const double* beta, double* y, int32_t* argmax, double* save_mean,
                                         double* save_invstd, double* running_mean, double* running_var,
                                         int64_t* num_batches_tracked, double* workspace,
                                         const ChannelPartials& given = {}) {
  NT_CHECK(given.chunks == 0, "batchnorm_pool_forward_train: given statistics are f32");
  NT_CPU_ONLY(exec, batchnorm_pool_forward_train, s, pool, h, x, gamma, beta, y, argmax, save_mean, save_invstd,
              running_mean, running_var, num_batches_tracked, workspace);
}
inline void batchnorm_pool_forward_eval(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                                        const BatchNormHyper& h, const double* x, const double* gamma,
                                        const double* beta, const double* running_mean, const double* running_var,
                                        double* y, int32_t* argmax, double* workspace) {
  NT_CPU_ONLY(exec, batchnorm_pool_forward_eval, s, pool, h, x, gamma, beta, running_mean, running_var, y, argmax,
              workspace);
}
inline void batchnorm_pool_backward(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                                    const BatchNormHyper& h, const double* x, const double* y, const double* dy,
                                    const int32_t* argmax, const double* gamma, const double* save_mean,
                                    const double* save_invstd, double* dx, double* dgamma, double* dbeta,
                                    double* workspace) {
  NT_CPU_ONLY(exec, batchnorm_pool_backward, s, pool, h, x, y, dy, argmax, gamma, save_mean, save_invstd, dx, dgamma,
              dbeta, workspace);
}

inline size_t conv_batchnorm_pool_workspace_floats(Backend backend, const ConvBatchNormPoolShape& s) {
#if NT_WITH_CUDA
  if (backend == Backend::cuda) return cuda::conv_batchnorm_pool_workspace_floats(s);
#else
  if (backend == Backend::cuda) throw Error("this build of nanotrain has no CUDA backend");
#endif
  return cpu::conv_batchnorm_pool_workspace_floats(s);
}
inline void conv_batchnorm_pool_forward_train(const Exec& exec, const ConvBatchNormPoolShape& s,
                                              const BatchNormHyper& h, const ConvBatchNormPoolTensors<float>& t) {
  NT_DISPATCH(exec, conv_batchnorm_pool_forward_train, s, h, t);
}
inline void conv_batchnorm_pool_forward_eval(const Exec& exec, const ConvBatchNormPoolShape& s,
                                             const BatchNormHyper& h, const ConvBatchNormPoolTensors<float>& t) {
  NT_DISPATCH(exec, conv_batchnorm_pool_forward_eval, s, h, t);
}
inline void conv_batchnorm_pool_backward(const Exec& exec, const ConvBatchNormPoolShape& s, const BatchNormHyper& h,
                                         const ConvBatchNormPoolTensors<float>& t) {
  NT_DISPATCH(exec, conv_batchnorm_pool_backward, s, h, t);
}
inline void conv_batchnorm_pool_forward_train(const Exec& exec, const ConvBatchNormPoolShape& s,
                                              const BatchNormHyper& h, const ConvBatchNormPoolTensors<double>& t) {
  NT_CPU_ONLY(exec, conv_batchnorm_pool_forward_train, s, h, t);
}
inline void conv_batchnorm_pool_forward_eval(const Exec& exec, const ConvBatchNormPoolShape& s,
                                             const BatchNormHyper& h, const ConvBatchNormPoolTensors<double>& t) {
  NT_CPU_ONLY(exec, conv_batchnorm_pool_forward_eval, s, h, t);
}
inline void conv_batchnorm_pool_backward(const Exec& exec, const ConvBatchNormPoolShape& s, const BatchNormHyper& h,
                                         const ConvBatchNormPoolTensors<double>& t) {
  NT_CPU_ONLY(exec, conv_batchnorm_pool_backward, s, h, t);
}

}  // namespace nt::kernels
