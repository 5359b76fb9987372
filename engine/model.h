// Model: an ordered graph of layers with named parameters and a static memory plan.
//
//   Model m("mlp", Shape{1, 28, 28}, std::move(layers));
//   m.init_params(ctx, seed);     // once: parameters + gradients in one block
//   m.compile(ctx, batch);        // once per batch size: every activation and gradient buffer
//   gather into m.input(); m.forward(exec, rows, Mode::train); loss into m.output_grad(); m.backward(exec, rows);
//
// Compiled with two input slots, a trainer gathers the next batch into the other slot (and prepares it: see
// prepare_input) while the current step runs, then switches with use_input.
//
// After compile(), forward and backward allocate nothing and never wait for the device, so a whole
// step can be captured as a CUDA graph.
#pragma once

#include <functional>

#include <memory>
#include <string>
#include <vector>

#include "engine/arena.h"
#include "engine/context.h"
#include "engine/layer.h"
#include "engine/params.h"

namespace nt {

class Model {
 public:
  // `fusions`: what the builder fused, one line each (layers/fusion.h), for summary().
  Model(std::string name, Shape input_shape, std::vector<std::unique_ptr<Layer>> layers,
        std::vector<std::string> fusions = {});

  const std::string& name() const { return name_; }
  const Shape& input_shape() const { return shapes_.front(); }  // per sample
  const Shape& output_shape() const { return shapes_.back(); }  // per sample
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
  std::string summary() const;  // one line per layer with shapes, then the parameter count and the fusions

  // f32 trains; f64 runs on the CPU backend only, for gradient checks in double precision.
  void init_params(const Context& ctx, uint64_t seed, DType dtype = DType::f32);
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  // Where layer i's parameter gradients start in params().grads(), in elements (the block is in layer order); total()
  // for a layer without parameters.
  size_t grads_offset(size_t layer) const;

  // batch_statistics: the ranks a synchronized BatchNorm takes its statistics over (PlanInfo); null: none.
  // input_slots: 1, or 2 for a batch gathered ahead (input(slot)).
  void compile(const Context& ctx, int batch, kernels::ProcessGroup* batch_statistics = nullptr, int input_slots = 1);
  int batch() const { return batch_; }
  kernels::ProcessGroup* batch_statistics() const { return batch_statistics_; }
  int input_slots() const { return static_cast<int>(inputs_.size()); }
  int input_slot() const { return input_slot_; }                // the slot in use (use_input)
  const Tensor& input() const { return activations_.front(); }  // (batch, input...): the slot in use
  const Tensor& input(int slot) const { return inputs_.at(static_cast<size_t>(slot)); }
  // The passes from now on read input(slot). prepared: prepare_input ran on that slot since the batch in it was
  // gathered (else the first layer's forward does that work itself).
  void use_input(int slot, bool prepared);
  // Whether the first layer has work that reads the input alone (Layer::prepare_input); then prepare_input enqueues
  // it for the first `rows` samples of input(slot), e.g. beside the step before, on a side stream.
  bool prepares_input() const;
  void prepare_input(const kernels::Exec& exec, int rows, int slot);
  const Tensor& output() const { return activations_.back(); }  // (batch, output...)
  const Tensor& output_grad() const { return activation_grads_.back(); }
  const Tensor& activation(size_t i) const { return activations_.at(i); }  // 0 = input, i = output of layer i-1
  const Tensor& activation_grad(size_t i) const { return activation_grads_.at(i); }  // undefined where unneeded
  const std::string& layer_label(size_t i) const { return layer_labels_.at(i); }     // "4 linear 160->10"
  // Every layer's run state (Layer::run_state) as "train_state.<module index>.<name>"; valid once compiled.
  std::vector<std::pair<std::string, Tensor>> run_state() const;

  static constexpr size_t kAllLayers = static_cast<size_t>(-1);
  // rows <= batch(): the first `rows` samples of input() are used. `layers` limits a pass to the first
  // layers (a trainer whose loss absorbs the last layer runs the others): all of them by default.
  void forward(const kernels::Exec& exec, int rows, Mode mode, size_t layers = kAllLayers);
  // From activation_grad(layers) (output_grad() for the whole model), filling those layers' parameter gradients.
  // after_layer(i), when given, is called once layer i's backward is enqueued: its gradients, and those of every
  // later layer, are then final (a data-parallel step starts reducing them). weight_side (nullable; not with
  // after_layer, which reads each layer's gradients as it goes): a side stream of exec's on which layers may compute
  // parameter gradients beside the rest of the backward (Layer::backward_weight_side); joined before it returns.
  void backward(const kernels::Exec& exec, int rows, size_t layers = kAllLayers,
                const std::function<void(size_t layer)>& after_layer = {},
                const kernels::SideStream* weight_side = nullptr);

 private:
  bool is_view_output(size_t i) const;   // activation i aliases activation i-1 (layer i-1 is a view)
  void bind_views();                     // the views' activations, after activation 0 was bound
  size_t first_computing_layer() const;  // the first layer that is not a view (layers().size(): none)
  void require_slot(int slot) const;     // an input slot of the compiled model

  std::string name_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::string> layer_labels_;  // "0 linear 784->320 +relu": profiler scopes and NVTX ranges
  std::vector<Shape> shapes_;              // per-sample shape of activation i (0 = input)
  std::vector<std::string> fusions_;
  ParamStore params_;
  std::vector<size_t> first_param_;  // layer i's parameters: params_.params()[first_param_[i], first_param_[i + 1])
  int batch_ = 0;
  kernels::ProcessGroup* batch_statistics_ = nullptr;
  Arena arena_;
  std::vector<Tensor> inputs_;  // the input slots; activations_[0] is inputs_[input_slot_]
  int input_slot_ = 0;
  std::vector<Tensor> activations_;       // i = 0..L
  std::vector<Tensor> activation_grads_;  // i = 1..L used; 0 stays undefined
};

}  // namespace nt
