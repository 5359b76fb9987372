#include "layers/relu.h"

#include "kernels/activation.h"

namespace nt::layers {

void Relu::forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode) {
  const auto n = static_cast<size_t>(x.numel());
  if (x.dtype() == DType::f64) return kernels::relu_forward(exec, x.data<double>(), y.data<double>(), n);
  kernels::relu_forward(exec, x.f32(), y.f32(), n);
}

void Relu::backward(const kernels::Exec& exec, const Tensor&, const Tensor& y, const Tensor& dy, const Tensor* dx) {
  if (!dx) return;
  const auto n = static_cast<size_t>(dy.numel());
  if (y.dtype() == DType::f64)
    return kernels::relu_backward(exec, y.data<double>(), dy.data<double>(), dx->data<double>(), n);
  kernels::relu_backward(exec, y.f32(), dy.f32(), dx->f32(), n);
}

}  // namespace nt::layers
