// Finite-difference gradient checks in double precision: every layer's backward against central
// differences of its own forward, with parameters, activations and kernels in f64 on the CPU backend
// (the same layer code and op API that train in fp32).
//
// With h = 1e-6 the quotient's rounding error is about |L|·eps_f64/h ≈ 1e-10 and its truncation error
// about h²·|L'''|/6 ≈ 1e-13 for these O(1) losses, so a tolerance of 1e-6 of the gradient's scale is
// loose for rounding yet catches any wrong formula (an O(1) error) or a lost 1/B (a factor). The absolute
// part, 1e-8, is that rounding error with headroom: it is all that is left where the true gradient is 0
// (a bias right before a BatchNorm, which the normalization cancels).
// A ReLU kink inside [p-h, p+h] makes the forward non-smooth there; such coordinates are detected (a
// ReLU input changes sign between the two evaluations) and skipped; with h = 1e-6 they are rare.
#include "test_support.h"

#include "engine/context.h"
#include "engine/model.h"
#include "kernels/activation.h"
#include "kernels/dropout.h"
#include "kernels/softmax_xent.h"
#include "layers/batchnorm.h"
#include "layers/builder.h"
#include "layers/conv2d.h"
#include "layers/conv_batchnorm_pool.h"
#include "layers/fusion.h"
#include "layers/linear.h"
#include "layers/pooling.h"
#include "layers/relu.h"
#include "layers/softmax_xent.h"

using namespace nt;

namespace {

constexpr double kStep = 1e-6;
constexpr test::Tolerance kTolerance{1e-8, 1e-6, "central differences in f64, h=1e-6"};

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
      check_gradient(
          value, analytic, [&] { return mean_loss(); }, [&] { return signs(); }, &skipped);
      total += static_cast<int>(value.size());
    }
    INFO(skipped << " of " << total << " coordinates skipped at ReLU kinks");
    CHECK(skipped * 20 <= total);
  }
};

std::unique_ptr<Model> model_of(std::vector<std::unique_ptr<Layer>> layers, Shape input) {
  for (size_t i = 0; i < layers.size(); ++i) layers[i]->sequential_index = static_cast<int>(i);
  auto fusions = layers::plan_fusions(layers, input);  // as build_model: the fused gradient paths are checked
  return std::make_unique<Model>("gradcheck", std::move(input), std::move(layers), layers::describe(fusions));
}
std::unique_ptr<Model> model_of(std::vector<std::unique_ptr<Layer>> layers, int64_t inputs) {
  return model_of(std::move(layers), Shape{inputs});
}

// A view to any shape of the same size (the inverse of Flatten), so that a parametrized layer can feed
// a layer whose input gradient would otherwise go unchecked (an NHWC BatchNorm).
class Unflatten final : public Layer {
 public:
  explicit Unflatten(Shape to) : to_(std::move(to)) {}
  std::string describe() const override { return "unflatten"; }
  Shape output_shape(const Shape& input) const override {
    REQUIRE(input.numel() == to_.numel());
    return to_;
  }
  bool is_view() const override { return true; }
  void forward(const kernels::Exec&, const Tensor&, const Tensor&, Mode) override {}
  void backward(const kernels::Exec&, const Tensor&, const Tensor&, const Tensor&, const Tensor*) override {}

 private:
  Shape to_;
};

