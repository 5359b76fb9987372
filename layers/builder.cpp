#include "layers/builder.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <optional>
#include <sstream>

#include "layers/batchnorm.h"
#include "layers/conv2d.h"
#include "layers/conv_batchnorm_pool.h"
#include "layers/dropout.h"
#include "layers/fusion.h"
#include "layers/linear.h"
#include "layers/pooling.h"
#include "layers/relu.h"

namespace nt::layers {

namespace {

const std::map<std::string, std::string>& named_models() {
  static const std::map<std::string, std::string> models{
      {"mlp", "linear:320,relu,linear:160,relu,linear:10"},
      {"cnn", "conv:32:3,bn,relu,maxpool:2,conv:64:3,bn,relu,maxpool:2,flatten,linear:128,relu,linear:10"},
      // For CIFAR-10 (3x32x32): three conv-BN-ReLU-pool blocks halving the image and doubling the channels, then a
      // linear head; the class count comes from the data.
      {"cnn-cifar",
       "conv:64:3,bn,relu,maxpool:2,conv:128:3,bn,relu,maxpool:2,conv:256:3,bn,relu,maxpool:2,flatten,"
       "linear:10"},
  };
  return models;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);) parts.push_back(item);
  return parts;
}

// A size in a spec: a whole number in [1, kMaxSpecInt]. Far above any layer this engine trains, and within int, so
// that no value is ever truncated (conv:4:4294967299 once trained with a kernel of 3).
constexpr int64_t kMaxSpecInt = 1 << 20;
int64_t positive_int(const std::string& text, const std::string& item) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size() || v <= 0 || v > kMaxSpecInt)
    throw Error(cat("--model: '", item, "' needs a positive integer up to ", kMaxSpecInt, ", got '", text, "'"));
  return v;
}

struct PoolItem {
  int window, stride;
};
// "maxpool:W[:stride]" (stride defaults to W); nullopt for any other item.
std::optional<PoolItem> maxpool_item(const std::string& item) {
  const auto fields = split(item, ':');
  if (fields.empty() || fields[0] != "maxpool" || fields.size() < 2 || fields.size() > 3) return std::nullopt;
  const int window = static_cast<int>(positive_int(fields[1], item));
  return PoolItem{window, fields.size() == 3 ? static_cast<int>(positive_int(fields[2], item)) : window};
}

double probability(const std::string& text, const std::string& item) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size() || !(v >= 0 && v < 1))
    throw Error(cat("--model: '", item, "' needs a probability in [0, 1), got '", text, "'"));
  return v;
}

std::string known_names() {
  std::string names;
  for (const auto& [name, spec] : named_models()) names += (names.empty() ? "" : ", ") + name;
  return names;
}

}  // namespace

std::string model_spec(const std::string& name_or_spec, int classes) {
  auto it = named_models().find(name_or_spec);
  if (it == named_models().end()) return name_or_spec;
  // A preset's head has one output per class of the data.
  const std::string& spec = it->second;
  return spec.substr(0, spec.rfind(':') + 1) + std::to_string(classes);
}

