// SGD update, CPU twin of kernels/cuda/optim.cu: one flat pass over the n parameters of the model.
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

constexpr size_t kChunk = size_t(1) << 16;  // elements per parallel task: ~256 KB of each array

// p, g, v: (n) one chunk; elementwise, so chunks are independent and the result does not depend on them.
NT_CLONE_FOR_FMA
void sgd_momentum_range(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ v, size_t n,
                        float lr, float momentum, float wd) {
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

}  // namespace

void sgd_update(const Exec& exec, float* params, const float* grads, float* velocity, size_t n, const SgdHyper& h) {
  if (n == 0) return;
  const bool momentum = h.momentum != 0.f;
  const double N = double(n);
  // p read+written, g read, v read+written; an FMA counts 2 flops (decay, momentum, step).
  profile::OpCost cost{N * 4 * (momentum ? 5 : 3), N * 2 * (1 + (momentum ? 1 : 0) + (h.weight_decay != 0.f ? 1 : 0))};
  OpScope scope(exec, "sgd_update", cost);

  const int64_t tasks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
  parallel_for(exec.pool, tasks, [&](int64_t t) {
    size_t begin = static_cast<size_t>(t) * kChunk;
    size_t count = std::min(kChunk, n - begin);
    if (momentum)
      sgd_momentum_range(params + begin, grads + begin, velocity + begin, count, h.lr, h.momentum, h.weight_decay);
    else
      sgd_plain_range(params + begin, grads + begin, count, h.lr, h.weight_decay);
  });
}

}  // namespace nt::kernels::cpu