template <class L, class... Args>
void add(std::vector<std::unique_ptr<Layer>>& layers, Args&&... args) {
  layers.push_back(std::make_unique<L>(std::forward<Args>(args)...));
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

// ---- CNN layers --------------------------------------------------------------------------------------
// Only parameter gradients are compared, so every layer under test sits behind a parametrized layer
// (a conv or linear) whose gradient is only right if the layer's input gradient is right.

TEST_CASE("Conv2d gradients match finite differences (stride 1 and 2, padding 0 and 1, 3x3 and 5x5)",
          "[cpu][grad][conv]") {
  std::vector<std::unique_ptr<Layer>> layers;
  add<layers::Conv2d>(layers, 2, 3, 3, 2, 1, true);   // (2,7,6) -> (3,4,3)
  add<layers::Conv2d>(layers, 3, 2, 3, 1, 0, false);  // -> (2,2,1): dx of this one is checked by the first
  add<layers::Flatten>(layers);
  add<layers::Linear>(layers, 4, 3, false);
  Problem(model_of(std::move(layers), Shape{2, 7, 6}), 2).check_all_parameters();

  std::vector<std::unique_ptr<Layer>> wide;
  add<layers::Conv2d>(wide, 1, 2, 5, 2, 2, true);  // (1,6,5) -> (2,3,3)
  add<layers::Conv2d>(wide, 2, 2, 3, 1, 1, true);  // -> (2,3,3)
  add<layers::Flatten>(wide);
  add<layers::Linear>(wide, 18, 3, false);
  Problem(model_of(std::move(wide), Shape{1, 6, 5}), 3).check_all_parameters();
}

TEST_CASE("MaxPool2d gradients match finite differences (2/2, overlapping 3/2, odd sizes)", "[cpu][grad][maxpool]") {
  std::vector<std::unique_ptr<Layer>> layers;
  add<layers::Conv2d>(layers, 2, 3, 3, 1, 1, true);  // (2,7,5) -> (3,7,5)
  add<layers::MaxPool2d>(layers, 2, 2);              // -> (3,3,2)
  add<layers::Flatten>(layers);
  add<layers::Linear>(layers, 18, 3, false);
  Problem(model_of(std::move(layers), Shape{2, 7, 5}), 2).check_all_parameters();

  std::vector<std::unique_ptr<Layer>> overlapping;
  add<layers::Conv2d>(overlapping, 1, 2, 3, 1, 1, true);  // (1,7,7) -> (2,7,7)
  add<layers::MaxPool2d>(overlapping, 3, 2);              // -> (2,3,3)
  add<layers::Flatten>(overlapping);
  add<layers::Linear>(overlapping, 18, 3, false);
  Problem(model_of(std::move(overlapping), Shape{1, 7, 7}), 2).check_all_parameters();
}

TEST_CASE("BatchNorm2d (NCHW) gradients match finite differences in training mode, with and without ReLU",
          "[cpu][grad][batchnorm]") {
  for (bool relu : {false, true}) {
    INFO("relu " << relu);
    std::vector<std::unique_ptr<Layer>> layers;
    add<layers::Conv2d>(layers, 2, 3, 3, 1, 1, false);  // (2,4,5) -> (3,4,5)
    add<layers::BatchNorm>(layers, 3, true, kernels::Layout::nchw, relu);
    add<layers::Flatten>(layers);
    add<layers::Linear>(layers, 60, 3, false);
    Problem(model_of(std::move(layers), Shape{2, 4, 5}), 3).check_all_parameters();
  }
}

TEST_CASE("BatchNorm2d with a fused max-pool: gradients match finite differences (odd sizes, windows 2 and 3)",
          "[cpu][grad][batchnorm]") {
  // 7x5 planes leave a row and a column (window 2) or more (window 3) outside every window: their dx comes
  // from the normalization alone.
  for (bool relu : {false, true})
    for (int window : {2, 3}) {
      INFO("relu " << relu << " window " << window);
      std::vector<std::unique_ptr<Layer>> layers;
      add<layers::Conv2d>(layers, 2, 3, 3, 1, 1, false);                                   // (2,7,5) -> (3,7,5)
      add<layers::BatchNorm>(layers, 3, true, kernels::Layout::nchw, relu, true, window);  // -> (3, 7/w, 5/w)
      add<layers::Flatten>(layers);
      add<layers::Linear>(layers, 3 * (7 / window) * (5 / window), 3, false);
      Problem(model_of(std::move(layers), Shape{2, 7, 5}), 3).check_all_parameters();
    }
}

TEST_CASE("BatchNorm2d (NHWC) gradients match finite differences in training mode", "[cpu][grad][batchnorm]") {
  for (bool relu : {false, true}) {
    INFO("relu " << relu);
    std::vector<std::unique_ptr<Layer>> layers;
    add<layers::Linear>(layers, 6, 3 * 2 * 4, false);  // -> (24), viewed as (H,W,C) = (3,2,4)
    add<Unflatten>(layers, Shape{3, 2, 4});
    add<layers::BatchNorm>(layers, 4, true, kernels::Layout::nhwc, relu);
    add<layers::Flatten>(layers);
    add<layers::Linear>(layers, 24, 3, false);
    Problem(model_of(std::move(layers), 6), 3).check_all_parameters();
  }
}

TEST_CASE("BatchNorm1d gradients match finite differences, affine and not", "[cpu][grad][batchnorm]") {
  for (bool affine : {true, false}) {
    INFO("affine " << affine);
    std::vector<std::unique_ptr<Layer>> layers;
    add<layers::Linear>(layers, 7, 5, false);
    add<layers::BatchNorm>(layers, 5, false, kernels::Layout::nchw, /*relu=*/true, affine);
    add<layers::Linear>(layers, 5, 3, false);
    Problem(model_of(std::move(layers), 7), 6).check_all_parameters();
  }
}

TEST_CASE("the fused conv + BatchNorm + max-pool stem matches finite differences (5x5 stride 2, 3 channels, window 3)",
          "[cpu][grad][batchnorm]") {
  // The builder fuses a leading conv, bn, [relu], maxpool; every parameter, conv weight included, is checked.
  struct Case {
    const char* spec;
    Shape input;
  };
  const Case cases[] = {{"conv:2:5:2:2,bn,relu,maxpool:2,flatten,linear:3", Shape{1, 9, 7}},  // (2,5,4) -> (2,2,2)
                        {"conv:3:3:1:1,bn,maxpool:3,flatten,linear:3", Shape{3, 7, 8}}};      // 27 taps, (3,2,2)
  for (const Case& c : cases) {
    INFO(c.spec);
    auto model = layers::build_model(c.spec, c.input, 3);
    REQUIRE(dynamic_cast<const layers::ConvBatchNormPool*>(model->layers()[0].get()) != nullptr);
    Problem(std::move(model), 3).check_all_parameters();
  }
}

TEST_CASE("the cnn spec's layers, scaled down, match finite differences end to end", "[cpu][grad]") {
  Problem(layers::build_model("conv:3:3,bn,relu,maxpool:2,conv:4:3,bn,relu,maxpool:2,flatten,linear:6,relu,linear:3",
                              Shape{1, 8, 8}, 3),
          4)
      .check_all_parameters();
}

TEST_CASE("Dropout's backward is the derivative of its forward for the drawn mask", "[cpu][grad][dropout]") {
  // Kernel level: with the draw counter rewound before every evaluation the mask is fixed, and
  // L = sum_i w_i * y_i has dL/dx = dropout_backward(w).
  kernels::Exec exec;
  const size_t n = 41;
  const float p = 0.3f;
  auto wide = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  auto x = wide(test::random_floats(n)), w = wide(test::random_floats(n));
  std::vector<double> y(n);
  std::vector<uint8_t> mask(n);
  uint64_t counter[2] = {0, 0};
  auto loss = [&] {
    counter[0] = 5;  // the same draw every time
    kernels::dropout_forward(
        exec, kernels::DropoutArgs<double>{
                  .n = n, .p = p, .seed = 1234, .counter = counter, .x = x.data(), .y = y.data(), .mask = mask.data()});
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += w[i] * y[i];
    return sum;
  };
  loss();
  std::vector<double> analytic(n, std::nan(""));
  kernels::dropout_backward(
      exec, kernels::DropoutArgs<double>{.n = n, .p = p, .mask = mask.data(), .dy = w.data(), .dx = analytic.data()});
  int skipped = 0;
  check_gradient(
      std::span<double>(x), analytic, loss, [] { return 0; }, &skipped);
  CHECK(skipped == 0);
  const auto kept = std::count(mask.begin(), mask.end(), uint8_t{1});
  CHECK(kept > 0);
  CHECK(kept < static_cast<long>(n));  // p = 0.3 over 41 elements: both kinds occur for this seed
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
    kernels::softmax_xent(
        exec,
        kernels::SoftmaxXentArgs<double>{
            .B = B, .C = C, .logits = logits.data(), .labels = labels.data(), .loss_sum = &sum, .correct = &correct});
    return sum / B;
  };
  std::vector<double> dlogits(B * C, std::nan(""));
  double sum = 0;
  int64_t correct = 0;
  kernels::softmax_xent(exec, kernels::SoftmaxXentArgs<double>{.B = B,
                                                               .C = C,
                                                               .logits = logits.data(),
                                                               .labels = labels.data(),
                                                               .dlogits = dlogits.data(),
                                                               .loss_sum = &sum,
                                                               .correct = &correct});
  int skipped = 0;
  check_gradient(
      std::span<double>(logits), dlogits, mean_loss, [] { return 0; }, &skipped);
  CHECK(skipped == 0);
}

TEST_CASE("f64 tensors are refused on the GPU backend with a clear error", "[cpu][grad]") {
  kernels::Exec gpu;
  gpu.backend = kernels::Backend::cuda;
  double x = 1, y = 0;
  REQUIRE_THROWS_WITH(kernels::relu_forward(gpu, kernels::ReluArgs<double>{.n = 1, .x = &x, .y = &y}),
                      test::Contains("CPU backend only"));
}
