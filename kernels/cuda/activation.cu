// Standalone ReLU on the GPU (Linear fuses its ReLU into the GEMM epilogues; this serves the other layers).
//
//   relu_forward:  y[i]  = x[i] < 0 ? 0 : x[i]      (n) fp32, written (=); y == x allowed (in place)
//   relu_backward: dx[i] = y[i] > 0 ? dy[i] : 0     (n) fp32, written (=); dx == dy allowed (in place)
// Selects, not arithmetic: no rounding, so this and the CPU twin agree bit for bit. A NaN input stays NaN
// in the forward pass (as torch.relu), so a diverging model is never hidden; the backward is the mask of
// its header, dy * (y > 0), written as a select so that an infinite dy under a zero mask gives 0, not NaN.
// Pointers may alias exactly (in place; each thread reads its element before writing it) but not
// partially, hence no __restrict__.
//
// Launch: grid-stride over float4 when every pointer is 16-byte aligned (the n % 4 tail done by the first
// threads), else one float per thread.
#include <algorithm>
#include <cstdint>

#include "kernels/activation.h"
#include "kernels/cuda/launch.cuh"

namespace nt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 2048;  // enough to fill an H100/H200 (132 SMs x 2048 threads); the rest strides

struct ReluForward {
  __device__ float operator()(float x) const { return x < 0.f ? 0.f : x; }
};
struct ReluBackward {
  __device__ float operator()(float y, float dy) const { return y > 0.f ? dy : 0.f; }
};

// out = f(a) or f(a, b) elementwise over (n) fp32, one float per thread per stride. b unused for unary f.
template <class F, bool kBinary>
__global__ void __launch_bounds__(kThreads)
    elementwise_kernel(const float* a, const float* b, float* out, int64_t n, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const F f;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (kBinary)
      out[i] = f(a[i], b[i]);
    else
      out[i] = f(a[i]);
  }
}

// The same over 16-byte aligned pointers: one float4 per thread per stride, then the n % 4 tail.
template <class F, bool kBinary>
__global__ void __launch_bounds__(kThreads)
    elementwise_vec4_kernel(const float* a, const float* b, float* out, int64_t n, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const F f;
  const int64_t n4 = n / 4;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const float4* a4 = reinterpret_cast<const float4*>(a);
  const float4* b4 = reinterpret_cast<const float4*>(b);
  float4* out4 = reinterpret_cast<float4*>(out);
  for (int64_t i = tid; i < n4; i += stride) {
    const float4 u = a4[i];
    if constexpr (kBinary) {
      const float4 v = b4[i];
      out4[i] = float4{f(u.x, v.x), f(u.y, v.y), f(u.z, v.z), f(u.w, v.w)};
    } else {
      out4[i] = float4{f(u.x), f(u.y), f(u.z), f(u.w)};
    }
  }
  const int64_t tail = n4 * 4 + tid;  // the last n % 4 elements
  if (tail < n) {
    if constexpr (kBinary)
      out[tail] = f(a[tail], b[tail]);
    else
      out[tail] = f(a[tail]);
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

dim3 grid_for(int64_t items) {
  return dim3(static_cast<unsigned>(std::clamp<int64_t>(div_up<int64_t>(items, kThreads), 1, kMaxBlocks)));
}

template <class F, bool kBinary>
void launch_elementwise(const Exec& exec, const char* name, const profile::OpCost& cost, const float* a, const float* b,
                        float* out, size_t n) {
  const int64_t count = static_cast<int64_t>(n);
  const bool vec = aligned16(a) && aligned16(out) && (!kBinary || aligned16(b));
  if (vec)
    launch(exec, name, cost, elementwise_vec4_kernel<F, kBinary>, grid_for(count / 4 + 1), dim3(kThreads), 0, a, b, out,
           count);
  else
    launch(exec, name, cost, elementwise_kernel<F, kBinary>, grid_for(count), dim3(kThreads), 0, a, b, out, count);
}

}  // namespace

void relu_forward(const Exec& exec, const ReluArgs<float>& a) {
  const size_t n = a.n;
  if (n == 0) return;
  profile::OpCost cost{double(n) * 8, double(n)};  // x read, y written; one compare per element
  launch_elementwise<ReluForward, false>(exec, "relu_forward", cost, a.x, nullptr, a.y, n);
}

void relu_backward(const Exec& exec, const ReluArgs<float>& a) {
  const size_t n = a.n;
  if (n == 0) return;
  profile::OpCost cost{double(n) * 12, double(n)};  // y and dy read, dx written; one compare per element
  launch_elementwise<ReluBackward, true>(exec, "relu_backward", cost, a.y, a.dy, a.dx, n);
}

}  // namespace nt::kernels::cuda
