#include "layers/linear.h"

#include <cmath>
#include <type_traits>

#include "kernels/activation.h"
#include "kernels/classifier_head.h"
#include "kernels/gemm.h"
#include "kernels/runtime.h"

namespace nt::layers {

Linear::Linear(int64_t in_features, int64_t out_features, bool relu, bool bias)
    : in_(static_cast<int>(in_features)), out_(static_cast<int>(out_features)), relu_(relu), bias_(bias) {
  if (in_features <= 0 || out_features <= 0)
    throw Error(cat("linear: features must be positive, got ", in_features, " -> ", out_features));
}

std::string Linear::describe() const {
  return cat("linear ", in_, "->", out_, bias_ ? "" : " (no bias)", relu_ ? " +relu" : "");
}

Shape Linear::output_shape(const Shape& input) const {
  if (input.rank() != 1 || input[0] != in_)
    throw Error(cat("layer ", sequential_index, " (", describe(), "): expects input (", in_, "), got ", input.str(),
                    input.rank() > 1 ? "; add a flatten layer before it" : ""));
  return Shape{out_};
}

std::vector<ParamSpec> Linear::param_specs() const {
  // PyTorch's nn.Linear default: kaiming_uniform_(a=sqrt(5)) on W, i.e. U(-1/sqrt(in), 1/sqrt(in)),
  // and the same bound for the bias.
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
  auto uniform = [bound](std::span<float> w, Rng& rng) {
    for (auto& v : w) v = rng.uniform(-bound, bound);
  };
  std::vector<ParamSpec> specs{{"weight", Shape{out_, in_}, uniform}};
  if (bias_) specs.push_back({"bias", Shape{out_}, uniform});
  return specs;
}

void Linear::bind_params(std::span<Param*> params) {
  weight_ = params[0];
  bias_param_ = bias_ ? params[1] : nullptr;
}

void Linear::plan(ArenaPlan& plan, const PlanInfo& info, const Shape&) {
  if (info.dtype != DType::f32) return;
  const size_t floats = kernels::gemm_workspace_floats(info.backend, static_cast<int>(info.batch), out_, in_);
  if (floats > 0) plan.request(&workspace_, Shape{static_cast<int64_t>(floats)}, info.dtype);
}

void Linear::forward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, Mode) {
  if (x.dtype() == DType::f64) return forward_typed<double>(exec, x, y);
  forward_typed<float>(exec, x, y);
}

void Linear::backward(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor* dx) {
  if (x.dtype() == DType::f64) return backward_typed<double>(exec, x, y, dy, dx);
  backward_typed<float>(exec, x, y, dy, dx);
}

template <class T>
void Linear::forward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& y) {
  kernels::GemmArgs<T> d;
  d.M = static_cast<int>(x.shape()[0]), d.N = out_, d.K = in_;
  d.A = x.data<T>(), d.lda = in_;                                 // x: (rows, in)
  d.B = weight_->value.data<T>(), d.ldb = in_, d.trans_b = true;  // W: (out, in) read as Wᵀ
  d.C = y.data<T>(), d.ldc = out_;                                // y: (rows, out)
  d.epilogue = bias_ ? (relu_ ? kernels::Epilogue::bias_relu : kernels::Epilogue::bias) : kernels::Epilogue::none;
  d.bias = bias_ ? bias_param_->value.data<T>() : nullptr;
  if constexpr (std::is_same_v<T, float>) d.workspace = workspace_.defined() ? workspace_.f32() : nullptr;
  kernels::gemm(exec, d);
  if (relu_ && !bias_)
    kernels::relu_forward(
        exec, kernels::ReluArgs<T>{.n = static_cast<size_t>(y.numel()), .x = y.data<T>(), .y = y.data<T>()});
}

