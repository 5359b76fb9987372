// The loss seam between the engine and layers/ (SoftmaxCrossEntropy implements it).
#pragma once

#include "engine/tensor.h"

namespace nt {

// Device-resident running totals of an epoch: read back once per epoch, never per step.
struct LossTotals {
  Tensor loss_sum;   // (1) f64: Σ of the per-example losses
  Tensor correct;    // (1) i64: correctly classified samples
};

class Loss {
 public:
  virtual ~Loss() = default;
  // logits: (rows, classes); labels: (rows) i32. Adds to totals; writes dlogits (same shape as
  // logits) when it is given, the gradient of the batch-mean loss.
  virtual void apply(const kernels::Exec& exec, const Tensor& logits, const Tensor& labels, const Tensor* dlogits,
                     const LossTotals& totals) = 0;
};

}  // namespace nt
