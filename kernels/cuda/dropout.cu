// Dropout on the GPU (the contract is in kernels/dropout.h; CPU twin kernels/cpu/dropout.cpp).
//
//   forward:  mask[i] = dropout_uniform(seed, draw, i) >= p;  y[i] = (x[i] * mask[i]) / (1 - p)
//   backward: dx[i] = (dy[i] * mask[i]) / (1 - p)
// x, y, dy, dx: (n) fp32, written (=), in place allowed (y == x, dx == dy: each thread reads its elements
// before writing them, hence no __restrict__ on those); mask: (n) bytes 0/1, written (=).
// keep = 1.f - p, computed on the host by the same expression as the CPU twin; the product by the 0/1 mask
// and the IEEE division are explicitly rounded (__fmul_rn, __fdiv_rn) and the hash is integer arithmetic
// shared with the host, so both backends give the same mask, y and dx bit for bit.
// draw is not an argument: every block reads the device counter {value, done} at its start and the last
// block to finish stores value + 1 (kernels/cuda/grid_counter.cuh), so each call, and each replay of a
// captured graph, draws a fresh mask. The forward launches even for n == 0 (one block that only advances
// the counter), as the CPU twin advances it on every call.
//
// Launch: grid-stride, one float4 (and 4 mask bytes as one uchar4) per thread per stride when x, y (dy,
// dx) are 16-byte and mask 4-byte aligned, with the n % 4 tail done by the first threads; else one element
// per thread. At most 2048 blocks of 256 threads; elementwise, so the result does not depend on the grid.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/grid_counter.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/dropout.h"

namespace nt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 2048;  // enough to fill an H100/H200 (132 SMs x 2048 threads); the rest strides

struct DropoutScalars {
  float p, keep_p;  // drop probability, 1 - p
  uint64_t seed;
};

// (d * keep) / keep_p, a product by 0 or 1 and a correctly rounded division: the CPU twin's arithmetic.
__device__ __forceinline__ float masked(float d, unsigned char keep, float keep_p) {
  return __fdiv_rn(__fmul_rn(d, keep ? 1.f : 0.f), keep_p);
}

// One element: returns the mask byte and writes y.
__device__ __forceinline__ unsigned char dropout_one(float x, float& y, uint64_t key, uint64_t i,
                                                     const DropoutScalars& a) {
  const unsigned char keep = dropout_uniform_keyed(key, i) >= a.p ? 1 : 0;
  y = masked(x, keep, a.keep_p);
  return keep;
}

// x, y: (n) fp32; mask: (n) bytes; counter: {value, done}. One element per thread per stride.
__global__ void __launch_bounds__(kThreads)
    dropout_forward_kernel(const float* x, float* y, uint8_t* __restrict__ mask, int64_t n, DropoutScalars a,
                           uint64_t* counter, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const uint64_t draw = grid_counter_begin(counter);
  const uint64_t key = dropout_key(a.seed, draw);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float out;
    mask[i] = dropout_one(x[i], out, key, uint64_t(i), a);
    y[i] = out;
  }
  grid_counter_end(counter, draw);  // no thread returned early: all of them reach the barrier inside
}

// The same with x, y 16-byte and mask 4-byte aligned: one float4 + uchar4 per thread per stride, then the
// n % 4 tail.
__global__ void __launch_bounds__(kThreads)
    dropout_forward_vec4_kernel(const float* x, float* y, uint8_t* __restrict__ mask, int64_t n, DropoutScalars a,
                                uint64_t* counter, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const uint64_t draw = grid_counter_begin(counter);
  const uint64_t key = dropout_key(a.seed, draw);
  const int64_t n4 = n / 4;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float4* y4 = reinterpret_cast<float4*>(y);
  uchar4* mask4 = reinterpret_cast<uchar4*>(mask);
  for (int64_t i = tid; i < n4; i += stride) {
    const float4 u = x4[i];
    const uint64_t e = uint64_t(i) * 4;  // the element index of u.x
    float4 out;
    uchar4 keep;
    keep.x = dropout_one(u.x, out.x, key, e, a);
    keep.y = dropout_one(u.y, out.y, key, e + 1, a);
    keep.z = dropout_one(u.z, out.z, key, e + 2, a);
    keep.w = dropout_one(u.w, out.w, key, e + 3, a);
    y4[i] = out;
    mask4[i] = keep;
  }
  const int64_t tail = n4 * 4 + tid;  // the last n % 4 elements
  if (tail < n) {
    float out;
    mask[tail] = dropout_one(x[tail], out, key, uint64_t(tail), a);
    y[tail] = out;
  }
  grid_counter_end(counter, draw);
}

