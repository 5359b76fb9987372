// MaxPool2d (PyTorch's nn.MaxPool2d without padding: floor output size) and Flatten.
//
// MaxPool2d   x: (rows, C, H, W) -> y: (rows, C, P, Q), P = (H - window)/stride + 1
//   forward   y = max over each window; the index of the chosen element is kept for backward
//   backward  dx = dy routed to each window's chosen element, 0 elsewhere (written =, deterministic)
// Flatten     (rows, d1, d2, ...) -> (rows, d1*d2*...): a view, no kernel (engine/layer.h is_view).
#pragma once

#include "engine/layer.h"
#include "kernels/pool.h"

namespace nt::layers {

class MaxPool2d final : public Layer {
 public:
  MaxPool2d(int window, int stride);

  std::string describe() const override;
  Shape output_shape(const Shape& input) const override;
  void plan(ArenaPlan& plan, const PlanInfo& info, const Shape& input) override;
  void forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) override;
  void backward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy,
                const Tensor* dx) override;

 private:
  kernels::Pool2dShape shape_for(const Tensor& x) const;

  int window_, stride_;
  Tensor argmax_;  // (batch, C, P, Q) i32: the chosen element's index within its H*W plane
};

class Flatten final : public Layer {
 public:
  std::string describe() const override { return "flatten"; }
  Shape output_shape(const Shape& input) const override { return Shape{input.numel()}; }
  bool is_view() const override { return true; }
  void forward(const kernels::Exec&, const Tensor&, const Tensor&, Mode) override {}
  void backward(const kernels::Exec&, const Tensor&, const Tensor&, const Tensor&, const Tensor*) override {}
};

}  // namespace nt::layers
