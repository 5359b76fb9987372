// The model builder: named models and layer-spec strings.
//
//   mlp   784 -> 320 -> ReLU -> 160 -> ReLU -> 10
//   cnn   conv 3x3 32 (pad 1) -> BN -> ReLU -> maxpool 2 -> conv 3x3 64 (pad 1) -> BN -> ReLU -> maxpool 2
//         -> flatten -> 128 -> ReLU -> 10
//   spec  comma-separated layers, e.g. "linear:320,relu,linear:160,relu,linear:10"
//         linear:N                a fully connected layer with N outputs (with bias)
//         conv:K:R[:stride[:pad]] K filters of RxR (stride 1, pad R/2 by default; no bias when bn follows)
//         bn                      BatchNorm1d after a (C) input, BatchNorm2d after (C, H, W)
//         maxpool:W[:stride]      max pooling over WxW windows (stride W by default)
//         flatten                 (C, H, W) -> (C*H*W), a view
//         dropout:P               dropout with probability P
//         relu                    fused into a preceding linear or bn, else a standalone ReLU
// Names of parameters follow the equivalent PyTorch nn.Sequential ("0.weight", "2.bias", ...), where
// every spec item, fused or not, is one module. A model whose first layer is linear takes each sample
// flattened to (C*H*W).
#pragma once

#include <memory>
#include <string>

#include "engine/model.h"

namespace nt::layers {

// The spec string of a named model (mlp, cnn, cnn-cifar) whose head has `classes` outputs, or the input itself when
// it is not a known name. Presets take any input shape: convolutions take the data's channels, Linear its sizes.
std::string model_spec(const std::string& name_or_spec, int classes = 10);

struct BuildOptions {
  // The BatchNorms will take their training statistics over several ranks (--sync-bn; PlanInfo::batch_statistics):
  // no fusion that keeps them on the chip (the stem, layers/fusion.h).
  bool sync_batchnorm = false;
  // A convolution's neighbours write its input and output gradient as its kernels multiply them under --tf32 or
  // --bf16 (layers/fusion.h, "staged input" and "staged gradient"); off, they write fp32 and the convolution stages
  // them (the same bits: the tests compare).
  bool staged_operands = true;
};

// sample_shape: (channels, rows, cols) of the data. Throws nt::Error naming --model on a bad spec.
std::unique_ptr<Model> build_model(const std::string& name_or_spec, const Shape& sample_shape, int classes,
                                   const BuildOptions& options = {});

}  // namespace nt::layers
