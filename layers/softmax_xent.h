// SoftmaxCrossEntropy: the loss of every classifier here (PyTorch's nn.CrossEntropyLoss, mean reduction).
#pragma once

#include "engine/loss.h"

namespace nt::layers {

class SoftmaxCrossEntropy final : public Loss {
 public:
  // logits (rows, classes), labels (rows) i32; dlogits = (softmax - onehot) / rows when given.
  void apply(const kernels::Exec& exec, const Tensor& logits, const Tensor& labels, const Tensor* dlogits,
             const LossTotals& totals) override;
};

}  // namespace nt::layers
