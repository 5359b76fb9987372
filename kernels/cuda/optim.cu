// SGD update on the GPU: one launch for every parameter of the model (they are contiguous in the arena).
//
// params, grads, velocity: (n) contiguous fp32, at the same offsets; params and velocity updated in place.
// PyTorch semantics (dampening 0, no Nesterov), each multiply-add one explicit, correctly rounded FMA:
//   g = weight_decay != 0 ? fmaf(weight_decay, p, grad) : grad       g = grad + wd*p
//   v = fmaf(momentum, v, g)                                          v = momentum*v + g   (momentum != 0)
//   p = fmaf(-lr, momentum != 0 ? v : g, p)                           p = p - lr*v
// With momentum == 0 the kernel never reads or writes velocity (it may be nullptr). With weight_decay == 0
// the term is skipped, as PyTorch does. The explicit FMAs (__fmaf_rn, never left to nvcc's contraction)
// are the CPU twin's std::fma, so the two backends are bit-identical.
//
// Launch: grid-stride over float4 when params, grads (and velocity, when used) are 16-byte aligned —
// the arena aligns them, so this is the path in training — with the n % 4 tail done by the first threads;
// otherwise one float per thread. Elementwise, so the result does not depend on the launch shape.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/optim.h"

namespace nt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 2048;  // enough to fill an H100/H200 (132 SMs x 2048 threads); the rest strides

struct Hyper {
  float lr, momentum, wd;
};

template <bool kMomentum>
__device__ __forceinline__ void sgd_step(float& p, float g, float* v, const Hyper& h) {
  float gi = h.wd != 0.f ? __fmaf_rn(h.wd, p, g) : g;
  if constexpr (kMomentum) {
    float vi = __fmaf_rn(h.momentum, *v, gi);
    *v = vi;
    p = __fmaf_rn(-h.lr, vi, p);
  } else {
    p = __fmaf_rn(-h.lr, gi, p);
  }
}

// p, g, v: (n) fp32; one element per thread per stride. velocity unused (may be nullptr) without momentum.
template <bool kMomentum>
__global__ void __launch_bounds__(kThreads)
    sgd_update_kernel(float* __restrict__ params, const float* __restrict__ grads, float* __restrict__ velocity,
                      int64_t n, Hyper h) {
  begin_dependent_kernel();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float p = params[i];
    sgd_step<kMomentum>(p, grads[i], kMomentum ? &velocity[i] : nullptr, h);
    params[i] = p;
  }
}

// p, g, v: (n) fp32, 16-byte aligned; one float4 per thread per stride, then the n % 4 tail.
template <bool kMomentum>
__global__ void __launch_bounds__(kThreads)
    sgd_update_vec4_kernel(float* __restrict__ params, const float* __restrict__ grads, float* __restrict__ velocity,
                           int64_t n, Hyper h) {
  begin_dependent_kernel();
  const int64_t n4 = n / 4;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float4* p4 = reinterpret_cast<float4*>(params);
  const float4* g4 = reinterpret_cast<const float4*>(grads);
  float4* v4 = reinterpret_cast<float4*>(velocity);
  for (int64_t i = tid; i < n4; i += stride) {
    float4 p = p4[i];
    const float4 g = g4[i];
    float4 v = kMomentum ? v4[i] : float4{};
    sgd_step<kMomentum>(p.x, g.x, &v.x, h);
    sgd_step<kMomentum>(p.y, g.y, &v.y, h);
    sgd_step<kMomentum>(p.z, g.z, &v.z, h);
    sgd_step<kMomentum>(p.w, g.w, &v.w, h);
    p4[i] = p;
    if (kMomentum) v4[i] = v;
  }
  const int64_t tail = n4 * 4 + tid;  // the last n % 4 elements
  if (tail < n) {
    float p = params[tail];
    sgd_step<kMomentum>(p, grads[tail], kMomentum ? &velocity[tail] : nullptr, h);
    params[tail] = p;
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

dim3 grid_for(int64_t items) {
  return dim3(static_cast<unsigned>(std::clamp<int64_t>(div_up<int64_t>(items, kThreads), 1, kMaxBlocks)));
}

template <bool kMomentum>
void launch_sgd(const Exec& exec, const profile::OpCost& cost, float* params, const float* grads, float* velocity,
                int64_t n, const Hyper& h) {
  const bool vec = aligned16(params) && aligned16(grads) && (!kMomentum || aligned16(velocity));
  if (vec)
    launch(exec, "sgd_update", cost, sgd_update_vec4_kernel<kMomentum>, grid_for(n / 4 + 1), dim3(kThreads), 0,
           params, grads, velocity, n, h);
  else
    launch(exec, "sgd_update", cost, sgd_update_kernel<kMomentum>, grid_for(n), dim3(kThreads), 0, params, grads,
           velocity, n, h);
}

}  // namespace

void sgd_update(const Exec& exec, float* params, const float* grads, float* velocity, size_t n, const SgdHyper& h) {
  if (n == 0) return;
  const bool momentum = h.momentum != 0.f;
  const double N = double(n);
  // p read+written, g read, v read+written; an FMA counts 2 flops (decay, momentum, step).
  profile::OpCost cost{N * 4 * (momentum ? 5 : 3), N * 2 * (1 + (momentum ? 1 : 0) + (h.weight_decay != 0.f ? 1 : 0))};
  const Hyper hyper{h.lr, h.momentum, h.weight_decay};
  const int64_t count = static_cast<int64_t>(n);
  if (momentum)
    launch_sgd<true>(exec, cost, params, grads, velocity, count, hyper);
  else
    launch_sgd<false>(exec, cost, params, grads, nullptr, count, hyper);
}

}  // namespace nt::kernels::cuda
