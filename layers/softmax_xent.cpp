#include "layers/softmax_xent.h"

#include "kernels/softmax_xent.h"

namespace nt::layers {

void SoftmaxCrossEntropy::apply(const kernels::Exec& exec, const Tensor& logits, const Tensor& labels,
                                const Tensor* dlogits, const LossTotals& totals) {
  if (logits.shape().rank() != 2)
    throw Error(cat("softmax cross-entropy: expects logits (rows, classes), got ", logits.shape().str()));
  const auto rows = logits.shape()[0], classes = logits.shape()[1];
  if (labels.shape() != Shape{rows})
    throw Error(cat("softmax cross-entropy: ", rows, " rows of logits but labels ", labels.shape().str()));
  if (dlogits && dlogits->shape() != logits.shape())
    throw Error(cat("softmax cross-entropy: dlogits ", dlogits->shape().str(), " for logits ", logits.shape().str()));
  const int B = static_cast<int>(rows), C = static_cast<int>(classes);
  double* loss_sum = totals.loss_sum.data<double>();
  int64_t* correct = totals.correct.data<int64_t>();
  if (logits.dtype() == DType::f64)
    return kernels::softmax_xent(exec, logits.data<double>(), labels.i32(), B, C,
                                 dlogits ? dlogits->data<double>() : nullptr, loss_sum, correct);
  kernels::softmax_xent(exec, logits.f32(), labels.i32(), B, C, dlogits ? dlogits->f32() : nullptr, loss_sum,
                        correct);
}

}  // namespace nt::layers
