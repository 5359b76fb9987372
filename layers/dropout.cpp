#include "layers/dropout.h"

#include <cmath>

#include "kernels/dropout.h"
#include "kernels/runtime.h"

namespace nt::layers {

Dropout::Dropout(double p) : p_(static_cast<float>(p)) {
  if (!(p >= 0 && p < 1)) throw Error(cat("dropout: probability must be in [0, 1), got ", p));
}

std::string Dropout::describe() const { return cat("dropout ", p_); }

void Dropout::plan(ArenaPlan& plan, const PlanInfo& info, const Shape& input) {
  plan.request(&mask_, input.prepend(info.batch), DType::u8);
  plan.request(&counter_, Shape{2}, DType::i64);
}

void Dropout::forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) {
  if (mode == Mode::eval) return kernels::copy_device_to_device(exec, y.raw(), x.raw(), x.bytes());
  auto* counter = reinterpret_cast<uint64_t*>(counter_.data<int64_t>());
  auto run = [&]<class T>(T /*element type*/) {
    kernels::dropout_forward(exec, kernels::DropoutArgs<T>{.n = static_cast<size_t>(x.numel()),
                                                           .p = p_,
                                                           .seed = seed_,
                                                           .counter = counter,
                                                           .x = x.data<T>(),
                                                           .y = y.data<T>(),
                                                           .mask = mask_.u8()});
  };
  x.dtype() == DType::f64 ? run(0.0) : run(0.f);
}

void Dropout::backward(const kernels::Exec& exec, const Tensor&, const Tensor&, const Tensor& dy, const Tensor* dx) {
  if (!dx) return;
  auto run = [&]<class T>(T /*element type*/) {
    kernels::dropout_backward(exec, kernels::DropoutArgs<T>{.n = static_cast<size_t>(dy.numel()),
                                                            .p = p_,
                                                            .mask = mask_.u8(),
                                                            .dy = dy.data<T>(),
                                                            .dx = dx->data<T>()});
  };
  dy.dtype() == DType::f64 ? run(0.0) : run(0.f);
}

}  // namespace nt::layers
