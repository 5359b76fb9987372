// Fused softmax cross-entropy: loss, accuracy count and logits gradient in one pass over the logits.
//
// logits (B,C) row-major, labels (B) int32 in [0,C). Per row b, with a stable log-sum-exp:
//   loss_b = logsumexp(logits_b) - logits_b[label_b]
//   dlogits[b,c] = (softmax(logits_b)[c] - [c == label_b]) / B        written (=) when dlogits != nullptr
// Accumulated (+=) into device- (or host-, on the CPU) resident counters, so a whole epoch needs no readback:
//   *loss_sum += Σ_b loss_b                the summed per-row loss, reduced over b in a fixed order
//                                          (a sum, not a mean, so that batches of different sizes add up
//                                          to an exact per-example mean at the end of an epoch)
//   *correct  += #{b : argmax_c logits_b == label_b}   ties take the lowest index, as torch.argmax
#pragma once

#include <cstdint>

#include "kernels/dispatch.h"

namespace nt::kernels {

template <class T>
struct SoftmaxXentArgs {
  int B = 0, C = 0;
  const T* logits = nullptr;        // (B, C)
  const int32_t* labels = nullptr;  // (B), in [0, C)
  T* dlogits = nullptr;             // (B, C); nullptr: the loss and the count only
  double* loss_sum = nullptr;       // (1), accumulated
  int64_t* correct = nullptr;       // (1), accumulated
};

namespace cpu {
template <class T>
void softmax_xent(const Exec& exec, const SoftmaxXentArgs<T>& a);  // float, double
}  // namespace cpu
namespace cuda {
void softmax_xent(const Exec& exec, const SoftmaxXentArgs<float>& a);
}  // namespace cuda

template <class T>
void softmax_xent(const Exec& exec, const SoftmaxXentArgs<T>& a) {
  dispatch<cpu::softmax_xent<T>, cuda::softmax_xent>(exec, a);
}

}  // namespace nt::kernels
