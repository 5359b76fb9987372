// The kernel profiler on the GPU, with both timers: CUPTI's kernel records and CUDA events around every launch
// of real mlp steps, read back in batches. Every kernel that ran is in the table under its phase and layer with
// the right call count, times are positive, launches do not overlap on the stream, the sum of kernel time
// stays within the wall clock, the profiler synchronizes once per flush (never per kernel), a full batch
// flushes without losing launches, the events timer's hold is released by the host, and a cupti profiler
// whose library cannot load falls back to events.
#include "test_support.h"

#include <map>
#include <set>
#include <tuple>

#include "counting_observer.h"
#include "kernels/profile_delay.h"
#include "profile/cupti_tracer.h"
#include "profile/kernel_profiler.h"
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
  profile::Timing timing = profile::Timing::host;  // in effect
  std::string note;                                // why not cupti
};

profile::ProfilerOptions events_options(int pool_pairs) {
  profile::ProfilerOptions o;
  o.timing = profile::Timing::cuda_events;
  o.pool_pairs = pool_pairs;
  o.max_trace_launches = 1'000'000;
  o.device = "cuda";
  return o;
}

// CUPTI or an error: the packed build carries libcupti next to the binaries (scripts/pack-build).
profile::ProfilerOptions cupti_options(int pool_pairs) {
  profile::ProfilerOptions o = events_options(pool_pairs);
  o.timing = profile::Timing::cupti;
  o.cupti_fallback = false;
  return o;
}

// `steps` mlp steps and an evaluation of 100 test examples (2 batches) under a GPU profiler, after one
// unprofiled warm-up step (first launches load the kernels). The rig replays CUDA graphs when nobody
// observes, so the eval kernels showing up proves the eager fallback while profiling.
ProfiledRun profile_steps(int steps, profile::ProfilerOptions options) {
  test::RigOptions o;
  o.device = "cuda";
  o.use_graphs = true;
  test::Rig rig(data::subset(test::mnist().train, 0, 64 * (steps + 1)), o);
  data::DeviceBatcher eval_data(rig.ctx, data::subset(test::mnist().test, 0, 100), false, 1);
  rig.trainer.enqueue_train_step(0);
  kernels::synchronize(rig.ctx.exec());

  ProfiledRun run;
  options.hold = kernels::profile_hold_fn(rig.ctx.exec());  // used by the events timer only
  profile::KernelProfiler profiler(std::move(options));
  run.counter.next = &profiler;
  rig.ctx.set_observer(&run.counter);
  profiler.start();
  for (int s = 1; s <= steps; ++s) rig.trainer.enqueue_train_step(s);
  rig.trainer.evaluate(eval_data);
  profiler.stop();
  rig.ctx.set_observer(nullptr);
  run.flushes = profiler.flushes();
  run.data = profiler.data();
  run.timing = profiler.timing();
  run.note = profiler.timing_note();
  return run;
}

void check_launches(const ProfiledRun& run) {
  const auto& d = run.data;
  CHECK(d.launches_without_record == 0);
  CHECK(d.launch_count() == run.counter.launches);
  CHECK(profiled_calls(d) == run.counter.calls);
  for (const auto& r : d.rows()) {
    INFO(r.kernel << " | " << r.phase << " | " << r.layer);
    CHECK(r.min_us > 0);
    CHECK(r.max_us < 10'000);  // 10 ms: no mlp kernel at batch 64 comes near; a hold counted as kernel time would
  }
  // One stream runs them one after another: each launch's exclusive time starts after the previous one has
  // ended (the events' resolution is about 0.5 us; CUPTI's exclusive starts are clipped to their predecessor's end,
  // so exact), and its span holds its exclusive time.
  const auto& launches = d.launches();
  const double slack_us = d.timer == "cupti" ? 1e-3 : 1.0;
  for (size_t i = 1; i < launches.size(); ++i) {
    INFO("launch " << i);
    CHECK(launches[i].exclusive_start_us() >= launches[i - 1].end_us() - slack_us);
    CHECK(launches[i].span_us >= launches[i].exclusive_us);
  }
  CHECK(d.kernel_us() <= d.wall_us);
}

// The last Linear and the loss: one classifier_head kernel where the code path has clusters, else the unfused
// ops (kernels/classifier_head.h), whose softmax_xent then runs under the same phase and layer.
void check_head_calls(const ProfiledRun& run, int train_steps, int eval_batches) {
  const auto& c = run.counter.calls;
  const char* head = test::cuda_device().has_clusters() ? "classifier_head" : "softmax_xent";
  INFO("head kernel " << head << " on " << test::cuda_device().code_path());
  CHECK(c.at({head, "loss", "4 linear 160->10"}) == train_steps);
  CHECK(c.at({head, "eval", "4 linear 160->10"}) == eval_batches);
}

}  // namespace

