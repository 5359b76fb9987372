// Standalone ReLU, CPU twin of kernels/cuda/activation.cu.
//
//   relu_forward:  y[i]  = x[i] < 0 ? 0 : x[i]      (n) fp32 (or f64), written (=); y == x allowed (in place)
//   relu_backward: dx[i] = y[i] > 0 ? dy[i] : 0     (n) fp32 (or f64), written (=); dx == dy allowed (in place)
// Selects, not arithmetic: no rounding, so both backends agree bit for bit. A NaN input stays NaN in the
// forward pass (as torch.relu), so a diverging model is never hidden; the backward is the mask of its
// header, dy * (y > 0), written as a select so that an infinite dy under a zero mask gives 0, not NaN.
// Pointers may alias exactly (in place) but not partially, hence no __restrict__.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/activation.h"
#include "kernels/cpu/op_scope.h"
#include "kernels/cpu/thread_pool.h"

namespace nt::kernels::cpu {

namespace {

constexpr size_t kChunk = size_t(1) << 16;  // elements per parallel task

// Runs body(begin, count) over [0, n) in chunks, on the pool when there is one.
template <class Body>
void for_chunks(const Exec& exec, size_t n, const Body& body) {
  const int64_t tasks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
  parallel_for(exec.pool, tasks, [&](int64_t t) {
    size_t begin = static_cast<size_t>(t) * kChunk;
    body(begin, std::min(kChunk, n - begin));
  });
}

template <class T>
void relu_forward_impl(const Exec& exec, const T* x, T* y, size_t n) {
  if (n == 0) return;
  const double bytes = double(n) * 2 * sizeof(T);  // x read, y written; 1 compare each
  OpScope scope(exec, "relu_forward", profile::OpCost{bytes, double(n)});
  for_chunks(exec, n, [&](size_t begin, size_t count) {
    for (size_t i = begin; i < begin + count; ++i) y[i] = x[i] < T(0) ? T(0) : x[i];
  });
}

template <class T>
void relu_backward_impl(const Exec& exec, const T* y, const T* dy, T* dx, size_t n) {
  if (n == 0) return;
  const double bytes = double(n) * 3 * sizeof(T);  // y, dy read, dx written
  OpScope scope(exec, "relu_backward", profile::OpCost{bytes, double(n)});
  for_chunks(exec, n, [&](size_t begin, size_t count) {
    for (size_t i = begin; i < begin + count; ++i) dx[i] = y[i] > T(0) ? dy[i] : T(0);
  });
}

}  // namespace

void relu_forward(const Exec& exec, const float* x, float* y, size_t n) { relu_forward_impl(exec, x, y, n); }
void relu_forward(const Exec& exec, const double* x, double* y, size_t n) { relu_forward_impl(exec, x, y, n); }
void relu_backward(const Exec& exec, const float* y, const float* dy, float* dx, size_t n) {
  relu_backward_impl(exec, y, dy, dx, n);
}
void relu_backward(const Exec& exec, const double* y, const double* dy, double* dx, size_t n) {
  relu_backward_impl(exec, y, dy, dx, n);
}

}  // namespace nt::kernels::cpu
