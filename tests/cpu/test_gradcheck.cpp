// Finite-difference gradient checks: every layer's backward against central differences of its own
// forward, on the CPU backend.
//
// The layers compute in fp32 (the engine's one dtype); the loss is summed and the difference quotient
// formed in double. With h = 1e-3 the quotient's rounding error is about |L|·eps_f32/h ≈ 2e-4 and its
// truncation error about h²·|L'''|/6 ≈ 2e-7 for these O(1) losses, so a tolerance of 2e-3 of the
// gradient's scale separates rounding from a wrong formula (an O(1) error). A ReLU kink inside
// [p-h, p+h] makes the forward non-smooth there; such coordinates are detected (some ReLU input changes
// sign between the two evaluations) and skipped, and the test requires that they stay rare.
#include "test_support.h"

#include "engine/context.h"
#include "engine/model.h"
#include "kernels/softmax_xent.h"
#include "layers/builder.h"
#include "layers/linear.h"
#include "layers/relu.h"
#include "layers/softmax_xent.h"

using namespace nt;

namespace {

constexpr double kStep = 1e-3;
constexpr double kRelTol = 2e-3;

struct Problem {
  Context ctx{ContextOptions{"cpu", 1, false}};
  std::unique_ptr<Model> model;
  layers::SoftmaxCrossEntropy loss;
  Arena arena;
  Tensor labels;
  LossTotals totals;
  std::vector<float> x;
  int batch;

  Problem(std::unique_ptr<Model> m, int b) : model(std::move(m)), batch(b) {
    model->init_params(ctx, 11);
    model->compile(ctx, batch);
    ArenaPlan plan;
    plan.request(&labels, Shape{batch}, DType::i32);
    plan.request(&totals.loss_sum, Shape{1}, DType::f64);
    plan.request(&totals.correct, Shape{1}, DType::i64);
    arena = plan.commit(ctx.exec());
    x = test::random_floats(static_cast<size_t>(model->input().numel()), -1.f, 1.f);
    auto y = test::random_labels(static_cast<size_t>(batch), static_cast<int>(model->output_shape()[0]));
    std::copy(y.begin(), y.end(), labels.i32());
    std::copy(x.begin(), x.end(), model->input().f32());
  }

  double loss_value() {
    model->forward(ctx.exec(), batch, Mode::train);
    *totals.loss_sum.data<double>() = 0;
    loss.apply(ctx.exec(), model->output(), labels, nullptr, totals);
    return *totals.loss_sum.data<double>() / batch;  // the mean loss, whose gradient backward computes
  }

  void analytic_gradients() {
    model->forward(ctx.exec(), batch, Mode::train);
    Tensor dlogits = model->output_grad();
    loss.apply(ctx.exec(), model->output(), labels, &dlogits, totals);
    model->backward(ctx.exec(), batch);
  }

  // Sign pattern of every layer's output: changes when a perturbation crosses a ReLU kink.
  std::vector<bool> signs() const {
    std::vector<bool> s;
    for (size_t i = 1; i <= model->layers().size(); ++i) {
      const Tensor& a = model->activation(i);
      for (int64_t j = 0; j < a.numel(); ++j) s.push_back(a.f32()[j] > 0);
    }
    return s;
  }
};

// Checks every parameter gradient of the problem's model against central differences.
void check_all_parameters(Problem& p) {
  p.analytic_gradients();
  int checked = 0, skipped = 0;
  for (auto& param : p.model->params().params()) {
    std::vector<float> analytic(param.grad.f32(), param.grad.f32() + param.grad.numel());
    std::vector<double> numeric(analytic.size());
    for (size_t i = 0; i < analytic.size(); ++i) {
      float& w = param.value.f32()[i];
      const float saved = w;
      w = static_cast<float>(saved + kStep);
      const double plus = p.loss_value();
      auto signs_plus = p.signs();
      w = static_cast<float>(saved - kStep);
      const double minus = p.loss_value();
      auto signs_minus = p.signs();
      w = saved;
      const double h2 = static_cast<double>(static_cast<float>(saved + kStep)) - static_cast<float>(saved - kStep);
      if (signs_plus != signs_minus) {  // a ReLU kink lies between: the quotient means nothing here
        numeric[i] = analytic[i];
        ++skipped;
        continue;
      }
      numeric[i] = (plus - minus) / h2;
      ++checked;
    }
    INFO("parameter " << param.name);
    NT_REQUIRE_CLOSE(analytic, numeric, (test::Tolerance{1e-6, kRelTol, "central differences of an fp32 forward, h=1e-3"}));
  }
  INFO(checked << " coordinates checked, " << skipped << " skipped at ReLU kinks");
  CHECK(checked > 0);
  CHECK(skipped * 10 <= checked);
}

std::unique_ptr<Model> model_of(std::vector<std::unique_ptr<Layer>> layers, int64_t inputs) {
  for (size_t i = 0; i < layers.size(); ++i) layers[i]->sequential_index = static_cast<int>(i);
  return std::make_unique<Model>("gradcheck", Shape{inputs}, std::move(layers));
}

}  // namespace

