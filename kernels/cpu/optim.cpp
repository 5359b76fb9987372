// SGD and Adam/AdamW updates, CPU twin of kernels/cuda/optim.cu: one flat pass over the n parameters.
//
// params, grads, velocity: (n) contiguous fp32, at the same offsets; params and velocity updated in place.
// PyTorch semantics (dampening 0, no Nesterov), each multiply-add one fused, correctly rounded fmaf:
//   g = weight_decay != 0 ? fmaf(weight_decay, p, grad) : grad       g = grad + wd*p
//   v = fmaf(momentum, v, g)                                          v = momentum*v + g   (momentum != 0)
//   p = fmaf(-lr, momentum != 0 ? v : g, p)                           p = p - lr*v
// With momentum == 0 velocity is never read or written (it may be nullptr). With weight_decay == 0 the
// term is skipped, as PyTorch does (so an infinite p does not turn g into NaN through 0*inf).
// Why explicit fmaf: nvcc contracts a*b+c into an FMA by default and g++ (ISO mode, -ffp-contract=off)
// does not; writing the FMA in both backends makes them bit-identical, and the CUDA test demands it.
// fmaf is exact by definition, so the result does not depend on how it is computed: the loop is built
// twice (target_clones) and the machine picks the FMA-instruction clone, vectorized, when it has one,
// else the portable clone, which calls libm's (slower, equally exact) fmaf.
//
// Adam / AdamW (the formulas of kernels/optim.h), params, grads, m, v: (n) fp32 at the same offsets, p, m,
// v updated in place. step: {value, done}; this call uses t = value + 1 and stores value = t (done unused
// on the CPU, stays 0). Per element, in this order, every operation one correctly rounded fp32 operation
// (so the CUDA twin, which spells out the same operations, gives the same bits):
//   AdamW (wd != 0): p = p * decay                   decay = fp32(1 - lr*wd in double), as PyTorch's mul_
//   Adam  (wd != 0): g = fmaf(wd, p, grad)
//   d = g - m;  m = w < 0.5 ? fmaf(w, d, m) : fmaf(-d, 1 - w, g)      w = 1 - beta1: PyTorch's lerp_
//   v = fmaf((1 - beta2) * g, g, v * beta2)                             PyTorch's mul_(beta2).addcmul_
//   denom = sqrtf(v) / bc2_sqrt + eps
//   p = fmaf(-step_size, m / denom, p)                                  PyTorch's addcdiv_
// step_size and bc2_sqrt come once per call from adam_step_scalars (kernels/optim.h). With wd == 0 the
// decay term is skipped, as PyTorch does. Padding (p = g = m = v = 0) stays +0: d = 0, m = 0, v = 0,
// denom = eps, m / denom = 0, p = fmaf(-s, 0, 0) = +0.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/op_scope.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/optim.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define NT_CLONE_FOR_FMA __attribute__((target_clones("default", "fma")))
#else
#define NT_CLONE_FOR_FMA
#endif

