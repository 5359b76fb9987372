// The launch-stamps timer on the GPU (profile/launch_stamps.h), in a build whose kernels stamp (NT_LAUNCH_STAMPS): the
// ring reaches the kernels only while the profiler runs, kernels of known length replayed from a graph read their
// lengths, a kernel beside its predecessor extends the stream only by what it adds, CUPTI's records of the same replay
// agree, eager launches are counted without a time, and a real mlp epoch replayed under the timer has every kernel
// timed under its phase and layer. In the default build the timer refuses with a message that names the build option.
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

TEST_CASE("launch stamps: kernels are given the ring only while the profiler runs", "[cuda][profile][stamps]") {
  if (!stamps_run()) return;
  profile::KernelProfiler profiler(graph_timer(profile::Timing::stamps));
  CHECK(profiler.launch_stamp_ring().slots == nullptr);  // before start(): launches pass an empty ring
  profiler.start();
  const profile::LaunchStampRing ring = profiler.launch_stamp_ring();
  CHECK(ring.slots != nullptr);
  CHECK(ring.count != nullptr);
  CHECK(ring.capacity == graph_timer(profile::Timing::stamps).launch_stamp_capacity);
  profiler.stop();
  CHECK(profiler.launch_stamp_ring().slots == nullptr);  // a graph replayed after stop() writes nowhere

  profile::KernelProfiler cupti(graph_timer(profile::Timing::cupti));
  cupti.start();
  CHECK(cupti.launch_stamp_ring().slots == nullptr);  // another timer: the kernels never stamp
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

  profile::KernelProfiler profiler(graph_timer(profile::Timing::stamps));
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
  CHECK(forward == kSteps);
  for (size_t i = 1; i < d.launches().size(); ++i) CHECK(d.launches()[i].span_us >= d.launches()[i].exclusive_us);
  CHECK(d.kernel_us() <= d.wall_us);
}
