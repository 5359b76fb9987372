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
// Every op takes one BatchNormArgs<T> (below), whose comment lists which fields each op reads and writes.
// Statistics given (ChannelPartials, kernels/channel_partials.h; the float forward_train ops): partials of x's
// per-channel statistics that the kernel before already computed (conv2d_forward's epilogue), NCHW only; the GPU
// then skips its statistics pass and combines them (same Chan combination, their count's order), the CPU computes
// its own. They must be of this x, written by the training forward just before; f64 takes none (an error).
// Synchronized (group, with world W > 1; f32): the training statistics are those of all W ranks' batches together,
// as PyTorch's SyncBatchNorm. The forward all_gathers each rank's statistics partials (the given ones, or its own
// statistics pass's; kernels/channel_partials.h), combines them in rank order, and uses count·W as the count (so
// running_var's unbiased factor is count·W/(count·W - 1)). The backward all_reduce_means the per-channel sums
// (Σdy', Σdy'·xhat) before it uses them, so that dx = gamma·invstd/count · (count·dy' - S̄1 - xhat·S̄2) with S̄ the
// ranks' mean of the sums, which is the gradient of the ranks' mean loss, and dgamma = S̄2, dbeta = S̄1 (the same on
// every rank: the mean of the ranks' own). Every rank must call with the same shape. The collectives run on exec
// (in the CUDA graph on the GPU).
// workspace: batchnorm_workspace_floats(backend, shape, ranks) elements of the op's element type, per call
// (forward_train and backward); may be null when that is 0. It never grows when n shrinks, so the size
// for the largest batch serves every smaller one. Deterministic: fixed reduction order, no
// floating-point atomics; no allocation, no synchronization (CUDA-graph capturable).
//
// Fused max-pool (batchnorm_pool_*): BatchNorm2d in NCHW, its ReLU when hyper.relu, then MaxPool2d(window,
// stride = window) (kernels/pool.h), as one op that never writes the full-resolution output:
//   x (n, c, h, w) with shape.hw = h·w; y and argmax (n, c, P, Q), P = floor(h / window), Q = floor(w / window)
//   forward_train / forward_eval  y, argmax = maxpool2d_forward(batchnorm(x)): the statistics over all of x
//                  (and the running statistics) as above, argmax the chosen element's h·W + w with maxpool's rule
//   backward       dy (n, c, P, Q) is the gradient of the pooled output; the BatchNorm's own dy' is dy at each
//                  window's argmax and 0 elsewhere, through the ReLU as y > 0 (the pooled y is the value at the
//                  argmax); y (pooled) is read only with relu. dx, dgamma, dbeta as backward.
// workspace: batchnorm_pool_workspace_floats(backend, shape, pool) (the CPU runs the two ops through a
// full-resolution scratch; the GPU needs only batchnorm_workspace_floats).
// The fused convolution stem that runs these on a convolution's output: kernels/conv_batchnorm_pool.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/channel_partials.h"
#include "kernels/dispatch.h"

namespace nt::kernels {

class ProcessGroup;  // kernels/collective.h

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
  int h = 0, w = 0;  // the input's plane (shape.hw == h·w)
  int window = 2;    // and stride
  int p() const { return h / window; }
  int q() const { return w / window; }
};

// One struct for the whole family: an op reads the fields its comment below names and ignores the rest.
// Shapes: "full" is (n, c, hw) in shape.layout; "pooled" is (n, c, P, Q) = (n, c, pool.p(), pool.q()).
// The pointers that the training forward writes and the backward reads (y, argmax, save_*) are not const.
template <class T>
struct BatchNormArgs {
  BatchNormShape shape = {};
  BatchNormHyper hyper = {};
  BatchNormPool pool = {};                 // batchnorm_pool_* only: x's (h, w) plane and the window
  const T* x = nullptr;                    // full
  const T* gamma = nullptr;                // (c); null: affine = false (gamma 1)
  const T* beta = nullptr;                 // (c); null: beta 0
  T* y = nullptr;                          // full, pooled with batchnorm_pool_*: the forward's output
  int32_t* argmax = nullptr;               // pooled: the chosen element's h·w index in its plane
  T* save_mean = nullptr;                  // (c)
  T* save_invstd = nullptr;                // (c)
  T* running_mean = nullptr;               // (c); null in forward_train: no running statistics
  T* running_var = nullptr;                // (c)
  int64_t* num_batches_tracked = nullptr;  // (1), device memory on the GPU; nullable
  const T* dy = nullptr;                   // the gradient of y (full, or pooled)
  T* dx = nullptr;                         // full; null: the parameter gradients only
  T* dgamma = nullptr;                     // (c); null: not computed
  T* dbeta = nullptr;                      // (c); null: not computed
  T* workspace = nullptr;                  // batchnorm_workspace_floats / batchnorm_pool_workspace_floats elements
  ChannelPartials given = {};              // forward_train, f32: x's statistics from the kernel before; none: {}
  ProcessGroup* group = nullptr;           // training, f32: synchronized over these ranks (world > 1); null: local
  // batchnorm_pool_backward, f32 with Exec::math TF32 or BF16 (nullable): dx as the convolution before multiplies it
  // (kernels/conv.h, 'Staged operands'): channels-last (n, h, w, c) in the math's element (kernels/operand.h), c a
  // multiple of 8, 16-byte aligned. Written instead of dx (which may then be null).
  void* dx_staged = nullptr;
};

