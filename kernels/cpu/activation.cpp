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

template <class T>
void relu_forward(const Exec& exec, const ReluArgs<T>& a) {
  const size_t n = a.n;
  const T* x = a.x;  // (n)
  T* y = a.y;        // (n), may be x
  if (n == 0) return;
  const double bytes = double(n) * 2 * sizeof(T);  // x read, y written; 1 compare each
  OpScope scope(exec, "relu_forward", profile::OpCost{bytes, double(n)});
  parallel_chunks(exec.pool, n, [&](size_t begin, size_t count) {
    for (size_t i = begin; i < begin + count; ++i) y[i] = x[i] < T(0) ? T(0) : x[i];
  });
}

template <class T>
void relu_backward(const Exec& exec, const ReluArgs<T>& a) {
  const size_t n = a.n;
  const T* y = a.y;    // (n)
  const T* dy = a.dy;  // (n)
  T* dx = a.dx;        // (n), may be dy
  if (n == 0) return;
  const double bytes = double(n) * 3 * sizeof(T);  // y, dy read, dx written
  OpScope scope(exec, "relu_backward", profile::OpCost{bytes, double(n)});
  parallel_chunks(exec.pool, n, [&](size_t begin, size_t count) {
    for (size_t i = begin; i < begin + count; ++i) dx[i] = y[i] > T(0) ? dy[i] : T(0);
  });
}

template void relu_forward(const Exec&, const ReluArgs<float>&);
template void relu_forward(const Exec&, const ReluArgs<double>&);
template void relu_backward(const Exec&, const ReluArgs<float>&);
template void relu_backward(const Exec&, const ReluArgs<double>&);

}  // namespace nt::kernels::cpu
