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
  // As for the mlp (test_training_cuda.cpp): plain SGD, both backends summing in fp32 in different orders,
  // so the weights drift apart by a few ulps per step; 1e-4 relative leaves room for 50 steps of that.
  test::RigOptions sgd;
  sgd.model = "cnn";
  sgd.sgd = {0.03f, 0.f, 0.f};
  WARN("cnn, plain sgd: largest relative loss difference over 50 steps " << compare_backends(sgd, 50, 1e-4));

  // Momentum 0.9 carries each step's rounding difference into the next ~1/(1 - 0.9) = 10 updates (measured:
  // 3.6e-4 at step 32 on the H100), and Adam divides by sqrt(v), so a gradient coordinate near 0 moves by
  // about lr whatever its rounding. Both get 10x the room, 1e-3, which a wrong kernel (an O(1) error in
  // one term) still exceeds within a few steps.
  test::RigOptions momentum = sgd;
  momentum.sgd = {0.03f, 0.9f, 0.f};
  WARN("cnn, sgd momentum 0.9: largest relative loss difference over 50 steps "
       << compare_backends(momentum, 50, 1e-3));
  test::RigOptions adam = sgd;
  adam.optimizer = OptimizerConfig{"adam", 1e-3};
  WARN("cnn, adam: largest relative loss difference over 50 steps " << compare_backends(adam, 50, 1e-3));
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
