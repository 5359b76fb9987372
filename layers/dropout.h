// Dropout: PyTorch's nn.Dropout(p). Training keeps each element with probability 1 - p and scales it
// by 1/(1 - p); a fresh mask every step, drawn on the device from the layer's seed and a device-resident
// draw counter (kernels/dropout.h), so whole-epoch CUDA graphs replay with new masks. Evaluation is
// the identity (a copy).
//
//   x, y: (rows, ...) any shape   mask: u8, same element count
#pragma once

#include "engine/layer.h"

namespace nt::layers {

class Dropout final : public Layer {
 public:
  explicit Dropout(double p);

  std::string describe() const override;
  Shape output_shape(const Shape& input) const override { return input; }
  void seed(uint64_t seed) override { seed_ = seed; }
  std::vector<std::pair<std::string, Tensor>> run_state() const override { return {{"dropout_counter", counter_}}; }
  void plan(ArenaPlan& plan, const PlanInfo& info, const Shape& input) override;
  void forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) override;
  void backward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy,
                const Tensor* dx) override;

 private:
  float p_;
  uint64_t seed_ = 0;
  Tensor mask_;     // (batch, ...) u8
  Tensor counter_;  // (2) i64: the draw counter {value, done} of kernels/dropout.h, zeroed by the arena
};

}  // namespace nt::layers
