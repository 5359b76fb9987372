// The launch-stamps timer on the GPU (profile/launch_stamps.h), in a profiling build (NT_LAUNCH_STAMPS, the kernels'
// stamping twins): the ring reaches the kernels only while the profiler runs, kernels of known length replayed from a
// graph read their lengths, a kernel beside its predecessor extends the stream only by what it adds, CUPTI's records
// of the same replay agree, eager launches are counted without a time, a sampled graph times its sampled steps alone,
// the twins compute the plain kernels' bits, and a real mlp epoch replayed under the timer, every step or sampled,
// has every timed kernel under its phase and layer. In the default build the timer refuses with a message that names
// the build option.
//
// Tolerances. %globaltimer ticks every 32 ns on an H100. A kernel's end is seen when its successor's wait returns,
// which comes a fraction of a microsecond after the end; the spins run on one thread of one block, whose exit and the
// release of the successor's wait add well under a microsecond: so a spin of X us reads X to X + 2 us. CUPTI reads
// the same kernels' ends at their last block's exit: the two timers agree within 1 us per kernel.
#include "test_support.h"

#include <array>
#include <cmath>
#include <string>

#include "data/batcher.h"
#include "gpu_timer.h"
#include "kernels/runtime.h"
#include "profile/kernel_profiler.h"
#include "profile/launch_stamps.h"
#include "profile/scope.h"
#include "rig.h"
#include "tests/cuda/timeline_kernels.h"

using namespace nt;

namespace {

profile::ProfilerOptions graph_timer(profile::Timing timing) { return test::gpu_timer(timing, /*graphs=*/true); }

struct Spin {
  const char* name;
  int micros;
  bool beside;
};
// b runs 20 us; c, beside it, 3 us, so it ends long before b: b's end is c's release, and c adds nearly nothing.
constexpr std::array<Spin, 4> kSpins{
    {{"spin_a", 5, false}, {"spin_b", 20, false}, {"spin_c", 3, true}, {"spin_d", 10, false}}};

// The spins captured as one graph under `timing` and replayed `replays` times; the profiler's launches.
profile::ProfileData replay_spins(profile::Timing timing, int replays) {
  test::StreamExec s;
  for (const Spin& spin : kSpins) test::launch_spin(s.exec, spin.name, 1, spin.beside);  // loads the module
  kernels::synchronize(s.exec);
  profile::KernelProfiler profiler(graph_timer(timing));
  s.exec.observer = &profiler;
  profiler.start();
  const kernels::Graph graph = kernels::Graph::capture(s.exec, [&] {
    for (const Spin& spin : kSpins) test::launch_spin(s.exec, spin.name, spin.micros, spin.beside);
  });
  for (int r = 0; r < replays; ++r) graph.launch(s.exec);
  profiler.stop();
  s.exec.observer = nullptr;
  return profiler.data();
}

// Whether this build and device can run the timer; says why not.
bool stamps_run() {
  if (!profile::launch_stamps_available()) {
    WARN("this build's kernels do not stamp (NT_LAUNCH_STAMPS off): skipped");
    return false;
  }
  if (!test::cuda_device().has_programmatic_launch()) {
    WARN("launch stamps need programmatic launch; " << test::cuda_device().code_path() << ": skipped");
    return false;
  }
  return true;
}

}  // namespace

TEST_CASE("launch stamps: a build without them refuses the timer and names the option", "[cuda][profile][stamps]") {
  if (profile::launch_stamps_available()) return;
  try {
    profile::KernelProfiler profiler(graph_timer(profile::Timing::stamps));
    FAIL("the stamps timer was accepted by a build whose kernels do not stamp");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("NT_LAUNCH_STAMPS") != std::string::npos);
  }
}

TEST_CASE("launch stamps: a launch is given the ring only when the profiler stamps it", "[cuda][profile][stamps]") {
  if (!stamps_run()) return;
  const profile::ProfilerOptions options = graph_timer(profile::Timing::stamps);
  profile::KernelProfiler profiler(options);
  CHECK_FALSE(profiler.times_with_launch_stamps());  // before start(): launches run the plain kernels
  CHECK(profiler.launch_stamp_ring().slots == nullptr);
  profiler.start();
  CHECK(profiler.times_with_launch_stamps());
  profiler.begin("eager", nullptr);  // an eager launch: nothing would see its end
  CHECK(profiler.launch_stamp_ring().slots == nullptr);
  profiler.end("eager", nullptr, {});
  profiler.capture_begin();
  profiler.begin("captured", nullptr);  // every step is timed: a captured launch runs its twin with the ring
  const profile::LaunchStampRing ring = profiler.launch_stamp_ring();
  CHECK(ring.slots != nullptr);
  CHECK(ring.count != nullptr);
  CHECK(ring.capacity == options.launch_stamp_capacity);
  profiler.end("captured", nullptr, {});
  CHECK(profiler.launch_stamp_ring().slots == nullptr);  // only between its begin() and end()
  profiler.capture_end();
  profiler.stop();
  CHECK_FALSE(profiler.times_with_launch_stamps());  // a graph replayed after stop() writes nowhere

  profile::KernelProfiler cupti(graph_timer(profile::Timing::cupti));
  cupti.start();
  CHECK_FALSE(cupti.times_with_launch_stamps());  // another timer: the kernels never stamp
  cupti.capture_begin();
  cupti.begin("captured", nullptr);
  CHECK(cupti.launch_stamp_ring().slots == nullptr);
  cupti.end("captured", nullptr, {});
  cupti.capture_end();
  cupti.stop();
}