inline void check_batchnorm_pool(const BatchNormShape& s, const BatchNormPool& pool) {
  NT_CHECK(s.layout == Layout::nchw, "batchnorm_pool: NCHW only");
  NT_CHECK(pool.window >= 1 && pool.h >= pool.window && pool.w >= pool.window, "batchnorm_pool: window ", pool.window,
           " does not fit the ", pool.h, "x", pool.w, " plane");
  NT_CHECK(s.hw == int64_t(pool.h) * pool.w, "batchnorm_pool: hw = ", s.hw, " is not ", pool.h, "x", pool.w);
}

// The ops' fields, by op (every op also reads shape and hyper; the pooled ones pool):
//   batchnorm_forward_train       reads x, gamma, beta, running_*, given; writes y, save_*, running_*,
//                                 num_batches_tracked; workspace
//   batchnorm_forward_eval        reads x, gamma, beta, running_*; writes y
//   batchnorm_backward            reads x, y (with hyper.relu), dy, gamma, save_*; writes dx, dgamma, dbeta; workspace
//   batchnorm_pool_forward_train  as batchnorm_forward_train, and writes argmax
//   batchnorm_pool_forward_eval   as batchnorm_forward_eval, and writes argmax; workspace
//   batchnorm_pool_backward       as batchnorm_backward, and reads argmax; writes dx_staged instead of dx where set
// Each is cpu::op<T> (float, double) and cuda::op (float); the entry below it picks one (kernels/dispatch.h).
namespace cpu {
size_t batchnorm_workspace_floats(const BatchNormShape& s, int ranks = 1);
template <class T>
void batchnorm_forward_train(const Exec& exec, const BatchNormArgs<T>& a);
template <class T>
void batchnorm_forward_eval(const Exec& exec, const BatchNormArgs<T>& a);
template <class T>
void batchnorm_backward(const Exec& exec, const BatchNormArgs<T>& a);
size_t batchnorm_pool_workspace_floats(const BatchNormShape& s, const BatchNormPool& pool, int ranks = 1);
template <class T>
void batchnorm_pool_forward_train(const Exec& exec, const BatchNormArgs<T>& a);
template <class T>
void batchnorm_pool_forward_eval(const Exec& exec, const BatchNormArgs<T>& a);
template <class T>
void batchnorm_pool_backward(const Exec& exec, const BatchNormArgs<T>& a);
}  // namespace cpu

namespace cuda {
size_t batchnorm_workspace_floats(const BatchNormShape& s, int ranks = 1);
void batchnorm_forward_train(const Exec& exec, const BatchNormArgs<float>& a);
void batchnorm_forward_eval(const Exec& exec, const BatchNormArgs<float>& a);
void batchnorm_backward(const Exec& exec, const BatchNormArgs<float>& a);
size_t batchnorm_pool_workspace_floats(const BatchNormShape& s, const BatchNormPool& pool, int ranks = 1);
void batchnorm_pool_forward_train(const Exec& exec, const BatchNormArgs<float>& a);
void batchnorm_pool_forward_eval(const Exec& exec, const BatchNormArgs<float>& a);
void batchnorm_pool_backward(const Exec& exec, const BatchNormArgs<float>& a);
}  // namespace cuda

// Workspace elements one forward_train or backward call needs on `backend`; ranks > 1: synchronized over that many
// (none on the CPU unless synchronized).
inline size_t batchnorm_workspace_floats(Backend backend, const BatchNormShape& s, int ranks = 1) {
  return by_backend<cpu::batchnorm_workspace_floats, cuda::batchnorm_workspace_floats>(backend, s, ranks);
}
template <class T>
void batchnorm_forward_train(const Exec& exec, const BatchNormArgs<T>& a) {
  dispatch<cpu::batchnorm_forward_train<T>, cuda::batchnorm_forward_train>(exec, a);
}
template <class T>
void batchnorm_forward_eval(const Exec& exec, const BatchNormArgs<T>& a) {
  dispatch<cpu::batchnorm_forward_eval<T>, cuda::batchnorm_forward_eval>(exec, a);
}
template <class T>
void batchnorm_backward(const Exec& exec, const BatchNormArgs<T>& a) {
  dispatch<cpu::batchnorm_backward<T>, cuda::batchnorm_backward>(exec, a);
}

// Workspace elements one batchnorm_pool_* call needs on `backend` (ranks as batchnorm_workspace_floats).
inline size_t batchnorm_pool_workspace_floats(Backend backend, const BatchNormShape& s, const BatchNormPool& pool,
                                              int ranks = 1) {
  return by_backend<cpu::batchnorm_pool_workspace_floats, cuda::batchnorm_pool_workspace_floats>(backend, s, pool,
                                                                                                 ranks);
}
template <class T>
void batchnorm_pool_forward_train(const Exec& exec, const BatchNormArgs<T>& a) {
  dispatch<cpu::batchnorm_pool_forward_train<T>, cuda::batchnorm_pool_forward_train>(exec, a);
}
template <class T>
void batchnorm_pool_forward_eval(const Exec& exec, const BatchNormArgs<T>& a) {
  dispatch<cpu::batchnorm_pool_forward_eval<T>, cuda::batchnorm_pool_forward_eval>(exec, a);
}
template <class T>
void batchnorm_pool_backward(const Exec& exec, const BatchNormArgs<T>& a) {
  dispatch<cpu::batchnorm_pool_backward<T>, cuda::batchnorm_pool_backward>(exec, a);
}

}  // namespace nt::kernels
