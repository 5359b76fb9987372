// Optimizer updates. Parameters, gradients and optimizer state each live in one contiguous block of
// the model's arena, at the same offsets, so one launch updates every parameter of the model.
//
// SGD, PyTorch semantics (dampening 0, no Nesterov):
//   g = grad + weight_decay * p
//   v = momentum * v + g          (v starts at 0, so the first v is g, as PyTorch's clone of g)
//   p = p - lr * (momentum != 0 ? v : g)
// SgdArgs::velocity may be nullptr when momentum == 0.
//
// Adam / AdamW, PyTorch semantics (torch.optim.Adam / AdamW; amsgrad, maximize, foreach, capturable off):
//   Adam:  g = grad + weight_decay * p                 AdamW (decoupled): p = p * (1 - lr*weight_decay), g = grad
//   m = m.lerp(g, 1 - beta1)                           (= beta1*m + (1-beta1)*g)
//   v = beta2 * v + (1 - beta2) * g * g
//   bc1 = 1 - beta1^t     bc2 = 1 - beta2^t            (in double, from the step t)
//   p = p - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
// The step t comes from a device-resident counter (kernels/cuda/grid_counter.cuh): two zero-initialised
// uint64 words {value, done}; value = the steps taken so far. Each call uses t = value + 1 and leaves
// value = t, on both backends, so a captured CUDA graph replays with the right t every time. Every call
// advances the counter, n == 0 included. m and v are zero-initialised state blocks with the params'
// layout; padding (p = g = m = v = 0) stays exactly 0.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/dispatch.h"
#include "kernels/rounded.h"

namespace nt::kernels {

struct SgdHyper {
  float lr = 0.01f;
  float momentum = 0.f;
  float weight_decay = 0.f;
  const float* lr_scale = nullptr;  // device-resident factor on lr (a schedule), read at run time; nullptr = 1
};

// sgd_update reads every field; it writes params and velocity.
struct SgdArgs {
  size_t n = 0;                  // elements of every block below
  float* params = nullptr;       // (n)  read and written
  const float* grads = nullptr;  // (n)
  float* velocity = nullptr;     // (n)  read and written; nullptr (and never touched) when hyper.momentum == 0
  SgdHyper hyper;
};
// Its traffic and flops for the profiler, the same on both backends: p read and written, g read, v read and written;
// an FMA counts 2 flops (decay, momentum, step).
inline profile::OpCost sgd_update_cost(const SgdArgs& a) {
  const double n = double(a.n);
  const bool momentum = a.hyper.momentum != 0.f;
  return {n * 4 * (momentum ? 5 : 3), n * 2 * (1 + (momentum ? 1 : 0) + (a.hyper.weight_decay != 0 ? 1 : 0))};
}

namespace cpu {
void sgd_update(const Exec& exec, const SgdArgs& a);
}
namespace cuda {
void sgd_update(const Exec& exec, const SgdArgs& a);
}
inline void sgd_update(const Exec& exec, const SgdArgs& a) { dispatch<cpu::sgd_update, cuda::sgd_update>(exec, a); }

// Double, as PyTorch's Python floats: 1 - beta2 is formed in double and rounded once (0.001f, where
// 1 - 0.999f would give 0.00099998713f), and the bias corrections are computed in double.
struct AdamHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = false;           // decoupled = AdamW
  const float* lr_scale = nullptr;  // device-resident factor on lr (a schedule), read at run time; nullptr = 1
};

// The per-step scalars, computed from t exactly the same way by both backends (host and device code):
// beta^t by binary powering with explicitly rounded double multiplies (no pow(), whose last bit differs
// between libm and CUDA, and no FMA contraction), then one rounding to fp32 each.
struct AdamStepScalars {
  float step_size;  // lr / (1 - beta1^t)
  float bc2_sqrt;   // sqrt(1 - beta2^t)
};

NT_HOST_DEVICE inline double adam_power(double base, uint64_t t) {  // base^t, t >= 1
  double result = 1.0;
  while (t != 0) {
    if (t & 1u) result = mul_rn(result, base);
    base = mul_rn(base, base);
    t >>= 1;
  }
  return result;
}

NT_HOST_DEVICE inline AdamStepScalars adam_step_scalars(double lr, double beta1, double beta2, uint64_t t) {
  const double bc1 = 1.0 - adam_power(beta1, t);
  const double bc2 = 1.0 - adam_power(beta2, t);
#if defined(__CUDA_ARCH__)
  const double bc2_sqrt = ::sqrt(bc2);  // IEEE correctly rounded, as std::sqrt
#else
  const double bc2_sqrt = std::sqrt(bc2);
#endif
  return {static_cast<float>(lr / bc1), static_cast<float>(bc2_sqrt)};
}

