// What a checkpoint needs to stand alone: the model, the input it takes and how that input is normalized, the
// classes and their names, and where it came from. Written into the safetensors "__metadata__" (string values),
// so that `eval`, `predict` and `train --init-from` need no --model, and PyTorch's side can read it too:
//
//   model_spec           conv:32:3,bn,relu,...   the layer spec (layers/builder.h), presets written out
//   input_shape          1,28,28                 (C, H, W) of one example
//   classes              10
//   class_names          ["0","1",...]           a JSON array of strings; absent when the data names none
//   normalization_mean   0.1307                  per channel, comma-separated, in pixel/255 units
//   normalization_std    0.3081                  x = (pixel / 255 - mean[c]) / std[c]
//   dataset, seed, epochs_trained, batch, engine_version
//
// Checkpoints written before the card (no model_spec) still load when --model is given.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "engine/checkpoint.h"
#include "engine/tensor.h"

namespace nt::app {

struct ModelCard {
  std::string model_spec;
  std::string preset;  // the preset's name (mlp, cnn, cnn-cifar) when the spec is one's, from the "model" key
  Shape input_shape;   // (C, H, W)
  int classes = 0;
  std::vector<std::string> class_names;
  std::vector<float> mean, std;  // per channel
  std::string dataset;

  // The card of a model (a preset's name or a spec) trained on `train` (its shape, classes, names, normalization).
  static ModelCard of(const std::string& model, const data::Dataset& train);
  // The card in `metadata`, read from `path` (named in errors); nullopt when the file has none (an older file).
  // A card that is there but malformed is an nt::Error naming the file and the key.
  static std::optional<ModelCard> from(const CheckpointMetadata& metadata, const std::string& path);
  // The card's keys, added to `metadata`.
  void write_to(CheckpointMetadata& metadata) const;
  // The class's name, or its number when the data named none.
  std::string class_name(int label) const;
};

// The card of the checkpoint at `path` (its header only is validated and read whole: a checkpoint is small).
std::optional<ModelCard> read_model_card(const std::string& path);

}  // namespace nt::app
