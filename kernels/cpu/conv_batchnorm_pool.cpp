// The fused convolution stem on the CPU: the reference twin of kernels/cuda/conv_batchnorm_pool.cu (contract in
// kernels/conv_batchnorm_pool.h). Unfused: conv2d_forward into a scratch, then the pooled BatchNorm
// (kernels/cpu/batchnorm.cpp) on it; the backward recomputes that scratch, takes the pooled BatchNorm's dx into a
// second one and conv2d_backward_weight of it. The reference for the GPU's fused kernels.
//
// Workspace (elements of T): conv (n, K, P, Q), dconv (n, K, P, Q), the pooled y (the staged output's fp32 values),
// then batchnorm_pool_workspace_floats.
#include <cstddef>
#include <cstdint>

#include "kernels/conv_batchnorm_pool.h"
#include "kernels/operand.h"

namespace nt::kernels::cpu {

namespace {

// The fused convolution stem's workspace: conv, dconv (full resolution), then batchnorm_pool's.
template <class T>
struct StemScratch {
  T* conv;
  T* dconv;
  T* pooled;  // y, where the op stages it (ConvBatchNormPoolArgs::y_staged)
  T* batchnorm;
};
int64_t pooled_planes(const ConvBatchNormPoolShape& s) { return int64_t(s.pool().p()) * s.pool().q(); }
size_t pooled_size(const ConvBatchNormPoolShape& s) { return size_t(s.conv.n) * s.conv.k * pooled_planes(s); }

// The workspace's parts, with conv2d_forward(x, w) in conv (every pass starts from it).
template <class T>
StemScratch<T> convolved_scratch(const Exec& exec, const ConvBatchNormPoolArgs<T>& a) {
  const size_t full = a.shape.conv.y_size(), pooled = pooled_size(a.shape);
  NT_CHECK(a.workspace != nullptr || full == 0, "conv_batchnorm_pool needs conv_batchnorm_pool_workspace_floats()");
  const StemScratch<T> ws{a.workspace, a.workspace + full, a.workspace + 2 * full, a.workspace + 2 * full + pooled};
  cpu::conv2d_forward(exec, Conv2dArgs<T>{.shape = a.shape.conv, .x = a.x, .w = a.w, .y = ws.conv});
  return ws;
}

// The pooled BatchNorm's arguments on the convolution's output in ws.conv, with the stem's own tensors (each op
// reads and writes only those its contract names); its dx, when it has one, is ws.dconv.
template <class T>
BatchNormArgs<T> pooled_args(const ConvBatchNormPoolArgs<T>& a, const StemScratch<T>& ws) {
  return {.shape = a.shape.batchnorm(),
          .hyper = a.hyper,
          .pool = a.shape.pool(),
          .x = ws.conv,
          .gamma = a.gamma,
          .beta = a.beta,
          .y = a.y ? a.y : ws.pooled,
          .argmax = a.argmax,
          .save_mean = a.save_mean,
          .save_invstd = a.save_invstd,
          .running_mean = a.running_mean,
          .running_var = a.running_var,
          .num_batches_tracked = a.num_batches_tracked,
          .dy = a.dy,
          .dx = ws.dconv,
          .dgamma = a.dgamma,
          .dbeta = a.dbeta,
          .workspace = ws.batchnorm};
}

// The forward's y, where the op stages it (y_staged), from the scratch it went to.
template <class T>
void stage_output(const Exec& exec, const ConvBatchNormPoolArgs<T>& a, const StemScratch<T>& ws) {
  if (a.y_staged)
    stage_channels_last(a.y ? a.y : ws.pooled, a.shape.conv.n, a.shape.conv.k, pooled_planes(a.shape), exec.math,
                        a.y_staged);
}

}  // namespace

size_t conv_batchnorm_pool_workspace_floats(const ConvBatchNormPoolShape& s) {
  return 2 * s.conv.y_size() + pooled_size(s) + cpu::batchnorm_pool_workspace_floats(s.batchnorm(), s.pool());
}

template <class T>
void conv_batchnorm_pool_forward_train(const Exec& exec, const ConvBatchNormPoolArgs<T>& a) {
  const StemScratch<T> ws = convolved_scratch(exec, a);
  cpu::batchnorm_pool_forward_train(exec, pooled_args(a, ws));
  stage_output(exec, a, ws);
}

template <class T>
void conv_batchnorm_pool_forward_eval(const Exec& exec, const ConvBatchNormPoolArgs<T>& a) {
  const StemScratch<T> ws = convolved_scratch(exec, a);
  cpu::batchnorm_pool_forward_eval(exec, pooled_args(a, ws));
  stage_output(exec, a, ws);
}

template <class T>
void conv_batchnorm_pool_backward(const Exec& exec, const ConvBatchNormPoolArgs<T>& a) {
  const StemScratch<T> ws = convolved_scratch(exec, a);
  if (a.y_staged && a.hyper.relu && !a.y)  // the ReLU's y, as stored
    unstage_channels_last(a.y_staged, a.shape.conv.n, a.shape.conv.k, pooled_planes(a.shape), exec.math, ws.pooled);
  cpu::batchnorm_pool_backward(exec, pooled_args(a, ws));
  cpu::conv2d_backward_weight(exec, Conv2dArgs<T>{.shape = a.shape.conv, .x = a.x, .dy = ws.dconv, .dw = a.dw});
}

// The CPU's forward computes the statistics from the convolution's output itself: nothing to run ahead.
template <class T>
void conv_batchnorm_pool_moments(const Exec&, const ConvBatchNormPoolArgs<T>&) {}

template void conv_batchnorm_pool_forward_train(const Exec&, const ConvBatchNormPoolArgs<float>&);
template void conv_batchnorm_pool_forward_train(const Exec&, const ConvBatchNormPoolArgs<double>&);
template void conv_batchnorm_pool_forward_eval(const Exec&, const ConvBatchNormPoolArgs<float>&);
template void conv_batchnorm_pool_forward_eval(const Exec&, const ConvBatchNormPoolArgs<double>&);
template void conv_batchnorm_pool_backward(const Exec&, const ConvBatchNormPoolArgs<float>&);
template void conv_batchnorm_pool_backward(const Exec&, const ConvBatchNormPoolArgs<double>&);
template void conv_batchnorm_pool_moments(const Exec&, const ConvBatchNormPoolArgs<float>&);
template void conv_batchnorm_pool_moments(const Exec&, const ConvBatchNormPoolArgs<double>&);

}  // namespace nt::kernels::cpu