namespace nt::kernels::cpu {

namespace {

// p, g, v: (n) one chunk; elementwise, so chunks are independent and the result does not depend on them.
NT_CLONE_FOR_FMA
void sgd_momentum_range(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ v, size_t n, float lr,
                        float momentum, float wd) {
  for (size_t i = 0; i < n; ++i) {
    float gi = wd != 0.f ? std::fma(wd, p[i], g[i]) : g[i];
    float vi = std::fma(momentum, v[i], gi);
    v[i] = vi;
    p[i] = std::fma(-lr, vi, p[i]);
  }
}

NT_CLONE_FOR_FMA
void sgd_plain_range(float* __restrict__ p, const float* __restrict__ g, size_t n, float lr, float wd) {
  for (size_t i = 0; i < n; ++i) {
    float gi = wd != 0.f ? std::fma(wd, p[i], g[i]) : g[i];
    p[i] = std::fma(-lr, gi, p[i]);
  }
}

// The scalars of one Adam call, the same for every element.
struct AdamConsts {
  float w, one_minus_w;  // lerp weight 1 - beta1, and 1 - w (used when w >= 0.5)
  float c2, beta2;       // 1 - beta2, beta2
  float eps;
  float wd;                 // Adam: coupled decay added to g (0 = none)
  float decay;              // AdamW: p *= decay (1 = none)
  bool coupled, decoupled;  // which decay applies (neither when wd == 0)
  bool small_weight;        // w < 0.5: PyTorch's lerp branch
  float step_size, bc2_sqrt;
};

// p, g, m, v: (n) one chunk; elementwise, so the result does not depend on the chunking.
NT_CLONE_FOR_FMA
void adam_range(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m, float* __restrict__ v,
                size_t n, const AdamConsts& c) {
  for (size_t i = 0; i < n; ++i) {
    float pi = p[i], gi = g[i];
    if (c.decoupled) pi = pi * c.decay;
    if (c.coupled) gi = std::fma(c.wd, pi, gi);
    const float d = gi - m[i];
    const float mi = c.small_weight ? std::fma(c.w, d, m[i]) : std::fma(-d, c.one_minus_w, gi);
    const float vi = std::fma(c.c2 * gi, gi, v[i] * c.beta2);
    const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
    p[i] = std::fma(-c.step_size, mi / denom, pi);
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void adam_update(const Exec& exec, const AdamArgs& a) {
  const size_t n = a.n;
  const AdamHyper& h = a.hyper;
  uint64_t* step = a.step;
  const uint64_t t = step[0] + 1;  // the counter's value is the number of steps taken so far
  if (n != 0) {
    const double N = double(n);
    // p, m, v read+written, g read; ~16 flops per element (FMAs count 2, sqrt and divisions 1).
    OpScope scope(exec, "adam_update", profile::OpCost{N * 4 * 7, N * 16});
    const double lr = h.lr_scale ? h.lr * double(*h.lr_scale) : h.lr;  // the schedule's factor (a host value here)
    const AdamStepScalars s = adam_step_scalars(lr, h.beta1, h.beta2, t);
    AdamConsts c{};
    c.w = static_cast<float>(1.0 - h.beta1);
    c.one_minus_w = 1.f - c.w;
    c.c2 = static_cast<float>(1.0 - h.beta2);
    c.beta2 = static_cast<float>(h.beta2);
    c.eps = static_cast<float>(h.eps);
    c.wd = static_cast<float>(h.weight_decay);
    c.decay =
        h.lr_scale ? static_cast<float>(1.0 - lr * double(c.wd)) : static_cast<float>(1.0 - h.lr * h.weight_decay);
    c.coupled = h.weight_decay != 0 && !h.decoupled;
    c.decoupled = h.weight_decay != 0 && h.decoupled;
    c.small_weight = c.w < 0.5f;
    c.step_size = s.step_size;
    c.bc2_sqrt = s.bc2_sqrt;

    parallel_chunks(exec.pool, n, [&](size_t begin, size_t count) {
      adam_range(a.params + begin, a.grads + begin, a.m + begin, a.v + begin, count, c);
    });
  }
  step[0] = t;  // every call advances the counter, n == 0 included (as the CUDA twin)
}

void sgd_update(const Exec& exec, const SgdArgs& a) {
  const size_t n = a.n;
  const SgdHyper& h = a.hyper;
  if (n == 0) return;
  const bool momentum = h.momentum != 0.f;
  OpScope scope(exec, "sgd_update", sgd_update_cost(a));
  const float lr = h.lr_scale ? h.lr * *h.lr_scale : h.lr;  // as the CUDA twin: one fp32 product

  parallel_chunks(exec.pool, n, [&](size_t begin, size_t count) {
    if (momentum)
      sgd_momentum_range(a.params + begin, a.grads + begin, a.velocity + begin, count, lr, h.momentum, h.weight_decay);
    else
      sgd_plain_range(a.params + begin, a.grads + begin, count, lr, h.weight_decay);
  });
}

}  // namespace nt::kernels::cpu