TEST_CASE("Linear gradients match finite differences", "[cpu][grad]") {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<layers::Linear>(9, 5, false));
  Problem p(model_of(std::move(layers), 9), 4);
  check_all_parameters(p);
}

TEST_CASE("Linear with fused ReLU gradients match finite differences", "[cpu][grad]") {
  // Linear(+relu) then Linear: the second layer's input-gradient GEMM applies the first one's ReLU mask.
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<layers::Linear>(9, 7, true));
  layers.push_back(std::make_unique<layers::Linear>(7, 4, false));
  Problem p(model_of(std::move(layers), 9), 5);
  check_all_parameters(p);
}

TEST_CASE("Linear with fused ReLU as the last layer masks its own gradient", "[cpu][grad]") {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<layers::Linear>(6, 5, true));
  Problem p(model_of(std::move(layers), 6), 3);
  check_all_parameters(p);
}

TEST_CASE("standalone ReLU gradients match finite differences", "[cpu][grad]") {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<layers::Linear>(8, 6, false));
  layers.push_back(std::make_unique<layers::Relu>());
  layers.push_back(std::make_unique<layers::Linear>(6, 3, false));
  Problem p(model_of(std::move(layers), 8), 4);
  check_all_parameters(p);
}

TEST_CASE("a two-hidden-layer MLP from a spec matches finite differences end to end", "[cpu][grad]") {
  Problem p(layers::build_model("linear:7,relu,linear:5,relu,linear:3", Shape{1, 3, 3}, 3), 6);
  check_all_parameters(p);
}

TEST_CASE("SoftmaxCrossEntropy's dlogits match finite differences of the mean loss", "[cpu][grad]") {
  kernels::Exec exec;  // CPU, one thread
  const int B = 5, C = 7;
  auto logits = test::random_floats(B * C, -3.f, 3.f);
  auto labels = test::random_labels(B, C);
  auto mean_loss = [&](const std::vector<float>& z) {
    double sum = 0;
    int64_t correct = 0;
    kernels::softmax_xent(exec, z.data(), labels.data(), B, C, nullptr, &sum, &correct);
    return sum / B;
  };
  std::vector<float> dlogits = test::poisoned(B * C);
  double sum = 0;
  int64_t correct = 0;
  kernels::softmax_xent(exec, logits.data(), labels.data(), B, C, dlogits.data(), &sum, &correct);
  std::vector<double> numeric(dlogits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    auto z = logits;
    z[i] = logits[i] + static_cast<float>(kStep);
    const double plus = mean_loss(z);
    z[i] = logits[i] - static_cast<float>(kStep);
    const double minus = mean_loss(z);
    const double h2 = static_cast<double>(logits[i] + static_cast<float>(kStep)) - (logits[i] - static_cast<float>(kStep));
    numeric[i] = (plus - minus) / h2;
  }
  NT_REQUIRE_CLOSE(dlogits, numeric, (test::Tolerance{1e-6, kRelTol, "central differences of an fp32 loss, h=1e-3"}));
}
