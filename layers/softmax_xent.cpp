#include "layers/softmax_xent.h"

#include "kernels/softmax_xent.h"
#include "layers/linear.h"

namespace nt::layers {

namespace {
void check_shapes(const Tensor& logits, const Tensor& labels, const Tensor* dlogits) {
  if (logits.shape().rank() != 2)
    throw Error(cat("softmax cross-entropy: expects logits (rows, classes), got ", logits.shape().str()));
  const auto rows = logits.shape()[0];
  if (labels.shape() != Shape{rows})
    throw Error(cat("softmax cross-entropy: ", rows, " rows of logits but labels ", labels.shape().str()));
  if (dlogits && dlogits->shape() != logits.shape())
    throw Error(cat("softmax cross-entropy: dlogits ", dlogits->shape().str(), " for logits ", logits.shape().str()));
}
}  // namespace

void SoftmaxCrossEntropy::apply(const kernels::Exec& exec, const Tensor& logits, const Tensor& labels,
                                const Tensor* dlogits, const LossTotals& totals) {
  check_shapes(logits, labels, dlogits);
  const auto rows = logits.shape()[0], classes = logits.shape()[1];
  const int B = static_cast<int>(rows), C = static_cast<int>(classes);
  auto run = [&]<class T>(T /*element type*/) {
    kernels::softmax_xent(exec, kernels::SoftmaxXentArgs<T>{.B = B,
                                                            .C = C,
                                                            .logits = logits.data<T>(),
                                                            .labels = labels.i32(),
                                                            .dlogits = dlogits ? dlogits->data<T>() : nullptr,
                                                            .loss_sum = totals.loss_sum.data<double>(),
                                                            .correct = totals.correct.data<int64_t>()});
  };
  logits.dtype() == DType::f64 ? run(0.0) : run(0.f);
}

bool SoftmaxCrossEntropy::fuses(const Layer& last) const {
  const auto* linear = dynamic_cast<const Linear*>(&last);
  return linear && linear->fits_classifier_head();
}

void SoftmaxCrossEntropy::apply_fused(const kernels::Exec& exec, Layer& last, const Tensor& x, const Tensor& logits,
                                      const Tensor& labels, const Tensor* dlogits, const Tensor* dx,
                                      const LossTotals& totals) {
  NT_CHECK(fuses(last), "softmax cross-entropy cannot absorb layer ", last.sequential_index, " (", last.describe(),
           ")");
  check_shapes(logits, labels, dlogits);
  static_cast<Linear&>(last).classifier_head(exec, x, logits, labels, dlogits, dx, totals);
}

}  // namespace nt::layers