TEST_CASE("GPU steps: every kernel under its phase and layer, one synchronization in all", "[cuda][profile]") {
  const ProfiledRun run = profile_steps(10, events_options(4096));
  REQUIRE(run.timing == profile::Timing::cuda_events);
  check_launches(run);
  const auto& c = run.counter.calls;
  CHECK(c.at({"gather_batch", "data", ""}) == 10);
  CHECK(c.at({"sgd_update", "update", ""}) == 10);
  CHECK(c.at({"gemm_bias_relu", "forward", "0 linear 784->320 +relu"}) == 10);
  CHECK(c.at({"gather_batch", "eval", ""}) == 2);  // eager while profiled, though the rig replays graphs
  check_head_calls(run, 10, 2);
  CHECK(run.flushes == 1);
  CHECK(run.data.synchronizations == 1);  // for over a hundred launches: read back in one batch
  // The hold is released when the host has queued each step, not by its 50 ms timeout (12 holds).
  CHECK(run.data.wall_us < 200'000);
  CHECK(run.data.kernel_us() < run.data.wall_us);
}

TEST_CASE("a dry event pool flushes mid-step without losing a launch", "[cuda][profile]") {
  const ProfiledRun run = profile_steps(5, events_options(8));
  check_launches(run);
  CHECK(run.flushes >= run.counter.launches / 8);
  CHECK(run.data.synchronizations <= run.flushes + 1);
  CHECK(run.data.wall_us < 200'000);  // holds re-armed after each mid-step flush are released, not timed out
}

TEST_CASE("CUPTI timer: every kernel under its phase and layer from the GPU's own records", "[cuda][profile][cupti]") {
  const auto& lib = profile::cupti_library();
  INFO("CUPTI: " << (lib.loaded ? lib.path : lib.error));
  REQUIRE(lib.loaded);  // pack-build puts libcupti next to the binaries; NT_CUPTI_LIBRARY names another
  const ProfiledRun run = profile_steps(10, cupti_options(4096));
  INFO(run.note);
  REQUIRE(run.timing == profile::Timing::cupti);
  CHECK(run.data.timer == "cupti");
  check_launches(run);
  const auto& c = run.counter.calls;
  CHECK(c.at({"gather_batch", "data", ""}) == 10);
  check_head_calls(run, 10, 2);
  CHECK(run.flushes == 1);
  CHECK(run.data.synchronizations == 1);
  // No hold with CUPTI, so no timeout can be waited for; CUPTI's own set-up on the first launches after it is
  // enabled may take a while, hence a looser bound than the events timer's.
  CHECK(run.data.wall_us < 1'000'000);
  for (const auto& l : run.data.launches()) CHECK(l.exclusive_us > 0);
  for (const auto& r : run.data.rows()) {
    INFO(r.kernel << " | " << r.phase << " | " << r.layer);
    CHECK(r.max_us < 1'000);  // an mlp kernel at batch 64 takes microseconds
  }
}

TEST_CASE("CUPTI timer: a full batch flushes mid-step without losing a launch, and CUPTI opens again after stop",
          "[cuda][profile][cupti]") {
  REQUIRE(profile::cupti_library().loaded);
  for (int round = 0; round < 2; ++round) {  // the second profiler reopens the activity API
    INFO("round " << round);
    const ProfiledRun run = profile_steps(5, cupti_options(8));
    REQUIRE(run.timing == profile::Timing::cupti);
    check_launches(run);
    CHECK(run.flushes >= run.counter.launches / 8);
  }
}

// Sampling one step in 4 of 12 training steps and 2 evaluation batches (14 steps): the 4th, 8th and 12th
// training steps are timed, no evaluation batch is. With CUPTI the step before each is recorded as well (its
// last kernel's end clips the sampled step's first kernel) and recording is off in between.
void check_sampled(const ProfiledRun& run) {
  const auto& d = run.data;
  CHECK(d.launches_without_record == 0);
  CHECK(d.steps == 14);
  CHECK(d.sampled_steps == 3);
  for (const auto& [key, calls] : run.counter.calls) {
    INFO(std::get<0>(key) << " | " << std::get<1>(key) << " | " << std::get<2>(key));
    const auto profiled = profiled_calls(d);
    if (std::get<1>(key) == "eval") {
      CHECK(profiled.count(key) == 0);
    } else {
      CHECK(profiled.at(key) * 4 == calls);
    }
  }
  for (const auto& r : d.rows()) {
    INFO(r.kernel << " | " << r.phase << " | " << r.layer);
    CHECK(r.min_us > 0);
    CHECK(r.max_us < 1'000);
  }
}

TEST_CASE("sampling one step in N: CUPTI and events time exactly the sampled steps' launches",
          "[cuda][profile][cupti]") {
  REQUIRE(profile::cupti_library().loaded);
  for (const bool cupti : {true, false}) {
    INFO((cupti ? "cupti" : "events"));
    profile::ProfilerOptions o = cupti ? cupti_options(4096) : events_options(4096);
    o.sample_every = 4;
    const ProfiledRun run = profile_steps(12, o);
    REQUIRE(run.timing == (cupti ? profile::Timing::cupti : profile::Timing::cuda_events));
    check_sampled(run);
  }
}

TEST_CASE("CUPTI timer: a replayed CUDA graph is timed kernel by kernel at every replay", "[cuda][profile][cupti]") {
  REQUIRE(profile::cupti_library().loaded);
  test::RigOptions o;
  o.device = "cuda";
  o.use_graphs = true;
  test::Rig rig(data::subset(test::mnist().train, 0, 64 * 10), o);  // 10 steps an epoch
  rig.trainer.train_epoch(1);  // its graph was captured unobserved: the trainer must capture again below

  ProfiledRun run;
  profile::ProfilerOptions options = cupti_options(4096);
  options.graphs = true;
  profile::KernelProfiler profiler(options);
  run.counter.next = &profiler;
  rig.ctx.set_observer(&run.counter);
  profiler.start();
  for (int epoch = 2; epoch <= 4; ++epoch) rig.trainer.train_epoch(epoch);
  profiler.stop();
  rig.ctx.set_observer(nullptr);
  run.data = profiler.data();
  REQUIRE(profiler.timing() == profile::Timing::cupti);

  CHECK(run.counter.captures == 1);  // one epoch graph, replayed three times
  check_launches(run);
  const auto& c = run.counter.calls;
  CHECK(c.at({"gather_batch", "data", ""}) == 30);
  CHECK(c.at({"gemm_bias_relu", "forward", "0 linear 784->320 +relu"}) == 30);
  CHECK(c.at({"sgd_update", "update", ""}) == 30);
  std::set<uint64_t> steps;  // each replayed step is its own range in the trace
  for (const auto& l : run.data.launches()) steps.insert(l.step_id);
  CHECK(steps.size() == 30);
  for (const auto& r : run.data.rows()) {
    INFO(r.kernel << " | " << r.phase << " | " << r.layer);
    CHECK(r.max_us < 1'000);
  }
}

TEST_CASE("a cupti profiler whose library cannot load falls back to events and still times everything",
          "[cuda][profile][cupti]") {
  profile::ProfilerOptions o = cupti_options(4096);
  o.cupti_fallback = true;
  o.cupti_library = "/nonexistent/libcupti.so.13";
  const ProfiledRun run = profile_steps(5, o);
  CHECK(run.timing == profile::Timing::cuda_events);
  CHECK(run.data.timer == "cuda events");
  CHECK(run.note.find("/nonexistent/libcupti.so.13") != std::string::npos);
  check_launches(run);
  CHECK(run.data.wall_us < 200'000);  // the events timer's holds are released by the host
}
