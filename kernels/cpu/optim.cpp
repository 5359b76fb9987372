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
// on the CPU, stays 0). Each element is AdamElementStep::apply (kernels/optim.h), every operation one correctly
// rounded fp32 operation, with this call's scalars from adam_element_step, so the CUDA twin gives the same bits.
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

// p, g, m, v: (n) one chunk; elementwise, so the result does not depend on the chunking.
NT_CLONE_FOR_FMA
void adam_range(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m, float* __restrict__ v,
                size_t n, const AdamElementStep& s) {
  for (size_t i = 0; i < n; ++i) {
    float pi = p[i], mi = m[i], vi = v[i];
    s.apply(pi, g[i], mi, vi);
    p[i] = pi;
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
    const AdamElementStep s = adam_element_step(h, lr, t);
    parallel_chunks(exec.pool, n, [&](size_t begin, size_t count) {
      adam_range(a.params + begin, a.grads + begin, a.m + begin, a.v + begin, count, s);
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
