// 2-D max pooling, CPU twin of kernels/cuda/pool.cu (the contract is in kernels/pool.h).
//
//   forward:  y[n,c,i,j] = x[n,c,h*,w*], (h*,w*) the first element of the window, scanned row-major, that
//             is larger than all before it or NaN (PyTorch's rule); argmax[n,c,i,j] = h*·W + w*
//   backward: dx[n,c,h,w] = Σ dy[n,c,i,j] over the windows (i,j) containing (h,w), in increasing (i, j)
//             order, whose argmax is h·W + w; 0 where none chose it
// x, dx: (N, C, H, W) fp32 (or f64); y, dy, argmax: (N, C, P, Q); every output written (=).
// Window i covers rows [i·stride, i·stride + window); the windows containing row h are
// i in [h < window ? 0 : (h - window)/stride + 1, min(h/stride, P - 1)] (empty when stride > window leaves
// row h uncovered, or h is past the last window). Columns likewise.
// Parallel over groups of whole (H, W) planes; every output element is computed by one thread from its
// own inputs, so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/cpu/op_scope.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/pool.h"

namespace nt::kernels::cpu {

namespace {

constexpr int64_t kChunk = int64_t(1) << 16;  // input elements per parallel task (whole planes)

// Runs body(plane) for every (n, c) plane, whole planes per task.
template <class Body>
void for_planes(const Exec& exec, const Pool2dShape& s, const Body& body) {
  const int64_t planes = int64_t(s.n) * s.c;
  const int64_t plane_size = std::max<int64_t>(int64_t(s.h) * s.w, 1);
  const int64_t per_task = std::max<int64_t>(kChunk / plane_size, 1);
  const int64_t tasks = (planes + per_task - 1) / per_task;
  parallel_for(exec.pool, tasks, [&](int64_t t) {
    const int64_t end = std::min(planes, (t + 1) * per_task);
    for (int64_t plane = t * per_task; plane < end; ++plane) body(plane);
  });
}

}  // namespace

template <class T>
void maxpool2d_forward(const Exec& exec, const MaxPool2dArgs<T>& a) {
  const Pool2dShape& s = a.shape;
  const T* x = a.x;            // (N, C, H, W)
  T* y = a.y;                  // (N, C, P, Q)
  int32_t* argmax = a.argmax;  // (N, C, P, Q)
  const int P = s.p(), Q = s.q();
  const int64_t outputs = int64_t(s.n) * s.c * P * Q;
  if (outputs == 0) return;
  // x read once (windows overlap at most a little), y and argmax written; one compare per window element.
  const double bytes = double(s.n) * s.c * s.h * s.w * sizeof(T) + double(outputs) * (sizeof(T) + 4);
  OpScope scope(exec, "maxpool2d_forward", profile::OpCost{bytes, double(outputs) * s.window * s.window});
  const int H = s.h, W = s.w, K = s.window, S = s.stride;
  for_planes(exec, s, [&](int64_t plane) {
    const T* xp = x + plane * H * W;       // (H, W)
    T* yp = y + plane * P * Q;             // (P, Q)
    int32_t* ap = argmax + plane * P * Q;  // (P, Q)
    for (int i = 0; i < P; ++i)
      for (int j = 0; j < Q; ++j) {
        const int h0 = i * S, w0 = j * S;
        T best = -std::numeric_limits<T>::infinity();
        int32_t arg = h0 * W + w0;
        for (int r = 0; r < K; ++r)
          for (int c = 0; c < K; ++c) {
            const int32_t idx = (h0 + r) * W + (w0 + c);
            const T v = xp[idx];
            if (v > best || std::isnan(v)) {
              best = v;
              arg = idx;
            }
          }
        yp[i * Q + j] = best;
        ap[i * Q + j] = arg;
      }
  });
}

template <class T>
void maxpool2d_backward(const Exec& exec, const MaxPool2dArgs<T>& a) {
  const Pool2dShape& s = a.shape;
  const T* dy = a.dy;                // (N, C, P, Q)
  const int32_t* argmax = a.argmax;  // (N, C, P, Q)
  T* dx = a.dx;                      // (N, C, H, W)
  const int P = s.p(), Q = s.q();
  const int64_t inputs = int64_t(s.n) * s.c * s.h * s.w;
  if (inputs == 0) return;
  const int H = s.h, W = s.w, K = s.window, S = s.stride;
  const double spans = double((K + S - 1) / S) * ((K + S - 1) / S);  // windows per input element, at most
  const double bytes = double(inputs) * sizeof(T) + double(inputs) * spans * (sizeof(T) + 4);
  OpScope scope(exec, "maxpool2d_backward", profile::OpCost{bytes, double(inputs) * spans});
  for_planes(exec, s, [&](int64_t plane) {
    const T* dyp = dy + plane * P * Q;           // (P, Q)
    const int32_t* ap = argmax + plane * P * Q;  // (P, Q)
    T* dxp = dx + plane * H * W;                 // (H, W)
    for (int h = 0; h < H; ++h) {
      const int i_lo = h < K ? 0 : (h - K) / S + 1, i_hi = std::min(h / S, P - 1);
      for (int w = 0; w < W; ++w) {
        const int j_lo = w < K ? 0 : (w - K) / S + 1, j_hi = std::min(w / S, Q - 1);
        const int32_t idx = h * W + w;
        T sum = T(0);
        for (int i = i_lo; i <= i_hi; ++i)
          for (int j = j_lo; j <= j_hi; ++j)
            if (ap[i * Q + j] == idx) sum += dyp[i * Q + j];
        dxp[idx] = sum;
      }
    }
  });
}

template void maxpool2d_forward(const Exec&, const MaxPool2dArgs<float>&);
template void maxpool2d_forward(const Exec&, const MaxPool2dArgs<double>&);
template void maxpool2d_backward(const Exec&, const MaxPool2dArgs<float>&);
template void maxpool2d_backward(const Exec&, const MaxPool2dArgs<double>&);

}  // namespace nt::kernels::cpu
