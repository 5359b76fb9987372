#include "engine/model.h"

#include <algorithm>
#include <sstream>

#include "kernels/runtime.h"
#include "profile/scope.h"

namespace nt {

Model::Model(std::string name, Shape input_shape, std::vector<std::unique_ptr<Layer>> layers,
             std::vector<std::string> fusions)
    : name_(std::move(name)), layers_(std::move(layers)), fusions_(std::move(fusions)) {
  if (layers_.empty()) throw Error(cat("model '", name_, "' has no layers"));
  shapes_.push_back(std::move(input_shape));
  for (const auto& layer : layers_) shapes_.push_back(layer->output_shape(shapes_.back()));
  for (const auto& layer : layers_) layer_labels_.push_back(layer->label());
}

std::string Model::summary() const {
  std::ostringstream s;
  s << name_ << ": input " << shapes_.front().str();
  for (size_t i = 0; i < layers_.size(); ++i) s << "\n  " << layers_[i]->describe() << " -> " << shapes_[i + 1].str();
  if (!params_.params().empty()) s << "\n  " << params_.count() << " parameters";
  for (const std::string& fusion : fusions_) s << "\n  fused " << fusion;
  return s.str();
}

namespace {

// Every layer's specs (parameters or buffers) under their nn.Sequential names ("3.weight"); first[i] is
// where layer i's run begins, first[L] the total.
template <class Entry, class SpecsOf>
std::vector<Entry> named_entries(const std::vector<std::unique_ptr<Layer>>& layers, SpecsOf specs_of,
                                 std::vector<size_t>& first) {
  std::vector<Entry> entries;
  for (const auto& layer : layers) {
    first.push_back(entries.size());
    for (auto& spec : specs_of(*layer))
      entries.push_back({spec, cat(layer->sequential_index + spec.module, ".", spec.name)});
  }
  first.push_back(entries.size());
  return entries;
}

// Layer i's run of `all`, as named_entries laid it out.
template <class T>
std::vector<T*> run_of(std::vector<T>& all, const std::vector<size_t>& first, size_t i) {
  std::vector<T*> run;
  for (size_t j = first[i]; j < first[i + 1]; ++j) run.push_back(&all[j]);
  return run;
}

}  // namespace

void Model::init_params(const Context& ctx, uint64_t seed, DType dtype) {
  if (dtype == DType::f64 && ctx.on_cuda()) throw Error("f64 models run on the CPU backend only");
  std::vector<size_t> first_buffer;
  std::vector<size_t>& first_param = first_param_;
  params_.build(named_entries<ParamStore::Entry>(
                    layers_, [](const Layer& l) { return l.param_specs(); }, first_param),
                ctx.exec(), seed, dtype);
  params_.build_buffers(named_entries<ParamStore::BufferEntry>(
                            layers_, [](const Layer& l) { return l.buffer_specs(); }, first_buffer),
                        ctx.exec());
  for (size_t i = 0; i < layers_.size(); ++i) {
    auto params = run_of(params_.params(), first_param, i);
    layers_[i]->bind_params(params);
    auto buffers = run_of(params_.buffers(), first_buffer, i);
    layers_[i]->bind_buffers(buffers);
    // A per-layer stream of the model's seed (SplitMix64 keeps nearby seeds apart).
    layers_[i]->seed(seed ^ (0x9E3779B97F4A7C15ull * (i + 1)));
  }
}

size_t Model::grads_offset(size_t layer) const {
  NT_CHECK(layer + 1 < first_param_.size(), "grads_offset of layer ", layer, " before init_params");
  if (first_param_[layer] == first_param_[layer + 1]) return params_.total();
  const Param& first = params_.params()[first_param_[layer]];
  return static_cast<size_t>(static_cast<const char*>(first.grad.raw()) -
                             static_cast<const char*>(params_.grads().raw())) /
         dtype_size(params_.dtype());
}

void Model::compile(const Context& ctx, int batch, kernels::ProcessGroup* batch_statistics, int input_slots) {
  if (batch <= 0) throw Error(cat("--batch: must be positive, got ", batch));
  NT_CHECK(input_slots == 1 || input_slots == 2, "a model has 1 or 2 input slots, not ", input_slots);
  batch_ = batch;
  batch_statistics_ = batch_statistics;
  inputs_.assign(static_cast<size_t>(input_slots), Tensor{});
  activations_.assign(shapes_.size(), Tensor{});
  activation_grads_.assign(shapes_.size(), Tensor{});
  ArenaPlan plan;
  for (Tensor& input : inputs_) plan.request(&input, shapes_.front().prepend(batch), params_.dtype());
  for (size_t i = 1; i < shapes_.size(); ++i) {
    if (is_view_output(i)) continue;  // aliases activation i-1, bound below
    Shape full = shapes_[i].prepend(batch);
    plan.request(&activations_[i], full, params_.dtype());
    plan.request(&activation_grads_[i], full, params_.dtype());
  }
  const PlanInfo info{batch, ctx.exec().backend, params_.dtype(), batch_statistics, ctx.exec().math, input_slots};
  for (size_t i = 0; i < layers_.size(); ++i) layers_[i]->plan(plan, info, shapes_[i]);
  arena_ = plan.commit(ctx.exec());
  input_slot_ = 0;
  activations_[0] = inputs_[0];
  bind_views();
}

bool Model::is_view_output(size_t i) const { return i > 0 && layers_[i - 1]->is_view(); }

void Model::bind_views() {
  for (size_t i = 1; i < shapes_.size(); ++i) {
    if (!is_view_output(i)) continue;
    Shape full = shapes_[i].prepend(batch_);
    activations_[i] = activations_[i - 1].reshaped(full);
    // The input gradient of a first-layer view is never needed (and never planned).
    if (activation_grads_[i - 1].defined()) activation_grads_[i] = activation_grads_[i - 1].reshaped(full);
  }
}

void Model::require_slot(int slot) const {
  NT_CHECK(slot >= 0 && slot < input_slots(), "input slot ", slot, " of a model compiled with ", input_slots());
}

void Model::use_input(int slot, bool prepared) {
  require_slot(slot);
  if (slot != input_slot_) {
    input_slot_ = slot;
    activations_[0] = inputs_[size_t(slot)];
    bind_views();
  }
  if (const size_t first = first_computing_layer(); first < layers_.size())
    layers_[first]->use_input_slot(slot, prepared && layers_[first]->prepares_input());
}

size_t Model::first_computing_layer() const {
  size_t i = 0;
  while (i < layers_.size() && layers_[i]->is_view()) ++i;
  return i;
}

bool Model::prepares_input() const {
  const size_t first = first_computing_layer();
  return first < layers_.size() && layers_[first]->prepares_input();
}

void Model::prepare_input(const kernels::Exec& exec, int rows, int slot) {
  NT_CHECK(rows > 0 && rows <= batch_, "prepare_input of ", rows, " rows on a model compiled for ", batch_);
  require_slot(slot);
  if (!prepares_input()) return;
  const size_t first = first_computing_layer();
  profile::LayerScope scope(layer_labels_[first]);
  layers_[first]->prepare_input(exec, inputs_[size_t(slot)].reshaped(shapes_[first].prepend(batch_)).rows(rows), slot);
}

void Model::forward(const kernels::Exec& exec, int rows, Mode mode, size_t layers) {
  NT_CHECK(rows > 0 && rows <= batch_, "forward of ", rows, " rows on a model compiled for ", batch_);
  for (size_t i = 0; i < std::min(layers, layers_.size()); ++i) {
    if (layers_[i]->is_view()) continue;
    profile::LayerScope scope(layer_labels_[i]);
    layers_[i]->forward(exec, activations_[i].rows(rows), activations_[i + 1].rows(rows), mode);
  }
}

void Model::backward(const kernels::Exec& exec, int rows, size_t layers,
                     const std::function<void(size_t layer)>& after_layer, const kernels::SideStream* weight_side) {
  NT_CHECK(rows > 0 && rows <= batch_, "backward of ", rows, " rows on a model compiled for ", batch_);
  NT_CHECK(!(after_layer && weight_side), "backward: a weight side stream with per-layer callbacks");
  bool after_own_gradients = false;  // the later layer's backward ended on a kernel of its own gradients only
  for (size_t i = std::min(layers, layers_.size()); i-- > 0;) {
    if (layers_[i]->is_view()) continue;
    profile::LayerScope scope(layer_labels_[i]);
    // No input gradient for the first layer, nor behind a first-layer view (nobody needs them).
    const bool wants_dx = i > 0 && activation_grads_[i].defined();
    Tensor dx = wants_dx ? activation_grads_[i].rows(rows) : Tensor{};
    layers_[i]->backward_overlaps_previous(after_own_gradients);
    layers_[i]->backward_weight_side(weight_side);
    layers_[i]->backward(exec, activations_[i].rows(rows), activations_[i + 1].rows(rows),
                         activation_grads_[i + 1].rows(rows), wants_dx ? &dx : nullptr);
    after_own_gradients = layers_[i]->backward_ends_on_own_gradients();
    if (after_layer) after_layer(i);
  }
  if (weight_side) weight_side->join();
}

std::vector<std::pair<std::string, Tensor>> Model::run_state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& layer : layers_)
    for (auto& [name, tensor] : layer->run_state())
      out.emplace_back(cat("train_state.", layer->sequential_index, ".", name), tensor);
  return out;
}

}  // namespace nt
