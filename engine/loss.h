// The loss seam between the engine and layers/ (SoftmaxCrossEntropy implements it).
#pragma once

#include "engine/layer.h"
#include "engine/tensor.h"

namespace nt {

// Device-resident running totals of an epoch: read back once per epoch, never per step.
struct LossTotals {
  Tensor loss_sum;  // (1) f64: Σ of the per-example losses
  Tensor correct;   // (1) i64: correctly classified samples
};

class Loss {
 public:
  virtual ~Loss() = default;
  // logits: (rows, classes); labels: (rows) i32. Adds to totals; writes dlogits (same shape as
  // logits) when it is given, the gradient of the batch-mean loss.
  virtual void apply(const kernels::Exec& exec, const Tensor& logits, const Tensor& labels, const Tensor* dlogits,
                     const LossTotals& totals) = 0;

  // Fusion with the model's last layer, negotiated once by the trainer. A loss that can run `last`'s forward
  // and backward together with its own pass (softmax cross-entropy after a Linear: the classifier head, one
  // launch on the GPU instead of four) returns true; the trainer then runs the layers before `last`, then
  // apply_fused, then (training) the layers before `last` backward.
  virtual bool fuses(const Layer& last) const {
    (void)last;
    return false;
  }
  // x: `last`'s input (rows, ...), logits: its output. Training passes dlogits, and dx unless `last` is the
  // first layer, and `last`'s parameter gradients are written (=); evaluation passes neither.
  virtual void apply_fused(const kernels::Exec& /*exec*/, Layer& /*last*/, const Tensor& /*x*/,
                           const Tensor& /*logits*/, const Tensor& /*labels*/, const Tensor* /*dlogits*/,
                           const Tensor* /*dx*/, const LossTotals& /*totals*/) {
    throw Error("this loss fuses no layer (apply_fused without fuses)");
  }
};

}  // namespace nt