template <class T>
void Linear::backward_typed(const kernels::Exec& exec, const Tensor& x, const Tensor& y, const Tensor& dy,
                            const Tensor* dx) {
  const int rows = static_cast<int>(x.shape()[0]);
  // dz = dy * (y > 0), in place in the gradient buffer, unless the next layer's GEMM already did it.
  if (relu_ && !dy_is_preactivation_)
    kernels::relu_backward(
        exec, kernels::ReluArgs<T>{
                  .n = static_cast<size_t>(dy.numel()), .y = y.data<T>(), .dy = dy.data<T>(), .dx = dy.data<T>()});

  kernels::GemmArgs<T> dw;  // dW (out, in) = dzᵀ · x
  dw.M = out_, dw.N = in_, dw.K = rows;
  dw.A = dy.data<T>(), dw.lda = out_, dw.trans_a = true;  // dz: (rows, out) read as dzᵀ
  dw.B = x.data<T>(), dw.ldb = in_;                       // x: (rows, in)
  dw.C = weight_->grad.data<T>(), dw.ldc = in_;
  dw.a_row_sums = bias_ ? bias_param_->grad.data<T>() : nullptr;  // db (out) = Σ_rows dz
  // dW on the side stream where there is one and the GEMM is large: the layers before then wait for dx alone, and only
  // the optimizer reads dW. Small ones stay: the side branch costs the programmatic launches at its fork and join,
  // which in the mlp (320->160, 6.6 MFLOP at batch 64, 26 at 256) lost more than the overlap gained (27.0 -> 28.7 ms
  // an epoch at batch 64), while the cnn's 3136->128 (51 MFLOP at batch 64) gained 0.5 to 2.3 ms in every math mode
  // (docs/conv.md, 'Weight gradients on a side stream'). The threshold lies between the two, unmeasured in between.
  constexpr double kAsideFlops = 32e6;
  const bool weight_aside =
      weight_side_ != nullptr && dx != nullptr && exec.on_cuda() && 2.0 * out_ * in_ * rows >= kAsideFlops;
  if (weight_aside) {
    weight_side_->fork();
    kernels::gemm(weight_side_->beside(exec), dw);
  } else {
    kernels::gemm(exec, dw);
  }

  if (!dx) return;
  kernels::GemmArgs<T> dxd;  // dx (rows, in) = dz · W
  dxd.M = rows, dxd.N = in_, dxd.K = out_;
  dxd.A = dy.data<T>(), dxd.lda = out_;
  dxd.B = weight_->value.data<T>(), dxd.ldb = in_;  // W: (out, in)
  dxd.C = dx->data<T>(), dxd.ldc = in_;
  if (mask_input_grad_) {  // through the previous layer's ReLU: x is its output
    dxd.epilogue = kernels::Epilogue::relu_mask;
    dxd.mask = x.data<T>();
  }
  // dx reads dz, W and x, written before dW's GEMM, and writes a buffer that GEMM neither reads nor writes
  // (unless dx shares memory with x, dz or the gradients): it may run beside it. With dW aside, its predecessor in the
  // stream is what wrote dz.
  dxd.overlaps_previous = !weight_aside && !dx->shares_memory(x) && !dx->shares_memory(dy) &&
                          !dx->shares_memory(weight_->grad) && !(bias_ && dx->shares_memory(bias_param_->grad));
  kernels::gemm(exec, dxd);
}

bool Linear::shape_fits_classifier_head() const { return !relu_ && kernels::classifier_head_fits(out_, in_); }

bool Linear::fits_classifier_head() const {
  return shape_fits_classifier_head() && weight_ && weight_->value.dtype() == DType::f32;
}

void Linear::classifier_head(const kernels::Exec& exec, const Tensor& x, const Tensor& logits, const Tensor& labels,
                             const Tensor* dlogits, const Tensor* dx, const LossTotals& totals) {
  NT_CHECK(fits_classifier_head(), "layer ", sequential_index, " (", describe(), ") cannot run as a classifier head");
  kernels::ClassifierHeadArgs h;
  h.B = static_cast<int>(x.shape()[0]), h.K = in_, h.C = out_;
  h.x = x.f32(), h.weight = weight_->value.f32(), h.bias = bias_ ? bias_param_->value.f32() : nullptr;
  h.labels = labels.i32(), h.logits = logits.f32();
  h.loss_sum = totals.loss_sum.data<double>(), h.correct = totals.correct.data<int64_t>();
  if (dlogits) {
    h.dlogits = dlogits->f32(), h.dweight = weight_->grad.f32();
    h.dbias = bias_ ? bias_param_->grad.f32() : nullptr;
    h.dx = dx ? dx->f32() : nullptr;
    h.mask_dx = dx && mask_input_grad_;  // through the previous layer's ReLU, as backward does
  }
  kernels::classifier_head(exec, h);
}

}  // namespace nt::layers
