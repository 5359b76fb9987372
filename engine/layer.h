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
#include "kernels/conv.h"

namespace nt {

namespace kernels {
class ProcessGroup;  // kernels/collective.h
class SideStream;    // kernels/runtime.h
}  // namespace kernels

enum class Mode { train, eval };

// What a layer's plan() needs to size its buffers: the compiled batch, where it runs, in what dtype.
struct PlanInfo {
  int batch = 0;
  Backend backend = Backend::cpu;
  DType dtype = DType::f32;
  // Synchronized BatchNorm (--sync-bn): the ranks whose batches a BatchNorm's training statistics span (world > 1);
  // null: this process's batch alone.
  kernels::ProcessGroup* batch_statistics = nullptr;
  // The math mode the model runs in (Context's): what only one mode uses is planned for that mode alone.
  kernels::Math math = kernels::Math::fp32;
  // The model's input buffers (Model::compile): a first layer that prepares its input (Layer::prepare_input) keeps
  // what it prepares once per slot.
  int input_slots = 1;
};

struct ParamSpec {
  std::string name;  // PyTorch's name within the layer: "weight", "bias"
  Shape shape;       // PyTorch's shape: Linear weight is (out, in)
  std::function<void(std::span<float>, Rng&)> init;
  int module = 0;  // a fused layer's module it belongs to: its full name is (sequential_index + module).name
};

struct Param {
  std::string name;  // full name as PyTorch's nn.Sequential would give it: "0.weight"
  Tensor value;
  Tensor grad;
};

// State a layer keeps that no optimizer touches but a checkpoint saves, as PyTorch's buffers:
// BatchNorm's running_mean, running_var and num_batches_tracked.
struct BufferSpec {
  std::string name;  // PyTorch's name within the layer
  Shape shape;
  bool integer = false;  // i64 (a counter); else floating, in the model's dtype
  double fill = 0;       // initial value of every element
  int module = 0;        // as ParamSpec::module
};

struct Buffer {
  std::string name;  // full name: "1.running_mean"
  Tensor value;
};

// Per-channel statistics that a layer's training forward leaves for the BatchNorm right after it, so that the
// BatchNorm need not read its input once more for them (Conv2d's GEMM epilogue; the builder links the two).
struct ChannelStatistics {
  Tensor partials;  // kernels::ChannelPartials' data, planned by the producer; undefined where it never gives any
  int chunks = 0;   // what the latest forward wrote: > 0 only right after a training forward that gave them
};

// A convolution's input and output gradient in the form its GPU kernels multiply them under --tf32 or --bf16
// (kernels/conv.h, 'Staged operands': channels-last, TF32 or BF16), which its neighbours write instead of their fp32
// outputs wherever `used` holds for a batch: the layer before writes the input, the layer after the output gradient.
// The builder links them (layers/fusion.h, "staged input" and "staged gradient"). Every side asks `used` before each
// forward and backward, so they always agree on which form the batch's tensors have.
struct StagedOperands {
  Tensor input;        // (batch, H, W, C), planned by the convolution in the math's element (kernels/operand.h);
                       // undefined where none is written
  Tensor output_grad;  // (batch, P, Q, K)
  std::function<bool(const kernels::Exec&, int64_t rows)> used;
  // The convolution's filters in their staged form for a batch of `rows` (kernels::Conv2dFilterStage): the writer of
  // `input` stages them beside it wherever it writes input, so that the convolution's forward stages nothing.
  std::function<kernels::Conv2dFilterStage(const kernels::Exec&, int64_t rows)> filters;
  // t's (input's or output_grad's) elements for a batch of `rows` where t is planned and used, else nullptr (the
  // tensor is fp32 NCHW): what every side of the link asks.
  void* for_batch(const Tensor& t, const kernels::Exec& exec, int64_t rows) const {
    return t.defined() && used(exec, rows) ? t.raw() : nullptr;
  }
};

class Layer {
 public:
  virtual ~Layer() = default;

