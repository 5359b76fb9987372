#include "layers/conv2d.h"

#include <cmath>
#include <type_traits>

namespace nt::layers {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int kernel, int stride, int pad, bool bias)
    : in_(static_cast<int>(in_channels)),
      out_(static_cast<int>(out_channels)),
      kernel_(kernel),
      stride_(stride),
      pad_(pad),
      bias_(bias) {
  if (in_channels <= 0 || out_channels <= 0 || kernel <= 0 || stride <= 0 || pad < 0)
    throw Error(cat("conv: channels, kernel and stride must be positive and padding >= 0, got ", in_channels, "->",
                    out_channels, " kernel ", kernel, " stride ", stride, " pad ", pad));
}

std::string Conv2d::describe() const {
  return cat("conv ", in_, "->", out_, " ", kernel_, "x", kernel_, " stride ", stride_, " pad ", pad_,
             bias_ ? "" : " (no bias)");
}

Shape Conv2d::output_shape(const Shape& input) const {
  if (input.rank() != 3 || input[0] != in_)
    throw Error(
        cat("layer ", sequential_index, " (", describe(), "): expects input (", in_, ", H, W), got ", input.str()));
  const int64_t h = input[1] + 2 * pad_ - kernel_, w = input[2] + 2 * pad_ - kernel_;
  if (h < 0 || w < 0)
    throw Error(cat("layer ", sequential_index, " (", describe(), "): input ", input.str(),
                    " is smaller than the kernel with its padding"));
  return Shape{out_, h / stride_ + 1, w / stride_ + 1};
}

std::vector<ParamSpec> Conv2d::param_specs() const {
  // PyTorch's nn.Conv2d default: kaiming_uniform_(a=sqrt(5)), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with
  // fan_in = C*R*S, and the same bound for the bias.
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_ * kernel_ * kernel_));
  auto uniform = [bound](std::span<float> w, Rng& rng) {
    for (auto& v : w) v = rng.uniform(-bound, bound);
  };
  std::vector<ParamSpec> specs{{"weight", Shape{out_, in_, kernel_, kernel_}, uniform}};
  if (bias_) specs.push_back({"bias", Shape{out_}, uniform});
  return specs;
}

void Conv2d::bind_params(std::span<Param*> params) {
  weight_ = params[0];
  bias_param_ = bias_ ? params[1] : nullptr;
}

kernels::Conv2dShape Conv2d::shape_for(int64_t rows, const Shape& sample) const {
  return {.n = static_cast<int>(rows),
          .c = in_,
          .h = static_cast<int>(sample[1]),
          .w = static_cast<int>(sample[2]),
          .k = out_,
          .r = kernel_,
          .s = kernel_,
          .stride = stride_,
          .pad = pad_};
}

StagedOperands& Conv2d::offer_staged() {
  staged_.used = [this](const kernels::Exec& exec, int64_t rows) {
    return kernels::conv2d_takes_staged(exec.backend, shape_for(rows, planned_input_), exec.math, bias_);
  };
  return staged_;
}
StagedOperands& Conv2d::offer_staged_input() {
  offers_staged_input_ = true;
  staged_.filters = [this](const kernels::Exec& exec, int64_t rows) {
    return kernels::conv2d_filter_stage(exec.backend, shape_for(rows, planned_input_), exec.math,
                                        weight_->value.data<float>(),
                                        workspace_.defined() ? workspace_.data<float>() : nullptr);
  };
  return offer_staged();
}
StagedOperands& Conv2d::offer_staged_output_grad() {
  offers_staged_output_grad_ = true;
  return offer_staged();
}