TEST_CASE("launch stamps: kernels of known length replayed from a graph read their lengths",
          "[cuda][profile][stamps]") {
  if (!stamps_run()) return;
  constexpr int kReplays = 3;
  const profile::ProfileData stamped = replay_spins(profile::Timing::stamps, kReplays);
  CHECK(stamped.timer == "launch stamps");
  CHECK(stamped.launches_without_record == 0);
  REQUIRE(stamped.launches().size() == kSpins.size() * kReplays);  // the closing launches are no rows
  for (size_t i = 0; i < stamped.launches().size(); ++i) {
    const Spin& spin = kSpins[i % kSpins.size()];
    const profile::Launch& l = stamped.launches()[i];
    INFO(spin.name << " of replay " << i / kSpins.size() << ": exclusive " << l.exclusive_us << " us, span "
                   << l.span_us << " us");
    CHECK(stamped.name(l.kernel) == spin.name);
    CHECK(l.span_us >= l.exclusive_us);
    if (spin.beside) {
      CHECK(l.exclusive_us >= 0);
      CHECK(l.exclusive_us < 2.0);  // ended inside its predecessor's time: adds only its exit
    } else {
      CHECK(l.exclusive_us >= spin.micros - 0.05);
      CHECK(l.exclusive_us < spin.micros + 2.0);
    }
  }

  SECTION("CUPTI's records of the same replays agree") {
    const profile::ProfileData recorded = replay_spins(profile::Timing::cupti, kReplays);
    REQUIRE(recorded.launches().size() == stamped.launches().size());
    for (size_t i = 0; i < recorded.launches().size(); ++i) {
      const double ours = stamped.launches()[i].exclusive_us, cupti = recorded.launches()[i].exclusive_us;
      INFO(kSpins[i % kSpins.size()].name << ": stamps " << ours << " us, cupti " << cupti << " us");
      CHECK(std::abs(ours - cupti) < 1.0);
    }
  }
}

TEST_CASE("launch stamps: eager launches are counted without a time, phases still come back",
          "[cuda][profile][stamps]") {
  if (!stamps_run()) return;
  test::StreamExec s;
  const std::array<int, 2> phases{15, 5};
  test::launch_phased_spin(s.exec, phases.data(), 2);
  kernels::synchronize(s.exec);
  profile::KernelProfiler profiler(graph_timer(profile::Timing::stamps));
  s.exec.observer = &profiler;
  profiler.start();
  test::launch_spin(s.exec, "eager", 2);  // no replay after it sees its end
  const kernels::Graph graph = kernels::Graph::capture(s.exec, [&] {
    test::launch_phased_spin(s.exec, phases.data(), 2);
    test::launch_spin(s.exec, "after", 4);
  });
  graph.launch(s.exec);
  graph.launch(s.exec);
  test::launch_spin(s.exec, "eager", 2);
  profiler.stop();
  s.exec.observer = nullptr;

  const auto& d = profiler.data();
  CHECK(d.launches_without_record == 2);
  REQUIRE(d.launches().size() == 4);
  CHECK(d.stamps_lost == 0);
  CHECK(d.parts().size() == 4);  // two phases in each of two replays
  for (const auto& r : d.rows()) {
    INFO(r.kernel << " " << r.part << ": " << r.avg_us() << " us");
    if (r.part == "phase 0") CHECK(r.min_us >= 15 - 0.05);
    if (r.part == "phase 1") CHECK(r.min_us >= 5 - 0.05);
    if (r.kernel == "after" && r.part.empty()) CHECK(r.min_us >= 4 - 0.05);
  }
}

