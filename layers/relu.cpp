#include "layers/relu.h"

#include "kernels/activation.h"

namespace nt::layers {

void Relu::forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode) {
  auto run = [&]<class T>(T /*element type*/) {
    kernels::relu_forward(
        exec, kernels::ReluArgs<T>{.n = static_cast<size_t>(x.numel()), .x = x.data<T>(), .y = y.data<T>()});
  };
  x.dtype() == DType::f64 ? run(0.0) : run(0.f);
}

void Relu::backward(const kernels::Exec& exec, const Tensor&, const Tensor& y, const Tensor& dy, const Tensor* dx) {
  if (!dx) return;
  auto run = [&]<class T>(T /*element type*/) {
    kernels::relu_backward(
        exec, kernels::ReluArgs<T>{
                  .n = static_cast<size_t>(dy.numel()), .y = y.data<T>(), .dy = dy.data<T>(), .dx = dx->data<T>()});
  };
  y.dtype() == DType::f64 ? run(0.0) : run(0.f);
}

}  // namespace nt::layers
