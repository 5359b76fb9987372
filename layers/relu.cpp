#include "layers/relu.h"

#include "kernels/activation.h"

namespace nt::layers {

void Relu::forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode) {
  kernels::relu_forward(exec, x.f32(), y.f32(), static_cast<size_t>(x.numel()));
}

void Relu::backward(const kernels::Exec& exec, const Tensor&, const Tensor& y, const Tensor& dy, const Tensor* dx) {
  if (!dx) return;
  kernels::relu_backward(exec, y.f32(), dy.f32(), dx->f32(), static_cast<size_t>(dy.numel()));
}

}  // namespace nt::layers
