#include "layers/batchnorm.h"

#include <type_traits>

#include "kernels/collective.h"

namespace nt::layers {

namespace {
constexpr double kEps = 1e-5;  // PyTorch's defaults
constexpr double kMomentum = 0.1;
}  // namespace

BatchNorm::BatchNorm(int64_t channels, bool spatial, kernels::Layout layout, bool relu, bool affine, int pool)
    : channels_(channels), spatial_(spatial), layout_(layout), relu_(relu), affine_(affine), pool_(pool) {
  if (channels <= 0) throw Error(cat("batchnorm: channels must be positive, got ", channels));
  if (pool < 0 || (pool > 0 && !(spatial && layout == kernels::Layout::nchw)))
    throw Error(cat("batchnorm: a fused max-pool needs BatchNorm2d in NCHW and a positive window, got ", pool));
}

std::string BatchNorm::describe() const {
  return cat(spatial_ ? "batchnorm2d " : "batchnorm1d ", channels_,
             spatial_ && layout_ == kernels::Layout::nhwc ? " nhwc" : "", affine_ ? "" : " (no affine)",
             relu_ ? " +relu" : "", pool_ ? cat(" +maxpool ", pool_) : "");
}

Shape BatchNorm::output_shape(const Shape& input) const {
  const bool nhwc = layout_ == kernels::Layout::nhwc;
  const bool ok =
      spatial_ ? input.rank() == 3 && input[nhwc ? 2 : 0] == channels_ : input.rank() == 1 && input[0] == channels_;
  if (!ok)
    throw Error(cat(
        "layer ", sequential_index, " (", describe(), "): expects input ",
        spatial_ ? (nhwc ? cat("(H, W, ", channels_, ")") : cat("(", channels_, ", H, W)")) : cat("(", channels_, ")"),
        ", got ", input.str()));
  if (!pool_) return input;
  if (input[1] < pool_ || input[2] < pool_)
    throw Error(cat("layer ", sequential_index, " (", describe(), "): expects input (C, H, W) with H, W >= ", pool_,
                    ", got ", input.str()));
  return Shape{input[0], input[1] / pool_, input[2] / pool_};
}

std::vector<ParamSpec> BatchNorm::param_specs() const {
  if (!affine_) return {};
  auto fill = [](float value) {
    return [value](std::span<float> w, Rng&) {
      for (auto& v : w) v = value;
    };
  };
  return {{"weight", Shape{channels_}, fill(1.f)}, {"bias", Shape{channels_}, fill(0.f)}};
}

void BatchNorm::bind_params(std::span<Param*> params) {
  gamma_ = affine_ ? params[0] : nullptr;
  beta_ = affine_ ? params[1] : nullptr;
}

std::vector<BufferSpec> BatchNorm::buffer_specs() const {
  return {{"running_mean", Shape{channels_}, false, 0.0},
          {"running_var", Shape{channels_}, false, 1.0},
          {"num_batches_tracked", Shape{}, true, 0.0}};
}

void BatchNorm::bind_buffers(std::span<Buffer*> buffers) {
  running_mean_ = buffers[0]->value;
  running_var_ = buffers[1]->value;
  num_batches_tracked_ = buffers[2]->value;
}

void BatchNorm::require_trainable(int64_t values_per_channel, const Shape& input) const {
  if (values_per_channel <= 1)
    throw Error(cat("layer ", sequential_index, " (", describe(), "): training needs more than one value per channel, ",
                    "got input ", input.str()));
}

kernels::BatchNormShape BatchNorm::shape_for(int64_t rows, const Shape& sample) const {
  kernels::BatchNormShape s;
  s.n = rows, s.c = channels_, s.hw = sample.numel() / channels_, s.layout = layout_;
  return s;
}

kernels::BatchNormPool BatchNorm::pool_for(const Shape& sample) const {
  return {static_cast<int>(sample[1]), static_cast<int>(sample[2]), pool_};
}

kernels::BatchNormHyper BatchNorm::hyper(bool relu) const { return {kEps, kMomentum, relu}; }

void BatchNorm::plan_state(ArenaPlan& plan, const PlanInfo& info, const Shape& input) {
  const auto s = shape_for(info.batch, input);
  require_trainable(s.n * s.hw, input.prepend(info.batch));
  plan.request(&save_mean_, Shape{channels_}, info.dtype);
  plan.request(&save_invstd_, Shape{channels_}, info.dtype);
  if (pool_) plan.request(&argmax_, output_shape(input).prepend(info.batch), DType::i32);
}

void BatchNorm::plan(ArenaPlan& plan, const PlanInfo& info, const Shape& input) {
  plan_state(plan, info, input);
  const auto s = shape_for(info.batch, input);
  group_ = info.batch_statistics;
  const int ranks = group_ ? group_->world() : 1;
  if (ranks > 1 && info.dtype != DType::f32)
    throw Error(cat("layer ", sequential_index, " (", describe(), "): a synchronized batchnorm trains in f32"));
  const size_t floats = pool_ ? kernels::batchnorm_pool_workspace_floats(info.backend, s, pool_for(input), ranks)
                              : kernels::batchnorm_workspace_floats(info.backend, s, ranks);
  if (floats > 0) plan.request(&workspace_, Shape{static_cast<int64_t>(floats)}, info.dtype);
}

void BatchNorm::forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) {
  if (x.dtype() == DType::f64) return forward_typed<double>(exec, x, y, mode);
  forward_typed<float>(exec, x, y, mode);
}

