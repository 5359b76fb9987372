// Conv2d: PyTorch's nn.Conv2d (NCHW, square kernel, zero padding, groups 1, dilation 1), as implicit GEMM
// (kernels/conv.h).
//
//   x: (rows, C, H, W)   W: (K, C, R, R)   b: (K) optional   y: (rows, K, P, Q), P = (H + 2pad - R)/stride + 1
// forward   y = conv(x, W) + b
// backward  dW, db from x and dy (written =); dx = conv_transpose(dy, W) when the previous layer needs it
// f32 everywhere; f64 on the CPU backend for gradient checks.
#pragma once

#include "engine/layer.h"
#include "kernels/conv.h"

namespace nt::layers {

class Conv2d final : public Layer {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int kernel, int stride, int pad, bool bias);

  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  std::vector<ParamSpec> param_specs() const override;
  void bind_params(std::span<Param*> params) override;
  void plan(ArenaPlan& plan, const PlanInfo& info, const Shape& input) override;
  void forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) override;
  void backward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy,
                const Tensor* dx) override;
  bool backward_ends_on_own_gradients() const override { return backward_ended_on_gradients_; }
  // From now on the training forward leaves y's per-channel statistics here where its plan allows
  // (kernels::conv2d_forward's epilogue), for the BatchNorm after it (BatchNorm::take_statistics).
  const ChannelStatistics& offer_statistics() {
    offers_statistics_ = true;
    return statistics_;
  }
  // From now on the layer before writes this convolution's input into the returned input buffer (the layer after its
  // output gradient into output_grad) wherever `used` holds for a batch (channels-last in TF32 or BF16:
  // kernels::conv2d_takes_staged), and this layer reads it from there.
  StagedOperands& offer_staged_input();
  StagedOperands& offer_staged_output_grad();
  // Whether the channels allow staged operands at all (multiples of 8: the BF16 kernels' vector, and the writers'
  // channel groups); the plan for a batch and math mode decides the rest (kernels::conv2d_takes_staged).
  bool may_take_staged() const { return in_ % 8 == 0 && out_ % 8 == 0; }

 private:
  friend class ConvBatchNormPool;  // runs this convolution inside its fused kernels
  kernels::Conv2dShape shape_for(int64_t rows, const Shape& sample) const;  // the op's shape; sample (C, H, W)
  template <class T>
  void forward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode);
  template <class T>
  void backward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& dy, const Tensor* dx);

  int in_, out_, kernel_, stride_, pad_;
  bool bias_;
  Param* weight_ = nullptr;
  Param* bias_param_ = nullptr;
  Tensor workspace_;                          // the CUDA passes' split-K partials; undefined when none is needed
  bool backward_ended_on_gradients_ = false;  // what kernels::conv2d_backward returned last
  bool offers_statistics_ = false;
  ChannelStatistics statistics_;
  bool offers_staged_input_ = false, offers_staged_output_grad_ = false;
  Shape planned_input_;  // the sample shape of the latest plan
  StagedOperands staged_;
  StagedOperands& offer_staged();
};

}  // namespace nt::layers
