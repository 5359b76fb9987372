// A first Conv2d with few taps, its BatchNorm2d, ReLU and MaxPool2d as one layer (kernels/conv_batchnorm_pool.h,
// conv_batchnorm_pool_*): on the GPU the convolution's output is never written; the BatchNorm's kernels
// recompute it from the input image wherever they read it. On the CPU the same op runs the unfused
// kernels through scratch.
//
//   x: (rows, C, H, W)   conv (K, C, R, R), no bias   y: (rows, K, P/pool, Q/pool)
// The builder forms it from a model's leading "conv, bn, [relu], maxpool" when the BatchNorm takes the
// max-pool (stride = window) and the op fits (kernels::conv_batchnorm_pool_fits: few taps, a small image;
// ConvBatchNormPool::fuses). Parameters,
// buffers and checkpoints are those of the two layers it holds, under their own nn.Sequential indices
// ("0.weight", "1.weight", "1.running_mean", ...). Being first, it computes no input gradient.
#pragma once

#include <memory>

#include "kernels/conv_batchnorm_pool.h"
#include "layers/batchnorm.h"
#include "layers/conv2d.h"

namespace nt::layers {

class ConvBatchNormPool final : public Layer {
 public:
  // True when conv (first in the model, on samples of shape input) and bn (right after it) make a fused stem.
  static bool fuses(const Conv2d& conv, const BatchNorm& bn, const Shape& input);
  ConvBatchNormPool(std::unique_ptr<Conv2d> conv, std::unique_ptr<BatchNorm> bn, const Shape& input);

  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  std::vector<ParamSpec> param_specs() const override;
  void bind_params(std::span<Param*> params) override;
  std::vector<BufferSpec> buffer_specs() const override;
  void bind_buffers(std::span<Buffer*> buffers) override;
  void plan(ArenaPlan& plan, const PlanInfo& info, const Shape& input) override;
  void forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) override;
  // The GPU's patch moments of x (kernels::conv_batchnorm_pool_moments), into the slot's workspace.
  bool prepares_input() const override { return true; }
  void prepare_input(const kernels::Exec& exec, const Tensor& x, int slot) override;
  void backward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy,
                const Tensor* dx) override;
  bool ends_in_relu() const override { return bn_->ends_in_relu(); }
  // From now on the output goes to the next convolution's staged input wherever its `used` holds for the batch.
  void write_staged_output(const StagedOperands& staged) { staged_output_ = &staged; }

 private:
  kernels::ConvBatchNormPoolShape shape_for(int64_t rows, const Shape& sample) const;  // sample (C, H, W)
  // The BatchNorm's module within this layer's run of nn.Sequential modules (ParamSpec::module).
  int bn_module() const { return bn_->sequential_index - conv_->sequential_index; }
  // The kernels' arguments for input x and output y: shape, hyper(relu), the parameters, the BatchNorm's state and
  // the input slot's workspace; the backward adds its gradients.
  template <class T>
  kernels::ConvBatchNormPoolArgs<T> args(const Tensor& x, const Tensor& y, bool relu, int slot) const;
  void* staged_output(const kernels::Exec& exec, int64_t rows) const;  // nullptr: y is fp32 NCHW
  // Whether y is written in fp32 beside a staged output, for the backward's ReLU to read: under TF32, whose
  // channels-last reads (4 bytes, K apart) cost the backward's reduce more than the extra store costs the forward;
  // under BF16 the reduce reads the staged copy (docs/bf16.md, 'The same link under --tf32').
  static bool keeps_fp32_output(const kernels::Exec& exec) { return exec.math != kernels::Math::bf16; }
  template <class T>
  void forward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode);
  template <class T>
  void backward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy);

  std::unique_ptr<Conv2d> conv_;
  std::unique_ptr<BatchNorm> bn_;
  // One per input slot (PlanInfo::input_slots): the moments a training forward leaves for its backward belong to
  // the slot's batch, and the next batch's may be prepared meanwhile.
  std::vector<Tensor> workspaces_;
  const StagedOperands* staged_output_ = nullptr;
};

}  // namespace nt::layers
