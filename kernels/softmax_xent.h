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

#include "kernels/exec.h"

namespace nt::kernels {

namespace cpu {
void softmax_xent(const Exec& exec, const float* logits, const int32_t* labels, int B, int C, float* dlogits,
                  double* loss_sum, int64_t* correct);
void softmax_xent(const Exec& exec, const double* logits, const int32_t* labels, int B, int C, double* dlogits,
                  double* loss_sum, int64_t* correct);
}  // namespace cpu
namespace cuda {
void softmax_xent(const Exec& exec, const float* logits, const int32_t* labels, int B, int C, float* dlogits,
                  double* loss_sum, int64_t* correct);
}
inline void softmax_xent(const Exec& exec, const float* logits, const int32_t* labels, int B, int C,
                         float* dlogits, double* loss_sum, int64_t* correct) {
  NT_DISPATCH(exec, softmax_xent, logits, labels, B, C, dlogits, loss_sum, correct);
}

inline void softmax_xent(const Exec& exec, const double* logits, const int32_t* labels, int B, int C,
                         double* dlogits, double* loss_sum, int64_t* correct) {
  NT_CPU_ONLY(exec, softmax_xent, logits, labels, B, C, dlogits, loss_sum, correct);
}

}  // namespace nt::kernels