TEST_CASE("launch stamps: a sampled graph times its sampled steps, each with its lead-in and the launch after it",
          "[cuda][profile][stamps]") {
  if (!stamps_run()) return;
  // 8 steps of two spins, a launch before them and one after; 1 step in 4 sampled: steps 3 and 7 of each replay are
  // timed, steps 2 and 6 stamp uncounted (their lead-ins), and so do the first launch after each (step 4's first,
  // the one after the steps); the rest run the plain kernels and leave no stamp.
  constexpr int kSteps = 8, kEvery = 4, kReplays = 2;
  test::StreamExec s;
  test::launch_spin(s.exec, "warm", 1);
  kernels::synchronize(s.exec);
  profile::ProfilerOptions options = graph_timer(profile::Timing::stamps);
  options.sample_every = kEvery;
  profile::KernelProfiler profiler(options);
  s.exec.observer = &profiler;
  profiler.start();
  const kernels::Graph graph = kernels::Graph::capture(s.exec, [&] {
    test::launch_spin(s.exec, "before", 2);
    for (int step = 0; step < kSteps; ++step) {
      profile::StepScope scope("step");
      test::launch_spin(s.exec, "a", 3);
      test::launch_spin(s.exec, "b", 6);
    }
    test::launch_spin(s.exec, "after", 2);
  });
  for (int r = 0; r < kReplays; ++r) graph.launch(s.exec);
  profiler.stop();
  s.exec.observer = nullptr;

  const auto& d = profiler.data();
  CHECK(d.sample_every == kEvery);
  CHECK(d.steps == kSteps * kReplays);
  CHECK(d.sampled_steps == kSteps / kEvery * kReplays);
  CHECK(d.launches_without_record == 0);
  REQUIRE(d.launches().size() == 2 * kSteps / kEvery * kReplays);  // a and b of the sampled steps, nothing else
  for (size_t i = 0; i < d.launches().size(); ++i) {
    const profile::Launch& l = d.launches()[i];
    const int micros = i % 2 == 0 ? 3 : 6;
    INFO("launch " << i << ", " << d.name(l.kernel) << ": exclusive " << l.exclusive_us << " us");
    CHECK(d.name(l.kernel) == (i % 2 == 0 ? "a" : "b"));
    CHECK(l.exclusive_us >= micros - 0.05);
    CHECK(l.exclusive_us < micros + 2.0);
  }
}

TEST_CASE("launch stamps: the stamping twins compute what the plain kernels do", "[cuda][profile][stamps]") {
  if (!stamps_run()) return;
  // Two rigs from the same seed, one epoch each: one unprofiled, one with every step of its graph on the twins.
  test::RigOptions o;
  o.device = "cuda";
  o.use_graphs = true;
  o.sgd = {0.05f, 0.9f, 1e-4f};
  const data::Dataset train = data::subset(test::mnist().train, 0, 64 * 5 + 17);
  test::Rig plain(train, o), stamped(train, o);
  plain.trainer.run_epoch(1, nullptr);
  profile::KernelProfiler profiler(graph_timer(profile::Timing::stamps));
  stamped.ctx.set_observer(&profiler);
  profiler.start();
  stamped.trainer.run_epoch(1, nullptr);
  profiler.stop();
  stamped.ctx.set_observer(nullptr);
  CHECK(profiler.data().launch_count() > 0);
  CHECK(profiler.data().launches_without_record == 0);
  CHECK(stamped.weights() == plain.weights());  // the same bits
}

TEST_CASE("launch stamps: an mlp epoch replayed from its graph has every kernel timed", "[cuda][profile][stamps]") {
  if (!stamps_run()) return;
  test::RigOptions o;
  o.device = "cuda";
  o.use_graphs = true;
  constexpr int kSteps = 6;
  test::Rig rig(data::subset(test::mnist().train, 0, 64 * kSteps), o);
  data::DeviceBatcher eval_data(rig.ctx, data::subset(test::mnist().test, 0, 100), false, 1);
  rig.trainer.run_epoch(1, &eval_data);  // unprofiled: loads the kernels
  kernels::synchronize(rig.ctx.exec());

  const int every = GENERATE(1, 2);  // every step, or steps 1, 3 and 5 (and the evaluation's odd batches)
  INFO("sampled: 1 step in " << every);
  profile::ProfilerOptions options = graph_timer(profile::Timing::stamps);
  options.sample_every = every;
  profile::KernelProfiler profiler(options);
  rig.ctx.set_observer(&profiler);
  profiler.start();
  rig.trainer.run_epoch(2, &eval_data);  // captured again under the profiler, replayed
  profiler.stop();
  rig.ctx.set_observer(nullptr);

  const auto& d = profiler.data();
  INFO(d.launches_without_record << " launches without a time of " << d.launch_count() + d.launches_without_record);
  CHECK(d.launches_without_record == 0);
  int64_t forward = 0;
  for (const auto& r : d.rows()) {
    INFO(r.kernel << " | " << r.phase << " | " << r.layer << " | " << r.part);
    CHECK(r.min_us > 0);
    CHECK(r.max_us < 10'000);
    if (r.kernel == "gemm_bias_relu" && r.phase == "forward" && r.layer == "0 linear 784->320 +relu") forward = r.calls;
  }
  CHECK(forward == kSteps / every);
  for (size_t i = 1; i < d.launches().size(); ++i) CHECK(d.launches()[i].span_us >= d.launches()[i].exclusive_us);
  CHECK(d.kernel_us() <= d.wall_us);
}
