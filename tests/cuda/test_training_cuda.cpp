// End-to-end on the GPU: the CUDA backend trains like the CPU reference, deterministically, and a
// training step is free of allocation and synchronization (it captures into a CUDA graph).
#include "test_support.h"

#include <chrono>
#include <cstring>

#include "rig.h"

using namespace nt;

TEST_CASE("200 mlp steps on GPU and CPU give the same losses from the same weights and data", "[cuda][training]") {
  auto train = data::subset(test::mnist().train, 0, 200 * 64);
  test::RigOptions o;
  o.sgd = {0.03f, 0.f, 0.f};
  test::RigOptions g = o;
  g.device = "cuda";
  test::Rig cpu(train, o), gpu(train, g);
  REQUIRE(cpu.weights() == gpu.weights());
  // Both backends sum in fp32 but in different orders (blocked CPU GEMM vs tiled GPU GEMM), so the
  // weights drift apart by rounding, a few ulps per step, and the losses with them. 1e-4 relative
  // is ~800 ulps of fp32: room for 200 steps of that drift, far below what a wrong kernel causes.
  double worst = 0;
  for (int64_t s = 0; s < 200; ++s) {
    const double lc = cpu.step(s), lg = gpu.step(s);
    const double rel = std::abs(lc - lg) / std::abs(lc);
    worst = std::max(worst, rel);
    INFO("step " << s << ": cpu loss " << lc << ", gpu loss " << lg);
    REQUIRE(rel <= 1e-4);
  }
  WARN("largest relative loss difference over 200 steps: " << worst);
}

TEST_CASE("two GPU runs with the same seed give bit-identical weights", "[cuda][training][determinism]") {
  auto train = data::subset(test::mnist().train, 0, 6400);
  auto run = [&](bool graphs) {
    test::RigOptions o;
    o.device = "cuda";
    o.seed = 5;
    o.sgd = {0.05f, 0.9f, 1e-4f};
    o.use_graphs = graphs;
    test::Rig rig(train, o);
    rig.trainer.train_epoch(1);
    rig.trainer.train_epoch(2);
    return rig.weights();
  };
  auto a = run(true), b = run(true), eager = run(false);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.data(), eager.data(), a.size() * sizeof(float)) == 0);
}

TEST_CASE("a training step allocates nothing and never synchronizes", "[cuda][training][capture]") {
  auto train = data::subset(test::mnist().train, 0, 640);
  test::RigOptions o;
  o.device = "cuda";
  test::Rig rig(train, o);
  const auto allocations = kernels::device_alloc_count();
  // Global-mode capture fails on any synchronizing or allocating CUDA call inside the step.
  kernels::Graph graph = kernels::Graph::capture(rig.ctx.exec(), [&] { rig.trainer.enqueue_train_step(0); });
  CHECK(kernels::device_alloc_count() == allocations);
  CHECK(graph.node_count() >= 7);  // gather, 2 forward GEMMs, the fused head, 3 backward GEMMs, update
  graph.launch(rig.ctx.exec());
  auto [loss, accuracy] = rig.trainer.read_train_totals(1);
  CHECK(std::isfinite(loss));
  CHECK(loss > 0);
}

TEST_CASE("progress is told at every mark of a GPU epoch, replayed or eager, and changes no bit",
          "[cuda][training][progress]") {
  test::check_progress_is_told("cuda", /*use_graphs=*/true);
  test::check_progress_is_told("cuda", /*use_graphs=*/false);
}

TEST_CASE("a replayed epoch tells its progress as the GPU passes the marks, at the GPU's pace",
          "[cuda][training][progress]") {
  // A whole MNIST epoch of the mlp (937 steps, ~30 ms on an H100): told only at the end, the 50 reports would come
  // within microseconds of each other; told as the device passes each mark, they spread over the epoch.
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> told;
  EpochProgress last;
  test::RigOptions o;
  o.device = "cuda";
  o.on_progress = [&](const EpochProgress& p) {
    told.push_back(Clock::now());
    last = p;
  };
  test::Rig rig(test::mnist().train, o);
  rig.trainer.train_epoch(1);  // captures the graph
  told.clear();
  const auto start = Clock::now();
  const EpochMetrics m = rig.trainer.train_epoch(2);
  const auto end = Clock::now();
  REQUIRE(told.size() == static_cast<size_t>(Trainer::kProgressMarks));
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  INFO("epoch " << ms(end - start) << " ms; first report at " << ms(told.front() - start) << " ms, last at "
                << ms(told.back() - start) << " ms");
  CHECK(ms(told.back() - told.front()) > 0.5 * ms(end - start));
  // The device's pace over the epoch (the last report's) is the epoch's: within 20% of its wall time per step,
  // which also counts the launch, the first mark's 2% and reading the totals back.
  const double wall_per_step = m.epoch_ms / static_cast<double>(last.steps);
  INFO("device pace " << last.ms_per_step << " ms a step; the epoch's wall time " << wall_per_step << " ms a step");
  CHECK(last.ms_per_step > 0.8 * wall_per_step);
  CHECK(last.ms_per_step < 1.2 * wall_per_step);
}

TEST_CASE("the mlp trains on the GPU past 90% on 5,000 images in one epoch", "[cuda][training]") {
  auto train = data::subset(test::mnist().train, 0, 5000);
  test::RigOptions o;
  o.device = "cuda";
  o.batch = 16;
  o.sgd = {0.1f, 0.f, 0.f};  // the CPU test's recipe
  test::Rig rig(train, o);
  data::DeviceBatcher test_data(rig.ctx, test::mnist().test, false, 1);
  EpochMetrics m = rig.trainer.run_epoch(1, &test_data);
  INFO("test accuracy " << m.test_acc);
  CHECK(m.test_acc >= 0.90);
}

TEST_CASE("a diverging run on the GPU stops with exit code 3 and keeps the checkpoint", "[cuda][nonfinite]") {
  nt::test::check_divergence_stops_the_run("cuda");
}
