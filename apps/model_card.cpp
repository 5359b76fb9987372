#include "apps/model_card.h"

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "layers/builder.h"

namespace nt::app {

namespace {

// Floats as text that reads back to the same bits ("%.9g": 9 significant digits identify any float).
std::string float_list(const std::vector<float>& values) {
  std::string text;
  for (const float v : values) {
    char item[32];
    std::snprintf(item, sizeof item, "%.9g", static_cast<double>(v));
    if (!text.empty()) text += ',';
    text += item;
  }
  return text;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) items.push_back(item);
  return items;
}

class CardReader {
 public:
  CardReader(const CheckpointMetadata& metadata, const std::string& path) : metadata_(metadata), path_(path) {}

  const std::string& text(const char* key) const {
    const auto it = metadata_.find(key);
    if (it == metadata_.end()) fail(key, "is missing");
    return it->second;
  }
  int64_t whole(const char* key, const std::string& item, int64_t limit) const {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec != std::errc{} || end != item.data() + item.size() || v < 1 || v > limit)
      fail(key, cat("holds '", item, "', not a whole number in [1, ", limit, "]"));
    return v;
  }
  std::vector<float> floats(const char* key, size_t count, bool positive) const {
    const auto items = split(text(key));
    if (items.size() != count) fail(key, cat("has ", items.size(), " values for ", count, " channels"));
    std::vector<float> values;
    for (const auto& item : items) {
      float v = 0;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
      if (ec != std::errc{} || end != item.data() + item.size() || !std::isfinite(v) || (positive && !(v > 0)))
        fail(key, cat("holds '", item, "', not a ", positive ? "positive " : "", "number"));
      values.push_back(v);
    }
    return values;
  }
  [[noreturn]] void fail(const char* key, const std::string& what) const {
    throw Error(cat("checkpoint '", path_, "': metadata '", key, "' ", what));
  }

 private:
  const CheckpointMetadata& metadata_;
  const std::string& path_;
};

}  // namespace

ModelCard ModelCard::of(const std::string& model, const data::Dataset& train) {
  const std::string spec = layers::model_spec(model, train.classes);
  return {spec,
          spec != model ? model : "",
          Shape{train.channels, train.rows, train.cols},
          train.classes,
          train.class_names,
          train.mean,
          train.std,
          train.name};
}

std::optional<ModelCard> ModelCard::from(const CheckpointMetadata& metadata, const std::string& path) {
  if (!metadata.count("model_spec")) return std::nullopt;
  const CardReader read(metadata, path);
  ModelCard card;
  card.model_spec = read.text("model_spec");
  const auto dims = split(read.text("input_shape"));
  if (dims.size() != 3) read.fail("input_shape", cat("holds '", read.text("input_shape"), "', not C,H,W"));
  card.input_shape = Shape{read.whole("input_shape", dims[0], 4), read.whole("input_shape", dims[1], 16384),
                           read.whole("input_shape", dims[2], 16384)};
  card.classes = static_cast<int>(read.whole("classes", read.text("classes"), 256));
  if (const auto it = metadata.find("model"); it != metadata.end()) {
    const auto& name = it->second;  // save_safetensors writes the model's name: a preset's, or "custom"
    if (name != card.model_spec && layers::model_spec(name, card.classes) == card.model_spec) card.preset = name;
  }
  const auto channels = static_cast<size_t>(card.input_shape[0]);
  card.mean = read.floats("normalization_mean", channels, false);
  card.std = read.floats("normalization_std", channels, true);
  if (const auto it = metadata.find("dataset"); it != metadata.end()) card.dataset = it->second;
  if (const auto it = metadata.find("class_names"); it != metadata.end()) {
    const auto names = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
    if (!names.is_array() || names.size() != static_cast<size_t>(card.classes))
      read.fail("class_names", cat("is not a JSON array of ", card.classes, " names"));
    for (const auto& name : names) {
      if (!name.is_string()) read.fail("class_names", "holds a name that is not a string");
      card.class_names.push_back(name.get<std::string>());
    }
  }
  return card;
}

void ModelCard::write_to(CheckpointMetadata& metadata) const {
  metadata["model_spec"] = model_spec;
  metadata["input_shape"] = cat(input_shape[0], ",", input_shape[1], ",", input_shape[2]);
  metadata["classes"] = std::to_string(classes);
  if (!class_names.empty()) metadata["class_names"] = nlohmann::json(class_names).dump();
  metadata["normalization_mean"] = float_list(mean);
  metadata["normalization_std"] = float_list(std);
  if (!dataset.empty()) metadata["dataset"] = dataset;
  metadata["engine_version"] = NT_VERSION;
}

std::string ModelCard::class_name(int label) const {
  return label >= 0 && static_cast<size_t>(label) < class_names.size() ? class_names[static_cast<size_t>(label)]
                                                                       : std::to_string(label);
}

std::optional<ModelCard> read_model_card(const std::string& path) {
  return ModelCard::from(SafetensorsFile::read(path).metadata(), path);
}

}  // namespace nt::app
