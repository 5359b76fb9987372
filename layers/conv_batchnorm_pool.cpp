#include "layers/conv_batchnorm_pool.h"

#include "kernels/collective.h"

namespace nt::layers {

bool ConvBatchNormPool::fuses(const Conv2d& conv, const BatchNorm& bn, const Shape& input) {
  return input.rank() == 3 && !conv.bias_ && bn.pool_ > 0 && bn.spatial_ && bn.layout_ == kernels::Layout::nchw &&
         bn.channels_ == conv.out_ && kernels::conv_batchnorm_pool_fits(conv.shape_for(1, input));
}

ConvBatchNormPool::ConvBatchNormPool(std::unique_ptr<Conv2d> conv, std::unique_ptr<BatchNorm> bn, const Shape& input)
    : conv_(std::move(conv)), bn_(std::move(bn)) {
  NT_CHECK(fuses(*conv_, *bn_, input), "ConvBatchNormPool: ", conv_->describe(), " and ", bn_->describe(),
           " do not fuse on input ", input.str());
  sequential_index = conv_->sequential_index;
}

std::string ConvBatchNormPool::describe() const { return cat(conv_->describe(), " + ", bn_->describe()); }

Shape ConvBatchNormPool::output_shape(const Shape& input) const {
  return bn_->output_shape(conv_->output_shape(input));
}

std::vector<ParamSpec> ConvBatchNormPool::param_specs() const {
  auto specs = conv_->param_specs();
  for (ParamSpec spec : bn_->param_specs()) {
    spec.module = bn_module();
    specs.push_back(std::move(spec));
  }
  return specs;
}

void ConvBatchNormPool::bind_params(std::span<Param*> params) {
  const size_t conv_params = conv_->param_specs().size();  // in param_specs() order: the convolution's first
  conv_->bind_params(params.first(conv_params));
  bn_->bind_params(params.subspan(conv_params));
}

std::vector<BufferSpec> ConvBatchNormPool::buffer_specs() const {
  auto specs = bn_->buffer_specs();
  for (BufferSpec& spec : specs) spec.module = bn_module();
  return specs;
}

void ConvBatchNormPool::bind_buffers(std::span<Buffer*> buffers) { bn_->bind_buffers(buffers); }

kernels::ConvBatchNormPoolShape ConvBatchNormPool::shape_for(int64_t rows, const Shape& sample) const {
  return {conv_->shape_for(rows, sample), bn_->pool_};
}

void ConvBatchNormPool::plan(ArenaPlan& plan, const PlanInfo& info, const Shape& input) {
  if (info.batch_statistics && info.batch_statistics->world() > 1)
    throw Error(cat("layer ", sequential_index, " (", describe(), "): a fused stem keeps its BatchNorm statistics on ",
                    "the chip and cannot synchronize them; build the model with BuildOptions::sync_batchnorm"));
  bn_->plan_state(plan, info, conv_->output_shape(input));
  const size_t floats = kernels::conv_batchnorm_pool_workspace_floats(info.backend, shape_for(info.batch, input));
  workspaces_.assign(static_cast<size_t>(info.input_slots), Tensor{});
  if (floats > 0)
    for (Tensor& workspace : workspaces_) plan.request(&workspace, Shape{static_cast<int64_t>(floats)}, info.dtype);
}

template <class T>
kernels::ConvBatchNormPoolArgs<T> ConvBatchNormPool::args(const Tensor& x, const Tensor& y, bool relu, int slot) const {
  const BatchNorm& bn = *bn_;
  const Tensor& workspace = workspaces_.at(static_cast<size_t>(slot));
  return {.shape = shape_for(x.shape()[0], x.shape().drop_front()),
          .hyper = bn.hyper(relu),
          .x = x.data<T>(),
          .w = conv_->weight_->value.template data<T>(),
          .gamma = bn.affine_ ? bn.gamma_->value.template data<T>() : nullptr,
          .beta = bn.affine_ ? bn.beta_->value.template data<T>() : nullptr,
          .y = y.defined() ? y.data<T>() : nullptr,
          .argmax = bn.argmax_.i32(),
          .save_mean = bn.save_mean_.data<T>(),
          .save_invstd = bn.save_invstd_.data<T>(),
          .running_mean = bn.running_mean_.data<T>(),
          .running_var = bn.running_var_.data<T>(),
          .num_batches_tracked = bn.num_batches_tracked_.data<int64_t>(),
          .workspace = workspace.defined() ? workspace.data<T>() : nullptr};
}

void* ConvBatchNormPool::staged_output(const kernels::Exec& exec, int64_t rows) const {
  return staged_output_ ? staged_output_->for_batch(staged_output_->input, exec, rows) : nullptr;
}

void ConvBatchNormPool::forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) {
  if (x.dtype() == DType::f64) return forward_typed<double>(exec, x, y, mode);
  forward_typed<float>(exec, x, y, mode);
}

