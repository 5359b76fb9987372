// End-to-end on the GPU for the cnn: it trains like the CPU reference, deterministically, and its step
// captures into a CUDA graph with no allocation or synchronization.
#include "test_support.h"

#include <cstring>

#include "rig.h"

using namespace nt;

namespace {

// Runs `steps` steps on both backends from the same weights and data order; returns the worst relative
// loss difference and requires each step within `bound`.
double compare_backends(test::RigOptions o, int steps, double bound) {
  auto train = data::subset(test::mnist().train, 0, steps * o.batch);
  test::RigOptions g = o;
  g.device = "cuda";
  test::Rig cpu(train, o), gpu(train, g);
  REQUIRE(cpu.weights() == gpu.weights());
  double worst = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const double lc = cpu.step(s), lg = gpu.step(s);
    const double rel = std::abs(lc - lg) / std::abs(lc);
    worst = std::max(worst, rel);
    INFO("step " << s << ": cpu loss " << lc << ", gpu loss " << lg);
    REQUIRE(rel <= bound);
  }
  return worst;
}

}  // namespace

TEST_CASE("50 cnn steps on GPU and CPU give the same losses from the same weights and data", "[cuda][cnn]") {
  // Both backends sum in fp32 in different orders (split-K conv weight gradients over N*P*Q = 50,176 terms,
  // BatchNorm statistics over as many), so the weights drift apart by rounding each step. The cnn's first
  // steps amplify that more than the mlp's: BatchNorm divides by batch statistics and the loss is still
  // near its start (measured on the H100: 9.5e-4 relative at step 9 with plain SGD, 3.6e-4 with momentum).
  // 2e-3 leaves room for that, and still fails any wrong kernel, whose O(1) error shows within a step.
  test::RigOptions sgd;
  sgd.model = "cnn";
  sgd.sgd = {0.03f, 0.f, 0.f};
  WARN("cnn, plain sgd: largest relative loss difference over 50 steps " << compare_backends(sgd, 50, 2e-3));

  // The same bound with momentum 0.9 and with Adam (which moves a near-zero gradient coordinate by about
  // lr whatever its rounding).
  test::RigOptions momentum = sgd;
  momentum.sgd = {0.03f, 0.9f, 0.f};
  WARN("cnn, sgd momentum 0.9: largest relative loss difference over 50 steps "
       << compare_backends(momentum, 50, 2e-3));
  test::RigOptions adam = sgd;
  adam.optimizer = OptimizerConfig{"adam", 1e-3};
  WARN("cnn, adam: largest relative loss difference over 50 steps " << compare_backends(adam, 50, 2e-3));
}

TEST_CASE("dropout draws the same masks on GPU and CPU, step after step", "[cuda][cnn][dropout]") {
  test::RigOptions o;
  o.model = "conv:8:3,bn,relu,maxpool:2,flatten,dropout:0.5,linear:64,relu,dropout:0.2,linear:10";
  o.sgd = {0.05f, 0.f, 0.f};
  WARN("dropout model: largest relative loss difference over 20 steps " << compare_backends(o, 20, 1e-4));
}

TEST_CASE("two GPU cnn runs with the same seed give bit-identical weights, with and without graphs",
          "[cuda][cnn][determinism]") {
  auto train = data::subset(test::mnist().train, 0, 3200);
  auto run = [&](bool graphs) {
    test::RigOptions o;
    o.device = "cuda";
    o.model = "conv:16:3,bn,relu,maxpool:2,conv:16:3,bn,relu,maxpool:2,flatten,dropout:0.25,linear:32,relu,linear:10";
    o.seed = 7;
    o.optimizer = OptimizerConfig{"adamw", 1e-3, 0, 0.01};
    o.use_graphs = graphs;
    test::Rig rig(train, o);
    rig.trainer.train_epoch(1);
    rig.trainer.train_epoch(2);
    auto w = rig.weights();
    for (const auto& b : rig.model->params().buffers()) {  // the running statistics must match too
      if (b.value.dtype() != DType::f32) continue;
      auto v = b.value.to_host<float>(rig.ctx.exec());
      w.insert(w.end(), v.begin(), v.end());
    }
    return w;
  };
  auto a = run(true), b = run(true), eager = run(false);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.data(), eager.data(), a.size() * sizeof(float)) == 0);
}

TEST_CASE("a cnn training step allocates nothing and never synchronizes", "[cuda][cnn][capture]") {
  auto train = data::subset(test::mnist().train, 0, 640);
  test::RigOptions o;
  o.device = "cuda";
  o.model = "cnn";
  o.optimizer = OptimizerConfig{"adam", 1e-3};
  test::Rig rig(train, o);
  const auto allocations = kernels::device_alloc_count();
  kernels::Graph graph = kernels::Graph::capture(rig.ctx.exec(), [&] { rig.trainer.enqueue_train_step(0); });
  CHECK(kernels::device_alloc_count() == allocations);
  graph.launch(rig.ctx.exec());
  auto [loss, accuracy] = rig.trainer.read_train_totals(1);
  CHECK(std::isfinite(loss));
  CHECK(loss > 0);
}

TEST_CASE("the cnn trains on the GPU past 95% on 6,400 images in one epoch", "[cuda][cnn]") {
  auto train = data::subset(test::mnist().train, 0, 6400);
  test::RigOptions o;
  o.device = "cuda";
  o.model = "cnn";
  o.optimizer = OptimizerConfig{"adam", 1e-3};
  test::Rig rig(train, o);
  data::DeviceBatcher test_data(rig.ctx, test::mnist().test, false, 1);
  EpochMetrics m = rig.trainer.run_epoch(1, &test_data);
  INFO("test accuracy " << m.test_acc);
  CHECK(m.test_acc >= 0.95);
}
