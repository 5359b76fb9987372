// Finite-difference gradient checks in double precision: every layer's backward against central
// differences of its own forward, with parameters, activations and kernels in f64 on the CPU backend
// (the same layer code and op API that train in fp32).
//
// With h = 1e-6 the quotient's rounding error is about |L|·eps_f64/h ≈ 1e-10 and its truncation error
// about h²·|L'''|/6 ≈ 1e-13 for these O(1) losses, so a tolerance of 1e-6 of the gradient's scale is
// loose for rounding yet catches any wrong formula (an O(1) error) or a lost 1/B (a factor).
// A ReLU kink inside [p-h, p+h] makes the forward non-smooth there; such coordinates are detected (a
// ReLU input changes sign between the two evaluations) and skipped; with h = 1e-6 they are rare.
#include "test_support.h"

#include "engine/context.h"
#include "engine/model.h"
#include "kernels/activation.h"
#include "kernels/softmax_xent.h"
#include "layers/builder.h"
#include "layers/linear.h"
#include "layers/relu.h"
#include "layers/softmax_xent.h"

using namespace nt;

namespace {

constexpr double kStep = 1e-6;
constexpr test::Tolerance kTolerance{1e-12, 1e-6, "central differences in f64, h=1e-6"};

// Checks the gradient `analytic` of f at `x` coordinate by coordinate; `kinked` says whether the two
// evaluations around a coordinate straddle a non-smooth point (those are skipped, and counted).
template <class Eval, class Kinked>
void check_gradient(std::span<double> x, std::span<const double> analytic, Eval f, Kinked kinked, int* skipped) {
  std::vector<double> numeric(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kStep;
    const double plus = f();
    auto pattern = kinked();
    x[i] = saved - kStep;
    const double minus = f();
    const bool straddles = kinked() != pattern;
    x[i] = saved;
    numeric[i] = straddles ? analytic[i] : (plus - minus) / (2 * kStep);
    *skipped += straddles;
  }
  double scale = 0;
  for (double a : analytic) scale = std::max(scale, std::abs(a));
  for (size_t i = 0; i < x.size(); ++i) {
    INFO("coordinate " << i << ": analytic " << analytic[i] << ", numeric " << numeric[i]);
    REQUIRE(std::abs(analytic[i] - numeric[i]) <= kTolerance.abs_tol + kTolerance.rel_tol * scale);
  }
}

struct Problem {
  Context ctx{ContextOptions{"cpu", 1, false}};
  std::unique_ptr<Model> model;
  layers::SoftmaxCrossEntropy loss;
  Arena arena;
  Tensor labels;
  LossTotals totals;
  int batch;

  Problem(std::unique_ptr<Model> m, int b) : model(std::move(m)), batch(b) {
    model->init_params(ctx, 11, DType::f64);
    model->compile(ctx, batch);
    ArenaPlan plan;
    plan.request(&labels, Shape{batch}, DType::i32);
    plan.request(&totals.loss_sum, Shape{1}, DType::f64);
    plan.request(&totals.correct, Shape{1}, DType::i64);
    arena = plan.commit(ctx.exec());
    auto x = test::random_floats(static_cast<size_t>(model->input().numel()), -1.f, 1.f);
    std::copy(x.begin(), x.end(), model->input().data<double>());
    auto y = test::random_labels(static_cast<size_t>(batch), static_cast<int>(model->output_shape()[0]));
    std::copy(y.begin(), y.end(), labels.i32());
  }

  double mean_loss() {
    model->forward(ctx.exec(), batch, Mode::train);
    *totals.loss_sum.data<double>() = 0;
    loss.apply(ctx.exec(), model->output(), labels, nullptr, totals);
    return *totals.loss_sum.data<double>() / batch;  // the loss whose gradient backward computes
  }

  void backward() {
    model->forward(ctx.exec(), batch, Mode::train);
    Tensor dlogits = model->output_grad();
    loss.apply(ctx.exec(), model->output(), labels, &dlogits, totals);
    model->backward(ctx.exec(), batch);
  }

  // Which outputs of every layer are positive: changes when a perturbation crosses a ReLU kink.
  std::vector<bool> signs() const {
    std::vector<bool> s;
    for (size_t i = 1; i <= model->layers().size(); ++i) {
      const Tensor& a = model->activation(i);
      for (int64_t j = 0; j < a.numel(); ++j) s.push_back(a.data<double>()[j] > 0);
    }
    return s;
  }

