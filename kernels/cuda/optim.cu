// SGD and Adam/AdamW updates on the GPU: one launch for every parameter of the model (they are contiguous
// in the arena).
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
//
// Adam / AdamW (the formulas of kernels/optim.h): params, grads, m, v: (n) fp32 at the same offsets, p, m,
// v updated in place. Each element is AdamElementStep::apply (kernels/optim.h), the CPU twin's code, every
// operation an explicitly rounded intrinsic so nvcc contracts nothing; sqrt and division are IEEE round-to-nearest,
// so the two backends are expected to agree bit for bit (the CUDA test still allows a few ulp, see there).
// The step t is not an argument: it comes from the device counter `step` = {value, done}
// (kernels/cuda/grid_counter.cuh). Every block reads value at its start; thread 0 of each block turns
// t = value + 1 into the step's scalars (adam_element_step: beta^t in double, the CPU twin's code);
// the last block to finish stores value = t. So a replayed CUDA graph takes a new t every replay. Every
// call launches, n == 0 included (one block that only advances the counter), as the CPU twin advances.
// Launch: grid-stride over float4 when p, g, m, v are all 16-byte aligned (the n % 4 tail by the first
// threads), else one float per thread; at most 2048 blocks of 256, the rest strides.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/grid_counter.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/optim.h"

namespace nt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 2048;  // enough to fill an H100/H200 (132 SMs x 2048 threads); the rest strides

struct Hyper {
  float lr, momentum, wd;
  const float* lr_scale;  // nullable
};

// lr times the schedule's device-resident factor, read once per thread (a broadcast load).
__device__ __forceinline__ Hyper scheduled(Hyper h) {
  if (h.lr_scale) h.lr = __fmul_rn(h.lr, *h.lr_scale);
  return h;
}

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
                      int64_t n, Hyper h, StampRing stamps) {
  begin_dependent_kernel(stamps);
  h = scheduled(h);
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
                           int64_t n, Hyper h, StampRing stamps) {
  begin_dependent_kernel(stamps);
  h = scheduled(h);
  h = scheduled(h);
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
    launch(exec, "sgd_update", cost, sgd_update_vec4_kernel<kMomentum>, grid_for(n / 4 + 1), dim3(kThreads), 0, params,
           grads, velocity, n, h);
  else
    launch(exec, "sgd_update", cost, sgd_update_kernel<kMomentum>, grid_for(n), dim3(kThreads), 0, params, grads,
           velocity, n, h);
}

// ---- Adam ----------------------------------------------------------------------------------------------

// Every block: read the step counter (value = steps so far), thread 0 computes this step's scalars
// (adam_element_step, the CPU twin's code).
__device__ __forceinline__ AdamElementStep adam_begin(const uint64_t* step, const AdamHyper& h, uint64_t& value) {
  __shared__ AdamElementStep shared_step;
  value = grid_counter_begin(step);
  if (threadIdx.x == 0) shared_step = adam_element_step(h, h.lr_scale ? h.lr * double(*h.lr_scale) : h.lr, value + 1);
  __syncthreads();
  return shared_step;
}

// p, g, m, v: (n) fp32; one element per thread per stride. step: {value, done}, advanced by the last block.
__global__ void __launch_bounds__(kThreads)
    adam_update_kernel(float* __restrict__ params, const float* __restrict__ grads, float* __restrict__ m,
                       float* __restrict__ v, int64_t n, AdamHyper h, uint64_t* step, StampRing stamps) {
  begin_dependent_kernel(stamps);
  uint64_t value;
  const AdamElementStep s = adam_begin(step, h, value);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float p = params[i], mi = m[i], vi = v[i];
    s.apply(p, grads[i], mi, vi);
    params[i] = p;
    m[i] = mi;
    v[i] = vi;
  }
  grid_counter_end(step, value);  // no thread returned early: all of them reach the barrier inside
}

// p, g, m, v: (n) fp32, 16-byte aligned; one float4 per thread per stride, then the n % 4 tail.
__global__ void __launch_bounds__(kThreads)
    adam_update_vec4_kernel(float* __restrict__ params, const float* __restrict__ grads, float* __restrict__ m,
                            float* __restrict__ v, int64_t n, AdamHyper h, uint64_t* step, StampRing stamps) {
  begin_dependent_kernel(stamps);
  uint64_t value;
  const AdamElementStep s = adam_begin(step, h, value);
  const int64_t n4 = n / 4;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float4* p4 = reinterpret_cast<float4*>(params);
  const float4* g4 = reinterpret_cast<const float4*>(grads);
  float4* m4 = reinterpret_cast<float4*>(m);
  float4* v4 = reinterpret_cast<float4*>(v);
  for (int64_t i = tid; i < n4; i += stride) {
    float4 p = p4[i], mi = m4[i], vi = v4[i];
    const float4 g = g4[i];
    s.apply(p.x, g.x, mi.x, vi.x);
    s.apply(p.y, g.y, mi.y, vi.y);
    s.apply(p.z, g.z, mi.z, vi.z);
    s.apply(p.w, g.w, mi.w, vi.w);
    p4[i] = p;
    m4[i] = mi;
    v4[i] = vi;
  }
  const int64_t tail = n4 * 4 + tid;  // the last n % 4 elements
  if (tail < n) {
    float p = params[tail], mi = m[tail], vi = v[tail];
    s.apply(p, grads[tail], mi, vi);
    params[tail] = p;
    m[tail] = mi;
    v[tail] = vi;
  }
  grid_counter_end(step, value);
}

}  // namespace

void adam_update(const Exec& exec, const AdamArgs& a) {
  const size_t n = a.n;
  const AdamHyper& h = a.hyper;
  const double N = double(n);
  // p, m, v read+written, g read; ~16 flops per element (FMAs count 2, sqrt and divisions 1).
  const profile::OpCost cost{N * 4 * 7, N * 16};
  const int64_t count = static_cast<int64_t>(n);
  // Launched even for n == 0 (grid_for gives one block): the call must still advance the step counter.
  const bool vec = aligned16(a.params) && aligned16(a.grads) && aligned16(a.m) && aligned16(a.v);
  if (vec)
    launch(exec, "adam_update", cost, adam_update_vec4_kernel, grid_for(count / 4 + 1), dim3(kThreads), 0, a.params,
           a.grads, a.m, a.v, count, h, a.step);
  else
    launch(exec, "adam_update", cost, adam_update_kernel, grid_for(count), dim3(kThreads), 0, a.params, a.grads, a.m,
           a.v, count, h, a.step);
}

void sgd_update(const Exec& exec, const SgdArgs& a) {
  const size_t n = a.n;
  const SgdHyper& h = a.hyper;
  if (n == 0) return;
  const bool momentum = h.momentum != 0.f;
  const profile::OpCost cost = sgd_update_cost(a);
  const Hyper hyper{h.lr, h.momentum, h.weight_decay, h.lr_scale};
  const int64_t count = static_cast<int64_t>(n);
  if (momentum)
    launch_sgd<true>(exec, cost, a.params, a.grads, a.velocity, count, hyper);
  else
    launch_sgd<false>(exec, cost, a.params, a.grads, nullptr, count, hyper);
}

}  // namespace nt::kernels::cuda