std::unique_ptr<Model> build_model(const std::string& name_or_spec, const Shape& sample_shape, int classes,
                                   const BuildOptions& options) {
  const std::string spec = model_spec(name_or_spec, classes);
  const auto items = split(spec, ',');
  if (spec.empty() || items.empty()) throw Error("--model: empty model spec");
  if (spec.back() == ',' || std::find(items.begin(), items.end(), "") != items.end())
    throw Error(cat("--model: an empty item in '", spec, "' (a stray comma?)"));

  const bool flat_input = items.front().starts_with("linear");
  Shape shape = flat_input ? Shape{sample_shape.numel()} : sample_shape;
  const Shape input_shape = shape;

  std::vector<std::unique_ptr<Layer>> layers;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto fields = split(items[i], ':');
    const std::string& kind = fields.empty() ? items[i] : fields[0];
    const size_t index = i;
    auto next_is = [&](const char* what) { return i + 1 < items.size() && items[i + 1] == what; };
    auto needs_rank = [&](int rank, const char* hint) {
      if (shape.rank() != rank)
        throw Error(cat("--model: item ", i, " '", items[i], "' gets input ", shape.str(), hint));
    };
    auto field = [&](size_t k, int64_t fallback) {
      return k < fields.size() ? positive_int(fields[k], items[i]) : fallback;
    };
    std::unique_ptr<Layer> layer;
    if (kind == "linear" && fields.size() == 2) {
      needs_rank(1, "; put flatten before it");
      const bool fuse_relu = next_is("relu");
      layer = std::make_unique<Linear>(shape[0], positive_int(fields[1], items[i]), fuse_relu);
      if (fuse_relu) ++i;  // the relu module is inside this layer now
    } else if (kind == "conv" && fields.size() >= 3 && fields.size() <= 5) {
      needs_rank(3, " (conv needs (C, H, W))");
      const int kernel = static_cast<int>(positive_int(fields[2], items[i]));
      const int stride = static_cast<int>(field(3, 1));
      int pad = kernel / 2;  // "same" size at stride 1
      if (fields.size() == 5 && fields[4] == "0")
        pad = 0;
      else if (fields.size() == 5)
        pad = static_cast<int>(positive_int(fields[4], items[i]));
      // A BatchNorm right after makes a bias redundant (its mean subtraction cancels it): none, as is usual.
      layer = std::make_unique<Conv2d>(shape[0], positive_int(fields[1], items[i]), kernel, stride, pad,
                                       /*bias=*/!next_is("bn"));
    } else if (kind == "bn" && fields.size() == 1) {
      if (shape.rank() != 1 && shape.rank() != 3)
        throw Error(cat("--model: item ", i, " 'bn' gets input ", shape.str(), " (needs (C) or (C, H, W))"));
      const bool fuse_relu = next_is("relu");
      if (fuse_relu) ++i;
      // A max-pool whose stride is its window (the cnn's) runs inside the BatchNorm2d: the full-resolution
      // output is never written, and its backward is the BatchNorm's reading the pooled gradient.
      int pool = 0;
      if (const auto next = i + 1 < items.size() ? maxpool_item(items[i + 1]) : std::nullopt;
          next && shape.rank() == 3 && next->stride == next->window && next->window <= shape[1] &&
          next->window <= shape[2]) {
        pool = next->window;
        ++i;
      }
      layer = std::make_unique<BatchNorm>(shape[0], shape.rank() == 3, kernels::Layout::nchw, fuse_relu, true, pool);
    } else if (const auto pool = maxpool_item(items[i])) {
      needs_rank(3, " (maxpool needs (C, H, W))");
      layer = std::make_unique<MaxPool2d>(pool->window, pool->stride);
    } else if (kind == "flatten" && fields.size() == 1) {
      layer = std::make_unique<Flatten>();
    } else if (kind == "dropout" && fields.size() == 2) {
      layer = std::make_unique<Dropout>(probability(fields[1], items[i]));
    } else if (kind == "relu" && fields.size() == 1) {
      layer = std::make_unique<Relu>();
    } else {
      throw Error(cat("--model: unknown model or layer '", items[i], "' (models: ", known_names(),
                      "; layers: linear:N, conv:K:R[:stride[:pad]], bn, relu, maxpool:W[:stride], flatten, ",
                      "dropout:P)"));
    }
    layer->sequential_index = static_cast<int>(index);
    shape = layer->output_shape(shape);
    layers.push_back(std::move(layer));
  }
  if (shape != Shape{classes})
    throw Error(cat("--model: the model ends in ", shape.str(), " but the data has ", classes, " classes"));
  const auto fusions =
      plan_fusions(layers, input_shape, {.stem = !options.sync_batchnorm, .staged_operands = options.staged_operands});
  const std::string name = named_models().count(name_or_spec) ? name_or_spec : "custom";
  return std::make_unique<Model>(name, input_shape, std::move(layers), describe(fusions));
}

}  // namespace nt::layers
