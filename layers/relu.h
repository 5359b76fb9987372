// ReLU as its own layer: y = max(x, 0); dx = dy * (y > 0). The builder fuses a ReLU that follows a
// Linear into the Linear's GEMM epilogue instead; this layer serves everywhere else, and applies its own
// mask in backward (it does not take part in the cross-layer fusion, which would only turn its
// backward into a copy).
#pragma once

#include "engine/layer.h"

namespace nt::layers {

class Relu final : public Layer {
 public:
  std::string describe() const override { return "relu"; }
  Shape output_shape(const Shape& input) const override { return input; }
  void forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) override;
  void backward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy,
                const Tensor* dx) override;
};

}  // namespace nt::layers