void Conv2d::plan(ArenaPlan& plan, const PlanInfo& info, const Shape& input) {
  const auto s = shape_for(info.batch, input);
  planned_input_ = input;
  // The staged operands are planned where the full batch takes them (--tf32 or --bf16 on the GPU): an fp32 run's
  // arena is as it was without them. The output gradient under BF16 only: a TF32 dx written channels-last (32 bytes a
  // pixel, K apart) cost the BatchNorm's backward more than this layer's own stage of dy saves (docs/bf16.md, 'The
  // same link under --tf32').
  staged_.input = Tensor{}, staged_.output_grad = Tensor{};
  if (info.dtype == DType::f32 && kernels::conv2d_takes_staged(info.backend, s, info.math, bias_)) {
    const DType element = info.math == kernels::Math::bf16 ? DType::bf16 : DType::f32;  // kernels/operand.h
    if (offers_staged_input_) plan.request(&staged_.input, Shape{info.batch, s.h, s.w, s.c}, element);
    if (offers_staged_output_grad_ && info.math == kernels::Math::bf16)
      plan.request(&staged_.output_grad, Shape{info.batch, s.p(), s.q(), s.k}, element);
  }
  const size_t floats = kernels::conv2d_workspace_floats(info.backend, s);
  if (floats > 0) plan.request(&workspace_, Shape{static_cast<int64_t>(floats)}, info.dtype);
  const size_t statistics =
      offers_statistics_ && info.dtype == DType::f32 ? kernels::conv2d_statistics_floats(info.backend, s) : 0;
  if (statistics > 0) plan.request(&statistics_.partials, Shape{static_cast<int64_t>(statistics)}, info.dtype);
}

void Conv2d::forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) {
  if (x.dtype() == DType::f64) return forward_typed<double>(exec, x, y, mode);
  forward_typed<float>(exec, x, y, mode);
}

void Conv2d::backward(const kernels::Exec& exec, const Tensor& x, const Tensor&, const Tensor& dy, const Tensor* dx) {
  if (x.dtype() == DType::f64) return backward_typed<double>(exec, x, dy, dx);
  backward_typed<float>(exec, x, dy, dx);
}

template <class T>
void Conv2d::forward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) {
  kernels::Conv2dArgs<T> args{.shape = shape_for(x.shape()[0], x.shape().drop_front()),
                              .x = x.data<T>(),
                              .w = weight_->value.data<T>(),
                              .bias = bias_ ? bias_param_->value.data<T>() : nullptr,
                              .y = y.data<T>(),
                              .workspace = workspace_.defined() ? workspace_.data<T>() : nullptr};
  // The statistics are fp32 only (ChannelPartials), asked for in training alone.
  if (std::is_same_v<T, float> && mode == Mode::train && statistics_.partials.defined())
    args.statistics = statistics_.partials.data<float>();
  // The layer before wrote x staged (it runs the same test), and the filters beside it wherever they have a staged
  // form (StagedOperands::filters): the forward then stages nothing. Where it did not write them, its kernel read and
  // wrote neither w nor the workspace, so the filters' stage may run beside it.
  args.x_staged = staged_.for_batch(staged_.input, exec, x.shape()[0]);
  args.filters_staged = args.x_staged != nullptr && staged_.filters(exec, x.shape()[0]).filters != nullptr;
  args.overlaps_previous = args.x_staged != nullptr && !args.filters_staged;
  statistics_.chunks = kernels::conv2d_forward(exec, args);
}

template <class T>
void Conv2d::backward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& dy, const Tensor* dx) {
  const int64_t rows = x.shape()[0];
  kernels::Conv2dArgs<T> args{.shape = shape_for(rows, x.shape().drop_front()),
                              .x = x.data<T>(),
                              .w = weight_->value.data<T>(),
                              .dy = dy.data<T>(),
                              .dx = dx ? dx->data<T>() : nullptr,
                              .dw = weight_->grad.data<T>(),
                              .dbias = bias_ ? bias_param_->grad.data<T>() : nullptr,
                              .workspace = workspace_.defined() ? workspace_.data<T>() : nullptr,
                              .x_staged = staged_.for_batch(staged_.input, exec, rows),
                              .dy_staged = staged_.for_batch(staged_.output_grad, exec, rows)};
  // The layer after wrote dy staged (it runs the same test): its kernel touches neither w nor the workspace.
  args.overlaps_previous = args.dy_staged != nullptr;
  args.weight_side = weight_side_;
  backward_ended_on_gradients_ = kernels::conv2d_backward(exec, args);
}

}  // namespace nt::layers
