// Every fusion a model gets, decided in one place when it is built (build_model calls plan_fusions), and recorded
// so that the model's summary lists them. Each one changes which kernels run, never the numbers:
//   stem        a leading convolution with few taps and no bias, and the BatchNorm (+ ReLU + max-pool) after it,
//               become one ConvBatchNormPool layer whose GPU kernels never write the convolution's output
//               (layers/conv_batchnorm_pool.h; ConvBatchNormPool::fuses says when)
//   statistics  a convolution's GEMM epilogue leaves its output's per-channel statistics for the BatchNorm right
//               after it, which then skips its statistics pass where the CUDA plan allows (Conv2d::offer_statistics)
//   relu mask   a layer right after one that ends in ReLU takes its input gradient through that ReLU (a select on
//               the ReLU's output), and the earlier layer receives the gradient of its pre-activation
//               (Layer::mask_input_grad)
//   staged input  a convolution right after a fused stem takes its input as its GPU kernels multiply it under
//               --tf32 or --bf16 (channels-last, rounded: kernels/conv.h, 'Staged operands'), which the stem writes
//               instead of its fp32 output, with the convolution's filters beside it: no transpose in the
//               convolution's passes, no stage kernel in its forward, and half the bytes in BF16
//               (Conv2d::offer_staged_input, StagedOperands::filters; the same bits)
//   staged gradient  likewise its output gradient, from a BatchNorm with a fused max-pool right after it, under
//               --bf16 only (Conv2d::plan says why; Conv2d::offer_staged_output_grad,
//               BatchNorm::write_staged_input_grad)
//   head        a last Linear that fits the fused classifier head (kernels/classifier_head.h) may run inside a
//               softmax cross-entropy loss: the Trainer runs it there when its loss takes it (Loss::fuses)
// The spec parser (layers/builder.cpp) also merges items into one layer where a layer has the fused variant
// built in: linear+relu, bn+relu, bn+maxpool (stride = window). Those show in the layer's own description.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/layer.h"

namespace nt::layers {

struct Fusion {
  std::string kind;  // stem, statistics, staged input, staged gradient, relu mask, head
  std::string what;  // the layers it joins, by their sequential index and description
};

struct FusionChoices {
  bool stem = true;  // false where the BatchNorms synchronize their statistics over ranks, which the stem cannot
  bool staged_operands = true;  // the staged input and gradient links
};

// Makes the fusions of `layers` (a model's, in order; `input` its per-sample input shape) and returns them.
std::vector<Fusion> plan_fusions(std::vector<std::unique_ptr<Layer>>& layers, const Shape& input,
                                 const FusionChoices& choices = {});

// "stem: 0 conv ... + 1 bn ...; relu mask: ..." for a model summary, one line per fusion.
std::vector<std::string> describe(const std::vector<Fusion>& fusions);

}  // namespace nt::layers
