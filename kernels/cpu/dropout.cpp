// Dropout, CPU twin of kernels/cuda/dropout.cu (the contract is in kernels/dropout.h).
//
//   forward:  mask[i] = dropout_uniform(seed, draw, i) >= p;  y[i] = (x[i] * mask[i]) / (1 - p)
//   backward: dx[i] = (dy[i] * mask[i]) / (1 - p)
// x, y, dy, dx: (n) fp32 (or f64), written (=), in place allowed (y == x, dx == dy); mask: (n) bytes 0/1.
// keep = 1 - p in the element type, the same expression as the CUDA launcher; a product by the 0/1 mask
// (exact, and it keeps NaN and infinities visible) and one correctly rounded division per element, so
// the two backends agree bit for bit.
// counter: {value, done}; draw = value, then value += 1 (every call, n == 0 included; done stays 0).
// Elementwise over chunks: the result does not depend on the thread count.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/op_scope.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/dropout.h"

namespace nt::kernels::cpu {

namespace {

template <class T>
T keep_probability(float p) {
  return T(1) - static_cast<T>(p);
}

}  // namespace

template <class T>
void dropout_forward(const Exec& exec, const DropoutArgs<T>& a) {
  const size_t n = a.n;
  const float p = a.p;
  const T* x = a.x;        // (n)
  T* y = a.y;              // (n), may be x
  uint8_t* mask = a.mask;  // (n)
  uint64_t* counter = a.counter;
  const uint64_t draw = counter[0];
  if (n != 0) {
    // x read, y written, mask written; a hash (~12 integer ops), a multiply and a division per element.
    const double bytes = double(n) * (2 * sizeof(T) + 1);
    OpScope scope(exec, "dropout_forward", profile::OpCost{bytes, double(n) * 2});
    const T keep_p = keep_probability<T>(p);
    const uint64_t key = dropout_key(a.seed, draw);
    parallel_chunks(exec.pool, n, [&](size_t begin, size_t count) {
      for (size_t i = begin; i < begin + count; ++i) {
        const bool keep = dropout_uniform_keyed(key, i) >= p;
        mask[i] = keep ? 1 : 0;
        y[i] = (x[i] * (keep ? T(1) : T(0))) / keep_p;
      }
    });
  }
  counter[0] = draw + 1;
}

template <class T>
void dropout_backward(const Exec& exec, const DropoutArgs<T>& a) {
  const size_t n = a.n;
  const T* dy = a.dy;            // (n)
  const uint8_t* mask = a.mask;  // (n)
  T* dx = a.dx;                  // (n), may be dy
  if (n == 0) return;
  const double bytes = double(n) * (2 * sizeof(T) + 1);  // dy, mask read, dx written
  OpScope scope(exec, "dropout_backward", profile::OpCost{bytes, double(n) * 2});
  const T keep_p = keep_probability<T>(a.p);
  parallel_chunks(exec.pool, n, [&](size_t begin, size_t count) {
    for (size_t i = begin; i < begin + count; ++i) dx[i] = (dy[i] * (mask[i] ? T(1) : T(0))) / keep_p;
  });
}

template void dropout_forward(const Exec&, const DropoutArgs<float>&);
template void dropout_forward(const Exec&, const DropoutArgs<double>&);
template void dropout_backward(const Exec&, const DropoutArgs<float>&);
template void dropout_backward(const Exec&, const DropoutArgs<double>&);

}  // namespace nt::kernels::cpu