  void check_all_parameters() {
    backward();
    int skipped = 0, total = 0;
    for (auto& param : model->params().params()) {
      INFO("parameter " << param.name);
      std::span<double> value(param.value.data<double>(), static_cast<size_t>(param.value.numel()));
      std::vector<double> analytic(param.grad.data<double>(), param.grad.data<double>() + param.grad.numel());
      check_gradient(value, analytic, [&] { return mean_loss(); }, [&] { return signs(); }, &skipped);
      total += static_cast<int>(value.size());
    }
    INFO(skipped << " of " << total << " coordinates skipped at ReLU kinks");
    CHECK(skipped * 20 <= total);
  }
};

std::unique_ptr<Model> model_of(std::vector<std::unique_ptr<Layer>> layers, int64_t inputs) {
  for (size_t i = 0; i < layers.size(); ++i) layers[i]->sequential_index = static_cast<int>(i);
  return std::make_unique<Model>("gradcheck", Shape{inputs}, std::move(layers));
}

}  // namespace

TEST_CASE("Linear gradients match finite differences", "[cpu][grad]") {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<layers::Linear>(9, 5, false));
  Problem(model_of(std::move(layers), 9), 4).check_all_parameters();
}

TEST_CASE("Linear without bias gradients match finite differences", "[cpu][grad]") {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<layers::Linear>(7, 4, false, /*bias=*/false));
  Problem(model_of(std::move(layers), 7), 3).check_all_parameters();
}

TEST_CASE("Linear with fused ReLU gradients match finite differences", "[cpu][grad]") {
  // Linear(+relu) then Linear: the second layer's input-gradient GEMM applies the first one's ReLU mask.
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<layers::Linear>(9, 7, true));
  layers.push_back(std::make_unique<layers::Linear>(7, 4, false));
  Problem(model_of(std::move(layers), 9), 5).check_all_parameters();
}

TEST_CASE("Linear with fused ReLU as the last layer masks its own gradient", "[cpu][grad]") {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<layers::Linear>(6, 5, true));
  Problem(model_of(std::move(layers), 6), 3).check_all_parameters();
}

TEST_CASE("standalone ReLU gradients match finite differences", "[cpu][grad]") {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<layers::Linear>(8, 6, false));
  layers.push_back(std::make_unique<layers::Relu>());
  layers.push_back(std::make_unique<layers::Linear>(6, 3, false));
  Problem(model_of(std::move(layers), 8), 4).check_all_parameters();
}

TEST_CASE("a two-hidden-layer MLP from a spec matches finite differences end to end", "[cpu][grad]") {
  Problem(layers::build_model("linear:7,relu,linear:5,relu,linear:3", Shape{1, 3, 3}, 3), 6).check_all_parameters();
}

TEST_CASE("SoftmaxCrossEntropy's dlogits match finite differences of the mean loss", "[cpu][grad]") {
  kernels::Exec exec;  // CPU, one thread
  const int B = 5, C = 7;
  auto wide = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  auto logits = wide(test::random_floats(B * C, -3.f, 3.f));
  auto labels = test::random_labels(B, C);
  auto mean_loss = [&] {
    double sum = 0;
    int64_t correct = 0;
    kernels::softmax_xent(exec, logits.data(), labels.data(), B, C, nullptr, &sum, &correct);
    return sum / B;
  };
  std::vector<double> dlogits(B * C, std::nan(""));
  double sum = 0;
  int64_t correct = 0;
  kernels::softmax_xent(exec, logits.data(), labels.data(), B, C, dlogits.data(), &sum, &correct);
  int skipped = 0;
  check_gradient(std::span<double>(logits), dlogits, mean_loss, [] { return 0; }, &skipped);
  CHECK(skipped == 0);
}

TEST_CASE("f64 tensors are refused on the GPU backend with a clear error", "[cpu][grad]") {
  kernels::Exec gpu;
  gpu.backend = kernels::Backend::cuda;
  double x = 1, y = 0;
  REQUIRE_THROWS_WITH(kernels::relu_forward(gpu, &x, &y, 1), Catch::Matchers::Contains("CPU backend only"));
}
