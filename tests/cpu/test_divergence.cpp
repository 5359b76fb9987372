// Divergence, found after the fact (engine/divergence.h): the non-finite count (kernels/nonfinite.h), the first bad
// tensor of a model, and what a diverging run does (exit code 3, nothing saved over --save, JSON metrics).
#include "test_support.h"

#include <cmath>
#include <limits>

#include "engine/context.h"
#include "engine/divergence.h"
#include "kernels/nonfinite.h"
#include "layers/builder.h"

using namespace nt;

TEST_CASE("count_nonfinite counts NaN and both infinities, not the largest or smallest finite floats",
          "[cpu][nonfinite]") {
  const kernels::Exec cpu;
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
  std::vector<float> x(100'001, 1.f);
  x[0] = kNan, x[17] = kInf, x[50'000] = -kInf, x[100'000] = kNan;
  x[3] = std::numeric_limits<float>::max(), x[4] = -std::numeric_limits<float>::max();
  x[5] = std::numeric_limits<float>::denorm_min();
  int64_t count = 10;
  kernels::count_nonfinite(cpu, {.x = x.data(), .n = int64_t(x.size()), .count = &count});
  CHECK(count == 14);  // 10 before, 4 found
  kernels::count_nonfinite(cpu, {.x = x.data(), .n = 0, .count = &count});
  CHECK(count == 14);
}

TEST_CASE("the first non-finite tensor of a model is named in layer order, values before gradients",
          "[cpu][nonfinite]") {
  Context ctx({"cpu", 2, false});
  auto model = layers::build_model("mlp", Shape{1, 28, 28}, 10);
  model->init_params(ctx, 1);
  CHECK_FALSE(first_nonfinite_tensor(ctx, *model).has_value());

  auto& params = model->params().params();
  const auto& last_bias = params.back();  // "4.bias"
  last_bias.grad.f32()[3] = std::numeric_limits<float>::infinity();
  auto found = first_nonfinite_tensor(ctx, *model);
  REQUIRE(found.has_value());
  CHECK(found->name == last_bias.name + " (gradient)");
  CHECK(found->count == 1);

  params[2].value.f32()[7] = std::numeric_limits<float>::quiet_NaN();  // "2.weight", a value: before any gradient
  params[2].value.f32()[8] = std::numeric_limits<float>::quiet_NaN();
  found = first_nonfinite_tensor(ctx, *model);
  REQUIRE(found.has_value());
  CHECK(found->name == params[2].name);
  CHECK(found->describe() ==
        params[2].name + ": 2 of " + std::to_string(params[2].value.numel()) + " values are NaN or infinite");
}

TEST_CASE("a diverging run on the CPU stops with exit code 3 and keeps the checkpoint", "[cpu][nonfinite][cli]") {
  test::check_divergence_stops_the_run("cpu");
}

TEST_CASE("a finite loss far beyond guessing is reported each epoch, and the run goes on", "[cpu][nonfinite][cli]") {
  // Adam at --lr 1e6 reaches training losses near 1e22 without a NaN.
  const auto r = test::run_command(cat(test::cli_path(), " train --device cpu --data ", test::mnist_dir(),
                                       " --train-limit 1280 --epochs 2 --optimizer adam --lr 1e6 --log-level warn"));
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("epoch   2 |") != std::string::npos);
  for (const char* epoch : {"epoch 1: train loss ", "epoch 2: train loss "}) {
    const size_t at = r.out.find(std::string("[warning] ") + epoch);
    REQUIRE(at != std::string::npos);
    CHECK(r.out.find(" is over 100 times that of guessing (2.30): the run is diverging; try a lower --lr", at) !=
          std::string::npos);
  }
  // A run that learns says nothing of the kind.
  const auto fine = test::run_command(cat(test::cli_path(), " train --device cpu --data ", test::mnist_dir(),
                                          " --train-limit 1280 --epochs 1 --log-level warn"));
  CHECK(fine.exit_code == 0);
  CHECK(fine.out.find("diverging") == std::string::npos);
}
