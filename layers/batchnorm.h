// BatchNorm1d / BatchNorm2d: PyTorch's nn.BatchNorm1d/2d (eps 1e-5, momentum 0.1, affine optional,
// running statistics tracked), with an optional fused ReLU. kernels/batchnorm.h does the work.
//
//   BatchNorm1d  x: (rows, C)                          statistics over rows
//   BatchNorm2d  x: (rows, C, H, W)  (Layout::nchw)    statistics over rows, H, W per channel
//                x: (rows, H, W, C)  (Layout::nhwc)
// train     y = gamma * (x - mean) / sqrt(var + eps) + beta (biased var), then ReLU when fused;
//           running_mean/var move by momentum (running_var with the unbiased variance);
//           num_batches_tracked += 1. Needs more than one value per channel, as PyTorch.
// eval      the same from the running statistics.
// backward  dx, dgamma, dbeta of the training forward (written =), through the fused ReLU unless the next
//           layer already masked dy.
// sync      planned with PlanInfo::batch_statistics (--sync-bn on several ranks): the training statistics span
//           every rank's batch, and the backward takes the ranks' mean of its sums (kernels/batchnorm.h).
// pool      with a fused MaxPool2d(pool, stride pool) after it (BatchNorm2d, NCHW): the output is the pooled
//           (rows, C, H/pool, W/pool) and the full-resolution one is never written (kernels/batchnorm.h,
//           batchnorm_pool_*); the module count includes the pool, as it does the ReLU.
// Parameters "weight" (gamma, 1) and "bias" (beta, 0); buffers "running_mean" (0), "running_var" (1),
// "num_batches_tracked" (0, i64): PyTorch's names, so checkpoints load into nn.BatchNorm*d.
#pragma once

#include "engine/layer.h"
#include "kernels/batchnorm.h"

namespace nt::layers {

class BatchNorm final : public Layer {
 public:
  BatchNorm(int64_t channels, bool spatial, kernels::Layout layout, bool relu, bool affine = true, int pool = 0);

  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  std::vector<ParamSpec> param_specs() const override;
  void bind_params(std::span<Param*> params) override;
  std::vector<BufferSpec> buffer_specs() const override;
  void bind_buffers(std::span<Buffer*> buffers) override;
  void plan(ArenaPlan& plan, const PlanInfo& info, const Shape& input) override;
  void forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) override;
  void backward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy,
                const Tensor* dx) override;
  bool ends_in_relu() const override { return relu_; }
  // The training forward takes its statistics from the layer before where that one gave them (Conv2d::
  // offer_statistics; kernels/batchnorm.h, statistics given), instead of reading x for them.
  void take_statistics(const ChannelStatistics& given) { given_ = &given; }
  // From now on the backward writes its input gradient as the convolution before multiplies it (channels-last,
  // Conv2d::offer_staged_output_grad) wherever that one's `used` holds for the batch; needs the fused max-pool, NCHW.
  void write_staged_input_grad(const StagedOperands& staged) { staged_input_grad_ = &staged; }
  bool can_write_staged_input_grad() const { return pool_ > 0 && spatial_ && layout_ == kernels::Layout::nchw; }

 private:
  friend class ConvBatchNormPool;                  // runs this BatchNorm inside its fused kernels
  kernels::BatchNormHyper hyper(bool relu) const;  // PyTorch's eps and momentum
  // save_mean, save_invstd and (pool) argmax for `info.batch` samples of `input`: the state the backward reads.
  void plan_state(ArenaPlan& plan, const PlanInfo& info, const Shape& input);
  kernels::BatchNormShape shape_for(int64_t rows, const Shape& sample) const;
  kernels::BatchNormPool pool_for(const Shape& sample) const;                    // sample: the input (C, H, W)
  void require_trainable(int64_t values_per_channel, const Shape& input) const;  // as PyTorch: more than one
  // The kernels' arguments for input x and output y, built once per call: shape, pool, hyper(relu), the
  // parameters, the state and the workspace; the caller sets what is its own (given; dy, dx and the gradients).
  template <class T>
  kernels::BatchNormArgs<T> args(const Tensor& x, const Tensor& y, bool relu) const;
  template <class T>
  void forward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode);
  template <class T>
  void backward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor* dx);

  int64_t channels_;
  bool spatial_;  // BatchNorm2d
  kernels::Layout layout_;
  bool relu_, affine_;
  int pool_;  // fused max-pool window (and stride); 0: none
  Param* gamma_ = nullptr;
  Param* beta_ = nullptr;
  Tensor running_mean_, running_var_, num_batches_tracked_;
  Tensor save_mean_, save_invstd_, workspace_;
  Tensor argmax_;                             // with pool_: the pooled outputs' argmax, (rows, C, P, Q) i32
  const ChannelStatistics* given_ = nullptr;  // take_statistics
  const StagedOperands* staged_input_grad_ = nullptr;
  kernels::ProcessGroup* group_ = nullptr;  // synchronized over these ranks (PlanInfo::batch_statistics)
};

}  // namespace nt::layers
