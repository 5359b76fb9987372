// SoftmaxCrossEntropy: the loss of every classifier here (PyTorch's nn.CrossEntropyLoss, mean reduction).
#pragma once

#include "engine/loss.h"

namespace nt::layers {

class SoftmaxCrossEntropy final : public Loss {
 public:
  // logits (rows, classes), labels (rows) i32; dlogits = (softmax - onehot) / rows when given.
  void apply(const kernels::Exec& exec, const Tensor& logits, const Tensor& labels, const Tensor* dlogits,
             const LossTotals& totals) override;
  // A last Linear without ReLU that the fused op serves (kernels::classifier_head_fits): the classifier head.
  bool fuses(const Layer& last) const override;
  void apply_fused(const kernels::Exec& exec, Layer& last, const Tensor& x, const Tensor& logits, const Tensor& labels,
                   const Tensor* dlogits, const Tensor* dx, const LossTotals& totals) override;
};

}  // namespace nt::layers
