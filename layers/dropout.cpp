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
  const auto n = static_cast<size_t>(x.numel());
  auto* counter = reinterpret_cast<uint64_t*>(counter_.data<int64_t>());
  if (x.dtype() == DType::f64)
    return kernels::dropout_forward(exec, x.data<double>(), y.data<double>(), mask_.u8(), n, p_, seed_, counter);
  kernels::dropout_forward(exec, x.f32(), y.f32(), mask_.u8(), n, p_, seed_, counter);
}

void Dropout::backward(const kernels::Exec& exec, const Tensor&, const Tensor&, const Tensor& dy, const Tensor* dx) {
  if (!dx) return;
  const auto n = static_cast<size_t>(dy.numel());
  if (dy.dtype() == DType::f64)
    return kernels::dropout_backward(exec, dy.data<double>(), mask_.u8(), dx->data<double>(), n, p_);
  kernels::dropout_backward(exec, dy.f32(), mask_.u8(), dx->f32(), n, p_);
}

}  // namespace nt::layers
