// 2-D max pooling on the GPU (the contract is in kernels/pool.h; CPU twin kernels/cpu/pool.cpp).
//
//   forward:  y[n,c,i,j] = x[n,c,h*,w*], (h*,w*) the first element of the window, scanned row-major, that
//             is larger than all before it or NaN (PyTorch's rule); argmax[n,c,i,j] = h*·W + w*
//   backward: dx[n,c,h,w] = Σ dy[n,c,i,j] over the windows (i,j) containing (h,w), in increasing (i, j)
//             order, whose argmax is h·W + w; 0 where none chose it
// x, dx: (N, C, H, W) fp32; y, dy, argmax: (N, C, P, Q); every output written (=).
// The forward is selects only and the backward adds in the CPU twin's order from the same +0 start, so
// the backends agree bit for bit. The backward is a gather (one thread per input element reads the at
// most ceil(window/stride)^2 windows that can contain it): no atomics, overlapping windows included.
//
// Launch: grid-stride, one thread per output element (forward) or per input element (backward), at most
// 2048 blocks of 256; consecutive threads take consecutive j (w), so a warp's loads of x (dy, argmax)
// and stores of y (dx) are contiguous rows. Indices are 32-bit (tensors of fewer than 2^31 - 2^19
// elements, checked) and decoded with multiply-shift divisions: the 64-bit divisions of a plain decode cost more than
// the memory traffic of these kernels (Nsight Compute: math-pipe throttle in the backward).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/fast_divmod.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/pool.h"

namespace nt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 2048;  // enough to fill an H100/H200 (132 SMs x 2048 threads); the rest strides

struct Dims {
  int H, W, P, Q, K, S;  // input plane, output plane, window, stride
  FastDivmod by_W, by_H, by_Q, by_P, by_S;
};

// x: (N, C, H, W); y, argmax: (N, C, P, Q); outputs = N·C·P·Q. One output element per thread per stride.
__global__ void __launch_bounds__(kThreads)
    maxpool2d_forward_kernel(const float* __restrict__ x, float* __restrict__ y, int32_t* __restrict__ argmax,
                             int outputs, Dims d, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int stride = gridDim.x * blockDim.x;
  for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < outputs; o += stride) {
    int row, j, plane, i;
    d.by_Q.divmod(o, row, j);                                      // row = plane * P + i
    d.by_P.divmod(row, plane, i);                                  // plane = n * C + c
    const float* xp = x + static_cast<size_t>(plane) * d.H * d.W;  // (H, W)
    const int h0 = i * d.S, w0 = j * d.S;
    float best = -INFINITY;
    int32_t arg = h0 * d.W + w0;
    for (int a = 0; a < d.K; ++a)
      for (int b = 0; b < d.K; ++b) {
        const int32_t idx = (h0 + a) * d.W + (w0 + b);
        const float v = xp[idx];
        if (v > best || isnan(v)) {  // PyTorch's rule: first maximum, any NaN wins
          best = v;
          arg = idx;
        }
      }
    y[o] = best;
    argmax[o] = arg;
  }
}

// dy, argmax: (N, C, P, Q); dx: (N, C, H, W); inputs = N·C·H·W. One input element per thread per stride.
__global__ void __launch_bounds__(kThreads)
    maxpool2d_backward_kernel(const float* __restrict__ dy, const int32_t* __restrict__ argmax, float* __restrict__ dx,
                              int inputs, Dims d, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int stride = gridDim.x * blockDim.x;
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < inputs; e += stride) {
    int row, w, plane, h;
    d.by_W.divmod(e, row, w);      // row = plane * H + h
    d.by_H.divmod(row, plane, h);  // plane = n * C + c
    const size_t plane_off = static_cast<size_t>(plane) * d.P * d.Q;
    const float* dyp = dy + plane_off;       // (P, Q)
    const int32_t* ap = argmax + plane_off;  // (P, Q)
    // The windows containing (h, w): rows i in [i_lo, i_hi], columns j in [j_lo, j_hi] (maybe empty).
    const int i_lo = h < d.K ? 0 : d.by_S.div(h - d.K) + 1, i_hi = min(d.by_S.div(h), d.P - 1);
    const int j_lo = w < d.K ? 0 : d.by_S.div(w - d.K) + 1, j_hi = min(d.by_S.div(w), d.Q - 1);
    const int32_t idx = h * d.W + w;
    float sum = 0.f;
    for (int i = i_lo; i <= i_hi; ++i)
      for (int j = j_lo; j <= j_hi; ++j)
        if (ap[i * d.Q + j] == idx) sum = __fadd_rn(sum, dyp[i * d.Q + j]);
    dx[e] = sum;
  }
}

dim3 grid_for(int64_t items) {
  return dim3(static_cast<unsigned>(std::clamp<int64_t>(div_up<int64_t>(items, kThreads), 1, kMaxBlocks)));
}

Dims dims_of(const Pool2dShape& s) {
  constexpr int64_t kMax = (int64_t(1) << 31) - kMaxBlocks * kThreads;  // the grid stride must not overflow
  NT_CHECK(int64_t(s.n) * s.c * s.h * s.w < kMax, "maxpool2d: tensors of 2^31 elements or more are not supported");
  return {s.h,
          s.w,
          s.p(),
          s.q(),
          s.window,
          s.stride,
          FastDivmod(s.w),
          FastDivmod(s.h),
          FastDivmod(s.q()),
          FastDivmod(s.p()),
          FastDivmod(s.stride)};
}

}  // namespace

void maxpool2d_forward(const Exec& exec, const MaxPool2dArgs<float>& a) {
  const Pool2dShape& s = a.shape;
  const int64_t outputs = int64_t(s.n) * s.c * s.p() * s.q();
  if (outputs == 0) return;
  // x read once (windows overlap at most a little), y and argmax written; one compare per window element.
  const double bytes = double(s.n) * s.c * s.h * s.w * 4 + double(outputs) * 8;
  const profile::OpCost cost{bytes, double(outputs) * s.window * s.window};
  launch(exec, "maxpool2d_forward", cost, maxpool2d_forward_kernel, grid_for(outputs), dim3(kThreads), 0, a.x, a.y,
         a.argmax, static_cast<int>(outputs), dims_of(s));
}

void maxpool2d_backward(const Exec& exec, const MaxPool2dArgs<float>& a) {
  const Pool2dShape& s = a.shape;
  const int64_t inputs = int64_t(s.n) * s.c * s.h * s.w;
  if (inputs == 0) return;
  const int spans = (s.window + s.stride - 1) / s.stride;  // windows per input row (column), at most
  const double bytes = double(inputs) * 4 + double(inputs) * spans * spans * 8;
  const profile::OpCost cost{bytes, double(inputs) * spans * spans};
  launch(exec, "maxpool2d_backward", cost, maxpool2d_backward_kernel, grid_for(inputs), dim3(kThreads), 0, a.dy,
         a.argmax, a.dx, static_cast<int>(inputs), dims_of(s));
}

}  // namespace nt::kernels::cuda
