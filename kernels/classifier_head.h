// The classifier head: a model's last Linear and the softmax cross-entropy after it, forward and backward,
// as one op (on the GPU one launch, where the unfused path takes four: the Linear's GEMM, softmax_xent,
// the weight-gradient GEMM and the input-gradient GEMM; at the mlp's batch 64 each of them is a few
// microseconds of launch latency around almost no work).
//
//   x (B,K) the head's input        W (C,K)  b (C) or none        labels (B) int32 in [0,C)
//   logits  = x·Wᵀ + b                                             (B,C)  written (=)
//   softmax cross-entropy of the logits, as kernels/softmax_xent.h:
//     *loss_sum += Σ_b loss_b,  *correct += #{b : argmax logits_b == label_b},
//     dlogits = (softmax - onehot) / B                             (B,C)  written (=), with the backward
// backward (when dweight != nullptr; Linear's backward with dy = dlogits):
//   dW = dlogitsᵀ·x (C,K),  db = Σ_b dlogits_b (C) when given,  dx = dlogits·W (B,K) when given,
//   dx selected by (x > 0) with mask_dx (the previous layer ended in a ReLU whose output is x).
// Evaluation passes dlogits = dweight = dbias = dx = nullptr: logits, loss and count only.
//
// Backends: the CPU twin is the composition of the unfused ops (gemm, softmax_xent, gemm, gemm) in the
// order Linear and SoftmaxCrossEntropy run them, so a CPU run gives the same bits fused or not. The CUDA
// kernel (kernels/cuda/classifier_head.cu) sums in its own fixed order: same results within fp32 rounding,
// bit-reproducible run to run. It serves C <= kHeadMaxClasses (a lane per class) and a weight gradient that
// fits a block's shared memory; a layer beyond that keeps the unfused path (classifier_head_fits).
#pragma once

#include <cstdint>

#include "kernels/dispatch.h"

namespace nt::kernels {

inline constexpr int kHeadMaxClasses = 32;
inline constexpr int64_t kHeadMaxSharedBytes = 200 * 1024;  // the CUDA block's partial dW and db, (C·K + C) floats

struct ClassifierHeadArgs {
  int B = 0, K = 0, C = 0;
  const float* x = nullptr;         // (B,K)
  const float* weight = nullptr;    // (C,K)
  const float* bias = nullptr;      // (C) or nullptr
  const int32_t* labels = nullptr;  // (B)
  float* logits = nullptr;          // (B,C)
  double* loss_sum = nullptr;       // (1) accumulated
  int64_t* correct = nullptr;       // (1) accumulated
  // backward: all nullptr in evaluation; dweight and dlogits together, dbias iff bias, dx optional
  float* dlogits = nullptr;  // (B,C)
  float* dweight = nullptr;  // (C,K)
  float* dbias = nullptr;    // (C)
  float* dx = nullptr;       // (B,K)
  bool mask_dx = false;      // dx = x > 0 ? dlogits·W : 0
};

// Whether the fused op serves a head of K inputs and C classes (the CUDA kernel's limits).
inline bool classifier_head_fits(int classes, int inputs) {
  return classes >= 1 && classes <= kHeadMaxClasses && inputs >= 1 &&
         (int64_t(classes) * inputs + classes) * 4 <= kHeadMaxSharedBytes;
}

// The op's own invariants (sizes, which outputs come together), checked by both backends: nt::Error.
void check_classifier_head(const ClassifierHeadArgs& h);

// The unfused ops in sequence on exec's backend: the CPU twin, and the CUDA op's path where its kernel
// cannot run (no thread-block clusters).
void classifier_head_unfused(const Exec& exec, const ClassifierHeadArgs& h);

namespace cpu {
void classifier_head(const Exec& exec, const ClassifierHeadArgs& h);
}
namespace cuda {
void classifier_head(const Exec& exec, const ClassifierHeadArgs& h);
}
inline void classifier_head(const Exec& exec, const ClassifierHeadArgs& h) {
  dispatch<cpu::classifier_head, cuda::classifier_head>(exec, h);
}

}  // namespace nt::kernels
