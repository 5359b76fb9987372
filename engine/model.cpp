#include "engine/model.h"

#include <sstream>

#include "profile/scope.h"

namespace nt {

Model::Model(std::string name, Shape input_shape, std::vector<std::unique_ptr<Layer>> layers)
    : name_(std::move(name)), layers_(std::move(layers)) {
  if (layers_.empty()) throw Error(cat("model '", name_, "' has no layers"));
  shapes_.push_back(std::move(input_shape));
  for (const auto& layer : layers_) shapes_.push_back(layer->output_shape(shapes_.back()));
  for (const auto& layer : layers_) layer_labels_.push_back(cat(layer->sequential_index, " ", layer->describe()));
  // ReLU fusion across layer boundaries (see Layer): decided once, here.
  for (size_t i = 1; i < layers_.size(); ++i) {
    if (layers_[i - 1]->ends_in_relu() && layers_[i]->can_mask_input_grad()) {
      layers_[i]->mask_input_grad();
      layers_[i - 1]->receive_preactivation_grad();
    }
  }
}

std::string Model::summary() const {
  std::ostringstream s;
  s << name_ << ": input " << shapes_.front().str();
  for (size_t i = 0; i < layers_.size(); ++i) s << "\n  " << layers_[i]->describe() << " -> " << shapes_[i + 1].str();
  if (!params_.params().empty()) s << "\n  " << params_.count() << " parameters";
  return s.str();
}

void Model::init_params(const Context& ctx, uint64_t seed, DType dtype) {
  if (dtype == DType::f64 && ctx.on_cuda()) throw Error("f64 models run on the CPU backend only");
  std::vector<ParamStore::Entry> entries;
  std::vector<size_t> first_of_layer;
  for (const auto& layer : layers_) {
    first_of_layer.push_back(entries.size());
    for (auto& spec : layer->param_specs())
      entries.push_back({spec, cat(layer->sequential_index, ".", spec.name)});
  }
  params_.build(entries, ctx.exec(), seed, dtype);
  for (size_t i = 0; i < layers_.size(); ++i) {
    size_t end = i + 1 < layers_.size() ? first_of_layer[i + 1] : entries.size();
    std::vector<Param*> mine;
    for (size_t j = first_of_layer[i]; j < end; ++j) mine.push_back(&params_.params()[j]);
    layers_[i]->bind_params(mine);
  }
}

void Model::compile(const Context& ctx, int batch) {
  if (batch <= 0) throw Error(cat("--batch: must be positive, got ", batch));
  batch_ = batch;
  activations_.assign(shapes_.size(), Tensor{});
  activation_grads_.assign(shapes_.size(), Tensor{});
  ArenaPlan plan;
  for (size_t i = 0; i < shapes_.size(); ++i) {
    Shape full = shapes_[i].prepend(batch);
    plan.request(&activations_[i], full, params_.dtype());
    if (i > 0) plan.request(&activation_grads_[i], full, params_.dtype());
  }
  for (size_t i = 0; i < layers_.size(); ++i) layers_[i]->plan(plan, batch, shapes_[i]);
  arena_ = plan.commit(ctx.exec());
}

void Model::forward(const kernels::Exec& exec, int rows, Mode mode) {
  NT_CHECK(rows > 0 && rows <= batch_, "forward of ", rows, " rows on a model compiled for ", batch_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    profile::LayerScope scope(layer_labels_[i]);
    layers_[i]->forward(exec, activations_[i].rows(rows), activations_[i + 1].rows(rows), mode);
  }
}

void Model::backward(const kernels::Exec& exec, int rows) {
  NT_CHECK(rows > 0 && rows <= batch_, "backward of ", rows, " rows on a model compiled for ", batch_);
  for (size_t i = layers_.size(); i-- > 0;) {
    profile::LayerScope scope(layer_labels_[i]);
    Tensor dx = i > 0 ? activation_grads_[i].rows(rows) : Tensor{};
    layers_[i]->backward(exec, activations_[i].rows(rows), activations_[i + 1].rows(rows),
                         activation_grads_[i + 1].rows(rows), i > 0 ? &dx : nullptr);
  }
}

}  // namespace nt
