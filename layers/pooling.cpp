#include "layers/pooling.h"

namespace nt::layers {

MaxPool2d::MaxPool2d(int window, int stride) : window_(window), stride_(stride) {
  if (window <= 0 || stride <= 0)
    throw Error(cat("maxpool: window and stride must be positive, got ", window, " and ", stride));
}

std::string MaxPool2d::describe() const {
  return window_ == stride_ ? cat("maxpool ", window_) : cat("maxpool ", window_, " stride ", stride_);
}

Shape MaxPool2d::output_shape(const Shape& input) const {
  if (input.rank() != 3 || input[1] < window_ || input[2] < window_)
    throw Error(cat("layer ", sequential_index, " (", describe(), "): expects input (C, H, W) with H, W >= ", window_,
                    ", got ", input.str()));
  return Shape{input[0], (input[1] - window_) / stride_ + 1, (input[2] - window_) / stride_ + 1};
}

void MaxPool2d::plan(ArenaPlan& plan, const PlanInfo& info, const Shape& input) {
  plan.request(&argmax_, output_shape(input).prepend(info.batch), DType::i32);
}

kernels::Pool2dShape MaxPool2d::shape_for(const Tensor& x) const {
  kernels::Pool2dShape s;
  s.n = static_cast<int>(x.shape()[0]), s.c = static_cast<int>(x.shape()[1]);
  s.h = static_cast<int>(x.shape()[2]), s.w = static_cast<int>(x.shape()[3]);
  s.window = window_, s.stride = stride_;
  return s;
}

void MaxPool2d::forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode) {
  auto run = [&]<class T>(T /*element type*/) {
    kernels::maxpool2d_forward(
        exec,
        kernels::MaxPool2dArgs<T>{.shape = shape_for(x), .x = x.data<T>(), .y = y.data<T>(), .argmax = argmax_.i32()});
  };
  x.dtype() == DType::f64 ? run(0.0) : run(0.f);
}

void MaxPool2d::backward(const kernels::Exec& exec, const Tensor& x, const Tensor&, const Tensor& dy,
                         const Tensor* dx) {
  if (!dx) return;
  auto run = [&]<class T>(T /*element type*/) {
    kernels::maxpool2d_backward(
        exec, kernels::MaxPool2dArgs<T>{
                  .shape = shape_for(x), .argmax = argmax_.i32(), .dy = dy.data<T>(), .dx = dx->data<T>()});
  };
  x.dtype() == DType::f64 ? run(0.0) : run(0.f);
}

}  // namespace nt::layers
