// Fused convolution stem (conv_batchnorm_pool_*): a model's first convolution, when it has few taps and no
// bias (conv_batchnorm_pool_fits: C·R·S <= 32 taps and a zero-padded image of at most 8192 values), then
// batchnorm_pool_* (kernels/batchnorm.h) on its output, as one op that never writes that output (n, K, P, Q): the
// GPU recomputes each value from x's C·R·S taps (the direct convolution's arithmetic, its operands rounded as
// Exec::math says) wherever the BatchNorm reads one, and takes the statistics and the weight gradient from moments of
// x's patches (kernels/cuda/conv_batchnorm_pool.cu). With conv = conv2d_forward(x, w) (kernels/conv.h) and dconv the dx
// of batchnorm_pool_backward:
//   forward_train / forward_eval  y, argmax = batchnorm_pool_*(conv): the statistics and running statistics
//                  of conv, argmax an index into conv's (P, Q) plane
//   backward       dw = conv2d_backward_weight(x, dconv); dgamma, dbeta as batchnorm_pool_backward. No dx: a
//                  stem is its model's first layer.
//   moments        the part of forward_train that reads x alone (on the GPU x's patch moments, into the
//                  workspace), which a trainer may run ahead as soon as the batch is gathered, beside the step
//                  before; a forward_train with moments_ready then takes them from there. Nothing on the CPU, whose
//                  forward computes the statistics from the convolution's output.
// On the GPU the training forward's pooled pass and the backward's reduce read x and w before they wait for
// the kernel launched just before them (programmatic dependent launch, kernels/cuda/launch.cuh): the kernel
// right before a backward call, or the training forward's own statistics pass, must not write x or w (in a
// training step x comes from the batch gather and w from the last update, both earlier). With moments_ready the
// training forward's pooled pass is its first kernel: it reads x before its wait, as above (the moments pass that read
// x came before), and w after it (the kernel before may be the update). With
// overlaps_previous the backward's reduce runs beside the kernel before it, which must then read and write none
// of what the backward reads or writes (its own layer's workspace and gradients only).
// The arguments travel in ConvBatchNormPoolArgs (its comment lists which fields each op reads and writes);
// workspace: conv_batchnorm_pool_workspace_floats(backend, shape) elements, 8-byte aligned (the CPU runs the ops
// through full-resolution scratch; the GPU keeps x's patch moments and the passes' partials). The backward
// reads the moments that the training forward of the same x left in it: pass the same workspace to both and
// nothing else in between (a layer's own workspace, as the static memory plan gives it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/batchnorm.h"
#include "kernels/conv.h"
#include "kernels/dispatch.h"

