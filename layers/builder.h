// The model builder: named models and layer-spec strings.
//
//   mlp   784 -> 320 -> ReLU -> 160 -> ReLU -> 10
//   spec  comma-separated layers, e.g. "linear:320,relu,linear:160,relu,linear:10"
//         linear:N   a fully connected layer with N outputs (with bias)
//         relu       fused into a preceding linear, else a standalone ReLU
// Names of parameters follow the equivalent PyTorch nn.Sequential ("0.weight", "2.bias", ...), where
// every spec item, fused or not, is one module. A model whose first layer is linear takes each sample
// flattened to (C*H*W).
#pragma once

#include <memory>
#include <string>

#include "engine/model.h"

namespace nt::layers {

// The spec string of a named model, or the input itself when it is not a known name.
std::string model_spec(const std::string& name_or_spec);

// sample_shape: (channels, rows, cols) of the data. Throws nt::Error naming --model on a bad spec.
std::unique_ptr<Model> build_model(const std::string& name_or_spec, const Shape& sample_shape, int classes);

}  // namespace nt::layers
