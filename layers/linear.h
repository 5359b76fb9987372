// Linear: y = x·Wᵀ + b, optionally followed by a fused ReLU. PyTorch's nn.Linear layout and init.
//
//   x: (rows, in)   W: (out, in)   b: (out)   y: (rows, out)
// forward   one GEMM, epilogue bias or bias+ReLU (with a planned workspace where a long K over few rows
//           splits further than a cluster: the cnn's 3136->128 layer)
// backward  dz = dy (through the ReLU unless the next layer already masked it)
//           dW = dzᵀ·x with db = Σ_rows dz from the same pass   (both written =)
//           dx = dz·W, times (x > 0) when the previous layer ended in a ReLU   (written =)
// f32 everywhere; f64 on the CPU backend for gradient checks.
// As a classifier head (the last layer, softmax cross-entropy after it: see SoftmaxCrossEntropy::fuses),
// forward, loss and backward run as one op, kernels/classifier_head.h.
#pragma once

#include "engine/layer.h"
#include "engine/loss.h"

namespace nt::layers {

class Linear final : public Layer {
 public:
  Linear(int64_t in_features, int64_t out_features, bool relu, bool bias = true);

  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  std::vector<ParamSpec> param_specs() const override;
  void bind_params(std::span<Param*> params) override;
  void plan(ArenaPlan& plan, const PlanInfo& info, const Shape& input) override;
  void forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) override;
  void backward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy,
                const Tensor* dx) override;
  bool ends_in_relu() const override { return relu_; }
  bool can_mask_input_grad() const override { return true; }

  // Whether this layer can run as a fused classifier head: no ReLU after it and sizes the fused op serves
  // (kernels::classifier_head_fits), known when the model is built (layers/fusion.h); and, once its parameters are
  // bound, f32 ones (an f64 model is a gradient check's, which runs the separate ops).
  bool shape_fits_classifier_head() const;
  bool fits_classifier_head() const;
  // Forward, softmax cross-entropy and (with dlogits) backward in one op; shapes as forward/backward, and
  // labels (rows) i32. dx: nullptr for the first layer; evaluation passes neither dlogits nor dx.
  void classifier_head(const kernels::Exec& exec, const Tensor& x, const Tensor& logits, const Tensor& labels,
                       const Tensor* dlogits, const Tensor* dx, const LossTotals& totals);

 private:
  template <class T>
  void forward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& y);
  template <class T>
  void backward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor* dx);

  int in_, out_;
  bool relu_, bias_;
  Param* weight_ = nullptr;
  Param* bias_param_ = nullptr;
  Tensor workspace_;  // the forward GEMM's split-K partials (kernels/gemm.h); undefined when none is needed
};

}  // namespace nt::layers
