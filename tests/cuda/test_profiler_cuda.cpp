// The kernel profiler on the GPU: CUDA events around every launch of real mlp steps, read back in batches.
// Every kernel that ran is in the table under its phase and layer with the right call count, times are
// positive, launches do not overlap on the stream, the profiler synchronizes once per flush (never per
// kernel), a dry event pool flushes without losing launches, and the hold is released by the host.
#include "test_support.h"

#include <map>
#include <tuple>

#include "kernels/profile_delay.h"
#include "profile/kernel_profiler.h"
#include "counting_observer.h"
#include "rig.h"

using namespace nt;

namespace {

using Key = test::LaunchKey;
using test::CountingObserver;

std::map<Key, int64_t> profiled_calls(const profile::ProfileData& d) {
  std::map<Key, int64_t> out;
  for (const auto& r : d.rows()) out[{r.kernel, r.phase, r.layer}] = r.calls;
  return out;
}

struct ProfiledRun {
  int64_t flushes = 0;
  profile::ProfileData data;
  CountingObserver counter;
};

// `steps` mlp steps and an evaluation of 100 test examples (2 batches) under a GPU profiler, after one
// unprofiled warm-up step (first launches load the kernels). The rig replays CUDA graphs when nobody
// observes, so the eval kernels showing up proves the eager fallback while profiling.
ProfiledRun profile_steps(int steps, int pool_pairs) {
  test::RigOptions o;
  o.device = "cuda";
  o.use_graphs = true;
  test::Rig rig(data::subset(test::mnist().train, 0, 64 * (steps + 1)), o);
  data::DeviceBatcher eval_data(rig.ctx, data::subset(test::mnist().test, 0, 100), false, 1);
  rig.trainer.enqueue_train_step(0);
  kernels::synchronize(rig.ctx.exec());

  ProfiledRun run;
  profile::KernelProfiler profiler(
      {profile::Timing::cuda_events, kernels::profile_hold_fn(rig.ctx.exec()), pool_pairs, 1'000'000, "cuda"});
  run.counter.next = &profiler;
  rig.ctx.set_observer(&run.counter);
  profiler.start();
  for (int s = 1; s <= steps; ++s) rig.trainer.enqueue_train_step(s);
  rig.trainer.evaluate(eval_data);
  profiler.stop();
  rig.ctx.set_observer(nullptr);
  run.flushes = profiler.flushes();
  run.data = profiler.data();
  return run;
}

void check_launches(const ProfiledRun& run) {
  const auto& d = run.data;
  CHECK(d.launch_count() == run.counter.launches);
  CHECK(profiled_calls(d) == run.counter.calls);
  for (const auto& r : d.rows()) {
    INFO(r.kernel << " | " << r.phase << " | " << r.layer);
    CHECK(r.min_us > 0);
    CHECK(r.max_us < 10'000);  // 10 ms: no mlp kernel at batch 64 comes near; a hold counted as kernel time would
  }
  // One stream runs them one after another: each launch starts after the previous one has ended (the
  // events' resolution is about 0.5 us).
  const auto& launches = d.launches();
  for (size_t i = 1; i < launches.size(); ++i) {
    INFO("launch " << i);
    CHECK(launches[i].start_us >= launches[i - 1].start_us + launches[i - 1].dur_us - 1.0);
  }
}

}  // namespace

TEST_CASE("GPU steps: every kernel under its phase and layer, one synchronization in all", "[cuda][profile]") {
  const ProfiledRun run = profile_steps(10, 4096);
  check_launches(run);
  const auto& c = run.counter.calls;
  CHECK(c.at({"gather_batch", "data", ""}) == 10);
  CHECK(c.at({"sgd_update", "update", ""}) == 10);
  CHECK(c.at({"softmax_xent", "loss", ""}) == 10);
  CHECK(c.at({"gemm_bias_relu", "forward", "0 linear 784->320 +relu"}) == 10);
  CHECK(c.at({"gather_batch", "eval", ""}) == 2);  // eager while profiled, though the rig replays graphs
  CHECK(c.at({"gemm_bias", "eval", "4 linear 160->10"}) == 2);
  CHECK(run.flushes == 1);
  CHECK(run.data.synchronizations == 1);  // for over a hundred launches: read back in one batch
  // The hold is released when the host has queued each step, not by its 50 ms timeout (12 holds).
  CHECK(run.data.wall_us < 200'000);
  CHECK(run.data.kernel_us() < run.data.wall_us);
}

TEST_CASE("a dry event pool flushes mid-step without losing a launch", "[cuda][profile]") {
  const ProfiledRun run = profile_steps(5, 8);
  check_launches(run);
  CHECK(run.flushes >= run.counter.launches / 8);
  CHECK(run.data.synchronizations <= run.flushes + 1);
  CHECK(run.data.wall_us < 200'000);  // holds re-armed after each mid-step flush are released, not timed out
}