// dy, dx: (n) fp32; mask: (n) bytes. One element per thread per stride.
__global__ void __launch_bounds__(kThreads)
    dropout_backward_kernel(const float* dy, const uint8_t* __restrict__ mask, float* dx, int64_t n, float keep_p,
                            StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dx[i] = masked(dy[i], mask[i], keep_p);
}

// dy, dx 16-byte and mask 4-byte aligned: one float4 + uchar4 per thread per stride, then the n % 4 tail.
__global__ void __launch_bounds__(kThreads)
    dropout_backward_vec4_kernel(const float* dy, const uint8_t* __restrict__ mask, float* dx, int64_t n, float keep_p,
                                 StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int64_t n4 = n / 4;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const float4* dy4 = reinterpret_cast<const float4*>(dy);
  const uchar4* mask4 = reinterpret_cast<const uchar4*>(mask);
  float4* dx4 = reinterpret_cast<float4*>(dx);
  for (int64_t i = tid; i < n4; i += stride) {
    const float4 d = dy4[i];
    const uchar4 k = mask4[i];
    dx4[i] =
        float4{masked(d.x, k.x, keep_p), masked(d.y, k.y, keep_p), masked(d.z, k.z, keep_p), masked(d.w, k.w, keep_p)};
  }
  const int64_t tail = n4 * 4 + tid;  // the last n % 4 elements
  if (tail < n) dx[tail] = masked(dy[tail], mask[tail], keep_p);
}

bool aligned(const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

dim3 grid_for(int64_t items) {
  return dim3(static_cast<unsigned>(std::clamp<int64_t>(div_up<int64_t>(items, kThreads), 1, kMaxBlocks)));
}

// The CPU twin's keep_probability<float>: the same expression, so the same fp32 number.
float keep_probability(float p) { return 1.f - p; }

}  // namespace

void dropout_forward(const Exec& exec, const DropoutArgs<float>& a) {
  const size_t n = a.n;
  // x read, y written, mask written; a hash (~12 integer ops), a multiply and a division per element.
  const profile::OpCost cost{double(n) * 9, double(n) * 2};
  const DropoutScalars scalars{a.p, keep_probability(a.p), a.seed};
  const int64_t count = static_cast<int64_t>(n);
  // Launched even for n == 0 (grid_for gives one block): the call must still advance the counter.
  if (aligned(a.x, 16) && aligned(a.y, 16) && aligned(a.mask, 4))
    launch(exec, "dropout_forward", cost, dropout_forward_vec4_kernel, grid_for(count / 4 + 1), dim3(kThreads), 0, a.x,
           a.y, a.mask, count, scalars, a.counter);
  else
    launch(exec, "dropout_forward", cost, dropout_forward_kernel, grid_for(count), dim3(kThreads), 0, a.x, a.y, a.mask,
           count, scalars, a.counter);
}

void dropout_backward(const Exec& exec, const DropoutArgs<float>& a) {
  const size_t n = a.n;
  if (n == 0) return;
  const profile::OpCost cost{double(n) * 9, double(n) * 2};  // dy, mask read, dx written; a multiply, a division
  const float keep_p = keep_probability(a.p);
  const int64_t count = static_cast<int64_t>(n);
  if (aligned(a.dy, 16) && aligned(a.dx, 16) && aligned(a.mask, 4))
    launch(exec, "dropout_backward", cost, dropout_backward_vec4_kernel, grid_for(count / 4 + 1), dim3(kThreads), 0,
           a.dy, a.mask, a.dx, count, keep_p);
  else
    launch(exec, "dropout_backward", cost, dropout_backward_kernel, grid_for(count), dim3(kThreads), 0, a.dy, a.mask,
           a.dx, count, keep_p);
}

}  // namespace nt::kernels::cuda