// One element's Adam / AdamW step (the formulas above) with one step's scalars. Per element, in this order, every
// operation one correctly rounded fp32 operation, so every caller gets the same bits on either backend (adam_update's
// CPU loop and CUDA kernels, and the persistent mlp's update, kernels/persistent_mlp.h):
//   AdamW (wd != 0): p = p * decay                   decay = fp32(1 - lr*wd in double), as PyTorch's mul_
//   Adam  (wd != 0): g = fma(wd, p, grad)
//   d = g - m;  m = w < 0.5 ? fma(w, d, m) : fma(-d, 1 - w, g)         w = 1 - beta1: PyTorch's lerp_
//   v = fma((1 - beta2) * g, g, v * beta2)                             PyTorch's mul_(beta2).addcmul_
//   denom = sqrt(v) / bc2_sqrt + eps
//   p = fma(-step_size, m / denom, p)                                  PyTorch's addcdiv_
// With wd == 0 the decay term is skipped, as PyTorch does. Padding (p = g = m = v = 0) stays +0: d = 0, m = 0, v = 0,
// denom = eps, m / denom = 0, p = fma(-s, 0, 0) = +0.
struct AdamElementStep {
  float w, one_minus_w;  // lerp weight 1 - beta1, and 1 - w (used when w >= 0.5)
  float c2, beta2;       // 1 - beta2, beta2
  float eps;
  float wd;                   // Adam: coupled decay added to g (0 = none)
  float decay;                // AdamW: p *= decay, with this step's lr (1 = none)
  bool coupled, decoupled;    // which decay applies (neither when wd == 0)
  bool small_weight;          // w < 0.5: PyTorch's lerp branch
  float step_size, bc2_sqrt;  // this step's adam_step_scalars

  NT_HOST_DEVICE void apply(float& p, float g, float& m, float& v) const {
    if (decoupled) p = mul_rn(p, decay);
    if (coupled) g = fma_rn(wd, p, g);
    const float d = sub_rn(g, m);
    m = small_weight ? fma_rn(w, d, m) : fma_rn(-d, one_minus_w, g);
    v = fma_rn(mul_rn(c2, g), g, mul_rn(v, beta2));
    const float denom = add_rn(div_rn(sqrt_rn(v), bc2_sqrt), eps);
    p = fma_rn(-step_size, div_rn(m, denom), p);
  }
};

// Step t's scalars for hyperparameters h, lr being this step's (h.lr times the schedule's factor, where there is one).
NT_HOST_DEVICE inline AdamElementStep adam_element_step(const AdamHyper& h, double lr, uint64_t t) {
  AdamElementStep s{};
  s.w = static_cast<float>(1.0 - h.beta1);
  s.one_minus_w = 1.f - s.w;
  s.c2 = static_cast<float>(1.0 - h.beta2);
  s.beta2 = static_cast<float>(h.beta2);
  s.eps = static_cast<float>(h.eps);
  s.wd = static_cast<float>(h.weight_decay);
  // Without a schedule the decay is formed from the hyperparameters in double; with one, from this step's lr and the
  // fp32 decay (as the engine has always done).
  s.decay = h.lr_scale ? static_cast<float>(1.0 - lr * double(s.wd)) : static_cast<float>(1.0 - h.lr * h.weight_decay);
  s.coupled = h.weight_decay != 0 && !h.decoupled;
  s.decoupled = h.weight_decay != 0 && h.decoupled;
  s.small_weight = s.w < 0.5f;
  const AdamStepScalars scalars = adam_step_scalars(lr, h.beta1, h.beta2, t);
  s.step_size = scalars.step_size;
  s.bc2_sqrt = scalars.bc2_sqrt;
  return s;
}

// adam_update reads every field; it writes params, m, v and the step counter.
struct AdamArgs {
  size_t n = 0;                  // elements of every block below
  float* params = nullptr;       // (n)  read and written
  const float* grads = nullptr;  // (n)
  float* m = nullptr;            // (n)  first moment, read and written
  float* v = nullptr;            // (n)  second moment, read and written
  AdamHyper hyper;
  uint64_t* step = nullptr;  // (2) {value, done}: t = value + 1, left as value = t (every call, n == 0 included)
};

namespace cpu {
void adam_update(const Exec& exec, const AdamArgs& a);
}
namespace cuda {
void adam_update(const Exec& exec, const AdamArgs& a);
}
inline void adam_update(const Exec& exec, const AdamArgs& a) { dispatch<cpu::adam_update, cuda::adam_update>(exec, a); }

}  // namespace nt::kernels
