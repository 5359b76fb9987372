// Elementwise activations (standalone; Linear fuses ReLU into its GEMM epilogues instead).
//
//   relu_forward:  y = max(x, 0)                    (may run in place: y == x)
//   relu_backward: dx = dy * (y > 0), y the forward output   (may run in place: dx == dy)
#pragma once

#include <cstddef>

#include "kernels/dispatch.h"

namespace nt::kernels {

// Both ops of the family; each reads and writes only the fields its comment names.
template <class T>
struct ReluArgs {
  size_t n = 0;           // elements of every tensor below
  const T* x = nullptr;   // (n)  relu_forward reads
  T* y = nullptr;         // (n)  relu_forward writes (=, may be x); relu_backward reads (the forward output)
  const T* dy = nullptr;  // (n)  relu_backward reads
  T* dx = nullptr;        // (n)  relu_backward writes (=, may be dy)
};

namespace cpu {
template <class T>
void relu_forward(const Exec& exec, const ReluArgs<T>& a);  // float, double
template <class T>
void relu_backward(const Exec& exec, const ReluArgs<T>& a);  // float, double
}  // namespace cpu
namespace cuda {
void relu_forward(const Exec& exec, const ReluArgs<float>& a);
void relu_backward(const Exec& exec, const ReluArgs<float>& a);
}  // namespace cuda

template <class T>
void relu_forward(const Exec& exec, const ReluArgs<T>& a) {
  dispatch<cpu::relu_forward<T>, cuda::relu_forward>(exec, a);
}
template <class T>
void relu_backward(const Exec& exec, const ReluArgs<T>& a) {
  dispatch<cpu::relu_backward<T>, cuda::relu_backward>(exec, a);
}

}  // namespace nt::kernels