void ConvBatchNormPool::backward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy,
                                 const Tensor* dx) {
  NT_CHECK(dx == nullptr, "layer ", sequential_index, " (", describe(),
           ") is a model's first layer: no input gradient");
  if (x.dtype() == DType::f64) return backward_typed<double>(exec, x, y, dy);
  backward_typed<float>(exec, x, y, dy);
}

void ConvBatchNormPool::prepare_input(const kernels::Exec& exec, const Tensor& x, int slot) {
  if (x.dtype() != DType::f32) return;  // f64 runs on the CPU, where nothing is prepared
  kernels::conv_batchnorm_pool_moments(exec, args<float>(x, Tensor{}, bn_->relu_, slot));
}

template <class T>
void ConvBatchNormPool::forward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode mode) {
  kernels::ConvBatchNormPoolArgs<T> a = args<T>(x, y, bn_->relu_, input_slot_);
  // The next convolution reads the staged output; y beside it only for the backward's ReLU (no backward follows an
  // evaluation).
  a.y_staged = staged_output(exec, x.shape()[0]);
  if (a.y_staged && (mode == Mode::eval || !keeps_fp32_output(exec))) a.y = nullptr;
  // The next convolution's filters beside its input (its forward then stages nothing).
  if (a.y_staged && staged_output_->filters) a.next_filters = staged_output_->filters(exec, x.shape()[0]);
  if (mode == Mode::eval) return kernels::conv_batchnorm_pool_forward_eval(exec, a);
  const kernels::BatchNormShape bn = a.shape.batchnorm();
  bn_->require_trainable(bn.n * bn.hw, conv_->output_shape(x.shape().drop_front()).prepend(bn.n));
  a.moments_ready = input_prepared_;
  kernels::conv_batchnorm_pool_forward_train(exec, a);
}

template <class T>
void ConvBatchNormPool::backward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy) {
  // Through the fused ReLU here, unless the next layer's kernel already masked dy.
  const bool relu = bn_->relu_ && !dy_is_preactivation_;
  kernels::ConvBatchNormPoolArgs<T> a = args<T>(x, y, relu, input_slot_);  // the forward's moments
  if (!relu) a.y = nullptr;
  a.y_staged = relu ? staged_output(exec, x.shape()[0]) : nullptr;  // the ReLU reads y, or this where y is not written
  if (a.y_staged && !keeps_fp32_output(exec)) a.y = nullptr;
  a.dy = dy.data<T>();
  a.dw = conv_->weight_->grad.template data<T>();
  a.dgamma = bn_->affine_ ? bn_->gamma_->grad.template data<T>() : nullptr;
  a.dbeta = bn_->affine_ ? bn_->beta_->grad.template data<T>() : nullptr;
  a.overlaps_previous = backward_overlaps_previous_;
  kernels::conv_batchnorm_pool_backward(exec, a);
}

}  // namespace nt::layers