void BatchNorm::backward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy,
                         const Tensor* dx) {
  if (x.dtype() == DType::f64) return backward_typed<double>(exec, x, y, dy, dx);
  backward_typed<float>(exec, x, y, dy, dx);
}

template <class T>
kernels::BatchNormArgs<T> BatchNorm::args(const Tensor& x, const Tensor& y, bool relu) const {
  const Shape sample = x.shape().drop_front();
  return {.shape = shape_for(x.shape()[0], sample),
          .hyper = hyper(relu),
          .pool = pool_ ? pool_for(sample) : kernels::BatchNormPool{},
          .x = x.data<T>(),
          .gamma = affine_ ? gamma_->value.data<T>() : nullptr,
          .beta = affine_ ? beta_->value.data<T>() : nullptr,
          .y = y.data<T>(),
          .argmax = pool_ ? argmax_.i32() : nullptr,
          .save_mean = save_mean_.data<T>(),
          .save_invstd = save_invstd_.data<T>(),
          .running_mean = running_mean_.data<T>(),
          .running_var = running_var_.data<T>(),
          .num_batches_tracked = num_batches_tracked_.data<int64_t>(),
          .workspace = workspace_.defined() ? workspace_.data<T>() : nullptr};
}

template <class T>
void BatchNorm::forward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) {
  kernels::BatchNormArgs<T> a = args<T>(x, y, relu_);
  if (mode == Mode::eval) {
    if (pool_) return kernels::batchnorm_pool_forward_eval(exec, a);
    return kernels::batchnorm_forward_eval(exec, a);
  }
  require_trainable(a.shape.n * a.shape.hw, x.shape());
  if (given_ && given_->chunks > 0)  // the layer before's statistics of x, where its training forward gave them
    a.given = {given_->partials.data<float>(), given_->chunks};
  a.group = group_;
  if (pool_) return kernels::batchnorm_pool_forward_train(exec, a);
  kernels::batchnorm_forward_train(exec, a);
}

template <class T>
void BatchNorm::backward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy,
                               const Tensor* dx) {
  // Through the fused ReLU here, unless the next layer's GEMM already masked dy.
  const bool relu = relu_ && !dy_is_preactivation_;
  kernels::BatchNormArgs<T> a = args<T>(x, y, relu);
  if (!relu) a.y = nullptr;  // y is read only through the ReLU
  a.dy = dy.data<T>();
  a.dx = dx ? dx->data<T>() : nullptr;
  if (const StagedOperands* s = staged_input_grad_; std::is_same_v<T, float> && dx && s)
    a.dx_staged = s->for_batch(s->output_grad, exec, x.shape()[0]);  // the convolution before reads it, not dx
  if (a.dx_staged) a.dx = nullptr;
  a.dgamma = affine_ ? gamma_->grad.data<T>() : nullptr;
  a.dbeta = affine_ ? beta_->grad.data<T>() : nullptr;
  a.group = group_;
  if (pool_) return kernels::batchnorm_pool_backward(exec, a);
  kernels::batchnorm_backward(exec, a);
}

}  // namespace nt::layers
