#include "layers/fusion.h"

#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/conv_batchnorm_pool.h"
#include "layers/linear.h"

namespace nt::layers {

namespace {

void fuse_stem(std::vector<std::unique_ptr<Layer>>& layers, const Shape& input, std::vector<Fusion>& made) {
  if (layers.size() < 2) return;
  auto* conv = dynamic_cast<Conv2d*>(layers[0].get());
  auto* bn = dynamic_cast<BatchNorm*>(layers[1].get());
  if (!conv || !bn || !ConvBatchNormPool::fuses(*conv, *bn, input)) return;
  made.push_back({"stem", cat(conv->label(), " + ", bn->label())});
  auto stem = std::make_unique<ConvBatchNormPool>(
      std::unique_ptr<Conv2d>(static_cast<Conv2d*>(layers[0].release())),
      std::unique_ptr<BatchNorm>(static_cast<BatchNorm*>(layers[1].release())), input);
  layers.erase(layers.begin());
  layers[0] = std::move(stem);
}

void link_statistics(std::vector<std::unique_ptr<Layer>>& layers, std::vector<Fusion>& made) {
  for (size_t i = 0; i + 1 < layers.size(); ++i) {
    auto* conv = dynamic_cast<Conv2d*>(layers[i].get());
    auto* bn = dynamic_cast<BatchNorm*>(layers[i + 1].get());
    if (!conv || !bn) continue;
    bn->take_statistics(conv->offer_statistics());
    made.push_back({"statistics", cat(conv->label(), " -> ", bn->label())});
  }
}

void link_staged_operands(std::vector<std::unique_ptr<Layer>>& layers, std::vector<Fusion>& made) {
  for (size_t i = 0; i < layers.size(); ++i) {
    auto* conv = dynamic_cast<Conv2d*>(layers[i].get());
    if (!conv || !conv->may_take_staged()) continue;
    if (auto* stem = i > 0 ? dynamic_cast<ConvBatchNormPool*>(layers[i - 1].get()) : nullptr) {
      stem->write_staged_output(conv->offer_staged_input());
      made.push_back({"staged input", cat(stem->label(), " -> ", conv->label(), ", with --tf32 or --bf16 on the GPU")});
    }
    auto* bn = i + 1 < layers.size() ? dynamic_cast<BatchNorm*>(layers[i + 1].get()) : nullptr;
    if (bn && bn->can_write_staged_input_grad()) {
      bn->write_staged_input_grad(conv->offer_staged_output_grad());
      made.push_back({"staged gradient", cat(conv->label(), " <- ", bn->label(), ", with --bf16 on the GPU")});
    }
  }
}

void mask_relu_gradients(std::vector<std::unique_ptr<Layer>>& layers, std::vector<Fusion>& made) {
  for (size_t i = 1; i < layers.size(); ++i) {
    if (!layers[i - 1]->ends_in_relu() || !layers[i]->can_mask_input_grad()) continue;
    layers[i]->mask_input_grad();
    layers[i - 1]->receive_preactivation_grad();
    made.push_back({"relu mask", cat(layers[i - 1]->label(), " -> ", layers[i]->label())});
  }
}

void note_head(const std::vector<std::unique_ptr<Layer>>& layers, std::vector<Fusion>& made) {
  const auto* linear = dynamic_cast<const Linear*>(layers.back().get());
  if (linear && linear->shape_fits_classifier_head())
    made.push_back({"head", cat(linear->label(), " + softmax cross-entropy, when training with that loss")});
}

}  // namespace

std::vector<Fusion> plan_fusions(std::vector<std::unique_ptr<Layer>>& layers, const Shape& input,
                                 const FusionChoices& choices) {
  std::vector<Fusion> made;
  if (layers.empty()) return made;
  if (choices.stem) fuse_stem(layers, input, made);
  link_statistics(layers, made);
  if (choices.staged_operands) link_staged_operands(layers, made);
  mask_relu_gradients(layers, made);
  note_head(layers, made);
  return made;
}

std::vector<std::string> describe(const std::vector<Fusion>& fusions) {
  std::vector<std::string> lines;
  for (const Fusion& f : fusions) lines.push_back(cat(f.kind, ": ", f.what));
  return lines;
}

}  // namespace nt::layers
