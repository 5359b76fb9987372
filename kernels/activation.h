// Elementwise activations (standalone; Linear fuses ReLU into its GEMM epilogues instead).
//
//   relu_forward:  y = max(x, 0)                    (may run in place: y == x)
//   relu_backward: dx = dy * (y > 0), y the forward output   (may run in place: dx == dy)
#pragma once

#include <cstddef>

#include "kernels/exec.h"

namespace nt::kernels {

namespace cpu {
void relu_forward(const Exec& exec, const float* x, float* y, size_t n);
void relu_backward(const Exec& exec, const float* y, const float* dy, float* dx, size_t n);
void relu_forward(const Exec& exec, const double* x, double* y, size_t n);
void relu_backward(const Exec& exec, const double* y, const double* dy, double* dx, size_t n);
}  // namespace cpu
namespace cuda {
void relu_forward(const Exec& exec, const float* x, float* y, size_t n);
void relu_backward(const Exec& exec, const float* y, const float* dy, float* dx, size_t n);
}  // namespace cuda
inline void relu_forward(const Exec& exec, const float* x, float* y, size_t n) {
  NT_DISPATCH(exec, relu_forward, x, y, n);
}
inline void relu_backward(const Exec& exec, const float* y, const float* dy, float* dx, size_t n) {
  NT_DISPATCH(exec, relu_backward, y, dy, dx, n);
}

inline void relu_forward(const Exec& exec, const double* x, double* y, size_t n) {
  NT_CPU_ONLY(exec, relu_forward, x, y, n);
}
inline void relu_backward(const Exec& exec, const double* y, const double* dy, double* dx, size_t n) {
  NT_CPU_ONLY(exec, relu_backward, y, dy, dx, n);
}

}  // namespace nt::kernels