  virtual std::string describe() const = 0;  // "linear 784->320 +relu"
  // "4 linear 160->10": the nn.Sequential index and the description (profiler scopes, NVTX ranges, fusion lists).
  std::string label() const { return cat(sequential_index, " ", describe()); }
  virtual Shape output_shape(const Shape& input) const = 0;  // per sample; throws nt::Error on mismatch
  virtual std::vector<ParamSpec> param_specs() const { return {}; }
  virtual void bind_params(std::span<Param*> params) { (void)params; }  // in param_specs() order
  virtual std::vector<BufferSpec> buffer_specs() const { return {}; }
  virtual void bind_buffers(std::span<Buffer*> buffers) { (void)buffers; }  // in buffer_specs() order
  // A seed of the layer's own (dropout masks), derived from the model's seed: the same seed gives the
  // same training run on every backend.
  virtual void seed(uint64_t seed) { (void)seed; }
  // State a training run carries from step to step besides parameters and buffers (Dropout's draw counter), by a
  // short name: saved and restored by resumable checkpoints so that a resumed run draws what it would have.
  virtual std::vector<std::pair<std::string, Tensor>> run_state() const { return {}; }
  // A view layer (Flatten) only reshapes: its output and output gradient alias its input's, and
  // the model never calls its forward or backward.
  virtual bool is_view() const { return false; }
  // Requests the layer's own buffers (saved statistics, masks, workspace) for `batch` samples.
  virtual void plan(ArenaPlan& plan, const PlanInfo& info, const Shape& input) { (void)plan, (void)info, (void)input; }

  // x: (rows, input...), y: (rows, output...), rows <= the compiled batch.
  virtual void forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) = 0;

  // The part of a model's first layer's training forward that reads its input alone (the fused stem's patch
  // moments): a trainer runs it as soon as a batch is gathered into input slot `slot`, beside the step before
  // (Model::prepare_input). Model::use_input then tells the layer, before each pass, which slot its x is and whether
  // that slot was prepared since it was gathered; the forward and backward keep per-slot state by it.
  virtual bool prepares_input() const { return false; }
  virtual void prepare_input(const kernels::Exec& exec, const Tensor& x, int slot) { (void)exec, (void)x, (void)slot; }
  void use_input_slot(int slot, bool prepared) { input_slot_ = slot, input_prepared_ = prepared; }
  // dy: (rows, output...), the gradient of the loss w.r.t. y (see dy_is_preactivation below).
  // dx: nullptr for the first layer, whose input gradient nobody needs.
  virtual void backward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy,
                        const Tensor* dx) = 0;

  // ReLU fusion across a layer boundary, decided once when the model is built (layers/fusion.h, relu mask):
  // when this layer's output went through a ReLU and the next layer's input-gradient kernel can
  // apply the ReLU mask (dx *= (x > 0)), the next layer does so and this layer receives dy already
  // taken through its ReLU.
  virtual bool ends_in_relu() const { return false; }
  virtual bool can_mask_input_grad() const { return false; }
  void mask_input_grad() { mask_input_grad_ = true; }
  void receive_preactivation_grad() { dy_is_preactivation_ = true; }

  // True when the last kernel the latest backward launched reads only this layer's own workspace and writes
  // only its parameter gradients (Conv2d: the split-K reduction of dW), and is an ordinary kernel: the previous
  // layer's backward may then start beside it.
  virtual bool backward_ends_on_own_gradients() const { return false; }
  // Model::backward, the one planner of overlap across layers, tells each layer before its backward whether the
  // later layer's backward ended so (above); a layer whose first backward kernel may overlap passes it on as its
  // op's overlaps_previous.
  void backward_overlaps_previous(bool overlaps) { backward_overlaps_previous_ = overlaps; }
  // Model::backward also hands each layer the side stream on which it may compute parameter gradients that nothing
  // reads before the optimizer (nullable; it joins the stream after the last layer): Conv2d's weight gradient, a large
  // Linear's dW.
  void backward_weight_side(const kernels::SideStream* side) { weight_side_ = side; }

  int sequential_index = -1;  // position of this layer's first module in the equivalent nn.Sequential

 protected:
  bool mask_input_grad_ = false;
  bool dy_is_preactivation_ = false;
  bool backward_overlaps_previous_ = false;
  const kernels::SideStream* weight_side_ = nullptr;
  int input_slot_ = 0;           // the slot of the x the next pass reads (a first layer; Model::use_input)
  bool input_prepared_ = false;  // prepare_input ran on it since it was gathered
};

}  // namespace nt
