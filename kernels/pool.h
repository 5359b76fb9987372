// 2-D max pooling, NCHW, no padding, no dilation (torch.nn.MaxPool2d(window, stride)).
//
//   forward:  y[n,c,i,j] = max over the window x[n,c, i*stride + a, j*stride + b], 0 <= a, b < window
//             argmax[n,c,i,j] = the chosen element's index within its (H, W) plane: (i*stride+a)*W + j*stride+b
//   backward: dx[n,c,h,w] = sum of dy[n,c,i,j] over the windows (i,j) whose argmax is (h,w); 0 elsewhere
// x, dx: (N, C, H, W); y, dy, argmax: (N, C, P, Q) with PyTorch's floor output size P = (H - window)/stride + 1
// (0 when H < window), Q likewise. All outputs written (=).
// The choice is PyTorch's: windows are scanned row-major and an element replaces the current one when it
// is larger or NaN, so ties keep the first maximum and a NaN in the window is chosen (it propagates).
// The backward is a gather: each input element visits the windows that can contain it in (i, j) order
// and adds the gradients of those that chose it, so overlapping windows (stride < window) need no atomics
// and the sums have a fixed order. Both are selects and fixed-order sums: the backends agree bit for bit.
#pragma once

#include <cstdint>

#include "kernels/exec.h"

namespace nt::kernels {

struct Pool2dShape {
  int n = 0, c = 0, h = 0, w = 0;
  int window = 2, stride = 2;
  int p() const { return h >= window ? (h - window) / stride + 1 : 0; }  // output height
  int q() const { return w >= window ? (w - window) / stride + 1 : 0; }  // output width
};

namespace cpu {
void maxpool2d_forward(const Exec& exec, const Pool2dShape& s, const float* x, float* y, int32_t* argmax);
void maxpool2d_backward(const Exec& exec, const Pool2dShape& s, const float* dy, const int32_t* argmax, float* dx);
void maxpool2d_forward(const Exec& exec, const Pool2dShape& s, const double* x, double* y, int32_t* argmax);
void maxpool2d_backward(const Exec& exec, const Pool2dShape& s, const double* dy, const int32_t* argmax, double* dx);
}  // namespace cpu
namespace cuda {
void maxpool2d_forward(const Exec& exec, const Pool2dShape& s, const float* x, float* y, int32_t* argmax);
void maxpool2d_backward(const Exec& exec, const Pool2dShape& s, const float* dy, const int32_t* argmax, float* dx);
}  // namespace cuda

inline void maxpool2d_forward(const Exec& exec, const Pool2dShape& s, const float* x, float* y, int32_t* argmax) {
  NT_DISPATCH(exec, maxpool2d_forward, s, x, y, argmax);
}
inline void maxpool2d_backward(const Exec& exec, const Pool2dShape& s, const float* dy, const int32_t* argmax,
                               float* dx) {
  NT_DISPATCH(exec, maxpool2d_backward, s, dy, argmax, dx);
}

inline void maxpool2d_forward(const Exec& exec, const Pool2dShape& s, const double* x, double* y, int32_t* argmax) {
  NT_CPU_ONLY(exec, maxpool2d_forward, s, x, y, argmax);
}
inline void maxpool2d_backward(const Exec& exec, const Pool2dShape& s, const double* dy, const int32_t* argmax,
                               double* dx) {
  NT_CPU_ONLY(exec, maxpool2d_backward, s, dy, argmax, dx);
}

}  // namespace nt::kernels