namespace nt::kernels {

struct ConvBatchNormPoolShape {
  Conv2dShape conv;  // x (n, C, H, W), w (K, C, R, S), no bias
  int window = 2;    // the max-pool's window and stride
  BatchNormShape batchnorm() const { return {conv.n, conv.k, int64_t(conv.p()) * conv.q(), Layout::nchw}; }
  BatchNormPool pool() const { return {conv.p(), conv.q(), window}; }
  int taps() const { return conv.c * conv.r * conv.s; }
};
constexpr int kConvBatchNormPoolMaxTaps = 32;     // a GPU thread keeps the filter in registers
constexpr int kConvBatchNormPoolMaxImage = 8192;  // C·(H+2·pad)·(W+2·pad) values: a GPU block stages an image
inline bool conv_batchnorm_pool_fits(const Conv2dShape& conv) {
  return int64_t(conv.c) * conv.r * conv.s <= kConvBatchNormPoolMaxTaps &&
         int64_t(conv.c) * (conv.h + 2 * conv.pad) * (conv.w + 2 * conv.pad) <= kConvBatchNormPoolMaxImage;
}

// The ops' fields, by op (every op also reads shape and hyper):
//   conv_batchnorm_pool_forward_train  reads x, w, gamma, beta, running_*; writes y, argmax, save_*, running_*,
//                                      num_batches_tracked (and, on the GPU, the workspace's moments that
//                                      backward reads)
//   conv_batchnorm_pool_forward_eval   reads x, w, gamma, beta, running_*; writes y, argmax
//   conv_batchnorm_pool_backward       reads x, w, y or y_staged (with hyper.relu), dy, argmax, gamma, save_* (and
//                                      the forward's moments); writes dw, dgamma, dbeta
//   conv_batchnorm_pool_moments        reads x; writes, on the GPU, the workspace's moments (which forward_train
//                                      then reads, with moments_ready)
// (the forwards write y_staged where it is set, and y where it is set; with y_staged, next_filters.filters from
// next_filters.w where that is set)
template <class T>
struct ConvBatchNormPoolArgs {
  ConvBatchNormPoolShape shape = {};
  BatchNormHyper hyper = {};
  const T* x = nullptr;                    // (n, C, H, W)
  const T* w = nullptr;                    // (K, C, R, S)
  const T* gamma = nullptr;                // (K), nullable: affine = false
  const T* beta = nullptr;                 // (K), nullable
  T* y = nullptr;                          // (n, K, P/window, Q/window): the pooled output
  int32_t* argmax = nullptr;               // the same shape
  T* save_mean = nullptr;                  // (K)
  T* save_invstd = nullptr;                // (K)
  T* running_mean = nullptr;               // (K), nullable in forward_train
  T* running_var = nullptr;                // (K)
  int64_t* num_batches_tracked = nullptr;  // (1), nullable
  const T* dy = nullptr;                   // backward: the pooled output's gradient
  T* dw = nullptr;                         // backward: (K, C, R, S)
  T* dgamma = nullptr;                     // backward, nullable
  T* dbeta = nullptr;                      // backward, nullable
  T* workspace = nullptr;                  // conv_batchnorm_pool_workspace_floats elements, 8-byte aligned
  // The next convolution's staged input (kernels/conv.h, 'Staged operands'), nullable, f32 with Exec::math TF32 or
  // BF16 only: y channels-last (n, P/window, Q/window, K) in the math's element (kernels/operand.h), K a multiple of
  // 8, 16-byte aligned. Where set, the forwards write it, and y as well where y is set (either may be nullptr, not
  // both); the backward's ReLU reads y where it is set, else y_staged (its sign is y's, but below the format's
  // smallest subnormal, where y rounds to 0: 2^-133 in BF16, 2^-136 in TF32).
  void* y_staged = nullptr;
  // With y_staged (nullable filters: none): the next convolution's filters, which the forwards stage beside its input
  // (kernels/conv.h, Conv2dFilterStage), so that its forward stages nothing (Conv2dArgs::filters_staged). Read after
  // the forwards' wait, as w: a training step's update writes both.
  Conv2dFilterStage next_filters = {};
  // backward: the caller's promise that the kernel launched just before reads and writes only its own layer's
  // workspace and gradients (Model::backward decides it, Layer::backward_overlaps_previous); the reduce then runs
  // beside it on the GPU. Ignored on the CPU.
  bool overlaps_previous = false;
  // forward_train: conv_batchnorm_pool_moments has run on this x and workspace since x was last written, so the
  // moments are not computed again. Ignored on the CPU.
  bool moments_ready = false;
};

namespace cpu {
size_t conv_batchnorm_pool_workspace_floats(const ConvBatchNormPoolShape& s);
template <class T>
void conv_batchnorm_pool_forward_train(const Exec& exec, const ConvBatchNormPoolArgs<T>& a);  // float, double
template <class T>
void conv_batchnorm_pool_forward_eval(const Exec& exec, const ConvBatchNormPoolArgs<T>& a);
template <class T>
void conv_batchnorm_pool_backward(const Exec& exec, const ConvBatchNormPoolArgs<T>& a);
template <class T>
void conv_batchnorm_pool_moments(const Exec& exec, const ConvBatchNormPoolArgs<T>& a);  // nothing to do
}  // namespace cpu

namespace cuda {
size_t conv_batchnorm_pool_workspace_floats(const ConvBatchNormPoolShape& s);
void conv_batchnorm_pool_forward_train(const Exec& exec, const ConvBatchNormPoolArgs<float>& a);
void conv_batchnorm_pool_forward_eval(const Exec& exec, const ConvBatchNormPoolArgs<float>& a);
void conv_batchnorm_pool_backward(const Exec& exec, const ConvBatchNormPoolArgs<float>& a);
void conv_batchnorm_pool_moments(const Exec& exec, const ConvBatchNormPoolArgs<float>& a);
}  // namespace cuda

inline size_t conv_batchnorm_pool_workspace_floats(Backend backend, const ConvBatchNormPoolShape& s) {
  return by_backend<cpu::conv_batchnorm_pool_workspace_floats, cuda::conv_batchnorm_pool_workspace_floats>(backend, s);
}
template <class T>
void conv_batchnorm_pool_forward_train(const Exec& exec, const ConvBatchNormPoolArgs<T>& a) {
  dispatch<cpu::conv_batchnorm_pool_forward_train<T>, cuda::conv_batchnorm_pool_forward_train>(exec, a);
}
template <class T>
void conv_batchnorm_pool_forward_eval(const Exec& exec, const ConvBatchNormPoolArgs<T>& a) {
  dispatch<cpu::conv_batchnorm_pool_forward_eval<T>, cuda::conv_batchnorm_pool_forward_eval>(exec, a);
}
template <class T>
void conv_batchnorm_pool_backward(const Exec& exec, const ConvBatchNormPoolArgs<T>& a) {
  dispatch<cpu::conv_batchnorm_pool_backward<T>, cuda::conv_batchnorm_pool_backward>(exec, a);
}

template <class T>
void conv_batchnorm_pool_moments(const Exec& exec, const ConvBatchNormPoolArgs<T>& a) {
  dispatch<cpu::conv_batchnorm_pool_moments<T>, cuda::conv_batchnorm_pool_moments>(exec, a);
}

}  // namespace nt::kernels
