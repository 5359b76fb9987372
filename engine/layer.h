// The Layer interface. engine/ runs layers; layers/ implements them.
//
// Shapes passed to a layer are per-sample (no batch dimension) when planning, and full (batch first)
// when running. A layer validates its input shape once, in output_shape(), with an nt::Error that
// names the layer; forward/backward then trust their inputs.
//
// Gradient convention: backward writes dx with `=` (never accumulates) and its parameter gradients
// with `=`: every step overwrites all gradients, so nothing needs zeroing between steps.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/arena.h"
#include "engine/rng.h"
#include "engine/tensor.h"

namespace nt {

enum class Mode { train, eval };

struct ParamSpec {
  std::string name;   // PyTorch's name within the layer: "weight", "bias"
  Shape shape;        // PyTorch's shape: Linear weight is (out, in)
  std::function<void(std::span<float>, Rng&)> init;
};

struct Param {
  std::string name;   // full name as PyTorch's nn.Sequential would give it: "0.weight"
  Tensor value;
  Tensor grad;
};

class Layer {
 public:
  virtual ~Layer() = default;

  virtual std::string describe() const = 0;                     // "linear 784->320 +relu"
  virtual Shape output_shape(const Shape& input) const = 0;     // per sample; throws nt::Error on mismatch
  virtual std::vector<ParamSpec> param_specs() const { return {}; }
  virtual void bind_params(std::span<Param*> params) { (void)params; }  // in param_specs() order
  virtual void plan(ArenaPlan& plan, int batch, const Shape& input) { (void)plan, (void)batch, (void)input; }

  // x: (rows, input...), y: (rows, output...), rows <= the compiled batch.
  virtual void forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) = 0;
  // dy: (rows, output...), the gradient of the loss w.r.t. y (see dy_is_preactivation below).
  // dx: nullptr for the first layer, whose input gradient nobody needs.
  virtual void backward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy,
                        const Tensor* dx) = 0;

  // ReLU fusion across a layer boundary, negotiated once by the model when it compiles:
  // when this layer's output went through a ReLU and the next layer's input-gradient kernel can
  // apply the ReLU mask (dx *= (x > 0)), the next layer does so and this layer receives dy already
  // taken through its ReLU.
  virtual bool ends_in_relu() const { return false; }
  virtual bool can_mask_input_grad() const { return false; }
  void mask_input_grad() { mask_input_grad_ = true; }
  void receive_preactivation_grad() { dy_is_preactivation_ = true; }

  int sequential_index = -1;  // position of this layer's first module in the equivalent nn.Sequential

 protected:
  bool mask_input_grad_ = false;
  bool dy_is_preactivation_ = false;
};

}  // namespace nt
