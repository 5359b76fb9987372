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

#include "kernels/dispatch.h"

namespace nt::kernels {

struct Pool2dShape {
  int n = 0, c = 0, h = 0, w = 0;
  int window = 2, stride = 2;
  int p() const { return h >= window ? (h - window) / stride + 1 : 0; }  // output height
  int q() const { return w >= window ? (w - window) / stride + 1 : 0; }  // output width
};

// Both ops of the family; each reads and writes only the fields its comment names.
template <class T>
struct MaxPool2dArgs {
  Pool2dShape shape;          // N, C, H, W and the window; P = shape.p(), Q = shape.q()
  const T* x = nullptr;       // (N, C, H, W)  maxpool2d_forward reads
  T* y = nullptr;             // (N, C, P, Q)  maxpool2d_forward writes (=)
  int32_t* argmax = nullptr;  // (N, C, P, Q)  maxpool2d_forward writes (=); maxpool2d_backward reads
  const T* dy = nullptr;      // (N, C, P, Q)  maxpool2d_backward reads
  T* dx = nullptr;            // (N, C, H, W)  maxpool2d_backward writes (=)
};

namespace cpu {
template <class T>
void maxpool2d_forward(const Exec& exec, const MaxPool2dArgs<T>& a);  // float, double
template <class T>
void maxpool2d_backward(const Exec& exec, const MaxPool2dArgs<T>& a);  // float, double
}  // namespace cpu
namespace cuda {
void maxpool2d_forward(const Exec& exec, const MaxPool2dArgs<float>& a);
void maxpool2d_backward(const Exec& exec, const MaxPool2dArgs<float>& a);
}  // namespace cuda

template <class T>
void maxpool2d_forward(const Exec& exec, const MaxPool2dArgs<T>& a) {
  dispatch<cpu::maxpool2d_forward<T>, cuda::maxpool2d_forward>(exec, a);
}
template <class T>
void maxpool2d_backward(const Exec& exec, const MaxPool2dArgs<T>& a) {
  dispatch<cpu::maxpool2d_backward<T>, cuda::maxpool2d_backward>(exec, a);
}

}  // namespace nt::kernels
