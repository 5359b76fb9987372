// Optimizer updates. Parameters, gradients and optimizer state each live in one contiguous block of
// the model's arena, at the same offsets, so one launch updates every parameter of the model.
//
// SGD, PyTorch semantics (dampening 0, no Nesterov):
//   g = grad + weight_decay * p
//   v = momentum * v + g          (v starts at 0, so the first v is g, as PyTorch's clone of g)
//   p = p - lr * (momentum != 0 ? v : g)
// velocity may be nullptr when momentum == 0.
#pragma once

#include <cstddef>

#include "kernels/exec.h"

namespace nt::kernels {

struct SgdHyper {
  float lr = 0.01f;
  float momentum = 0.f;
  float weight_decay = 0.f;
};

namespace cpu {
void sgd_update(const Exec& exec, float* params, const float* grads, float* velocity, size_t n, const SgdHyper& h);
}
namespace cuda {
void sgd_update(const Exec& exec, float* params, const float* grads, float* velocity, size_t n, const SgdHyper& h);
}
inline void sgd_update(const Exec& exec, float* params, const float* grads, float* velocity, size_t n,
                       const SgdHyper& h) {
  NT_DISPATCH(exec, sgd_update, params, grads, velocity, n, h);
}

}  // namespace nt::kernels
