#include "layers/builder.h"

#include <charconv>
#include <map>
#include <sstream>

#include "layers/linear.h"
#include "layers/relu.h"

namespace nt::layers {

namespace {

const std::map<std::string, std::string>& named_models() {
  static const std::map<std::string, std::string> models{
      {"mlp", "linear:320,relu,linear:160,relu,linear:10"},
  };
  return models;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);) parts.push_back(item);
  return parts;
}

int64_t positive_int(const std::string& text, const std::string& item) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size() || v <= 0)
    throw Error(cat("--model: '", item, "' needs a positive integer, got '", text, "'"));
  return v;
}

std::string known_names() {
  std::string names;
  for (const auto& [name, spec] : named_models()) names += (names.empty() ? "" : ", ") + name;
  return names;
}

}  // namespace

std::string model_spec(const std::string& name_or_spec) {
  auto it = named_models().find(name_or_spec);
  return it != named_models().end() ? it->second : name_or_spec;
}

std::unique_ptr<Model> build_model(const std::string& name_or_spec, const Shape& sample_shape, int classes) {
  const std::string spec = model_spec(name_or_spec);
  const auto items = split(spec, ',');
  if (spec.empty() || items.empty()) throw Error("--model: empty model spec");

  const bool flat_input = items.front().starts_with("linear");
  Shape shape = flat_input ? Shape{sample_shape.numel()} : sample_shape;
  const Shape input_shape = shape;

  std::vector<std::unique_ptr<Layer>> layers;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto fields = split(items[i], ':');
    const std::string& kind = fields.empty() ? items[i] : fields[0];
    std::unique_ptr<Layer> layer;
    if (kind == "linear" && fields.size() == 2) {
      if (shape.rank() != 1)
        throw Error(cat("--model: item ", i, " '", items[i], "' gets input ", shape.str(), "; put flatten before it"));
      const bool fuse_relu = i + 1 < items.size() && items[i + 1] == "relu";
      layer = std::make_unique<Linear>(shape[0], positive_int(fields[1], items[i]), fuse_relu);
      layer->sequential_index = static_cast<int>(i);
      if (fuse_relu) ++i;  // the relu module is inside this layer now
    } else if (kind == "relu" && fields.size() == 1) {
      layer = std::make_unique<Relu>();
      layer->sequential_index = static_cast<int>(i);
    } else {
      throw Error(cat("--model: unknown model or layer '", items[i], "' (models: ", known_names(),
                      "; layers: linear:N, relu)"));
    }
    shape = layer->output_shape(shape);
    layers.push_back(std::move(layer));
  }
  if (shape != Shape{classes})
    throw Error(cat("--model: the model ends in ", shape.str(), " but the data has ", classes, " classes"));
  const std::string name = named_models().count(name_or_spec) ? name_or_spec : "custom";
  return std::make_unique<Model>(name, input_shape, std::move(layers));
}

}  // namespace nt::layers
