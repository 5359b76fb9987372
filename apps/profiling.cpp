#include "apps/profiling.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>

#include "apps/command.h"
#include "kernels/ceilings.h"
#include "kernels/profile_delay.h"
#include "profile/launch_stamps.h"
#include "profile/report.h"

namespace nt::app {

namespace {

// The GPU's ceilings for the report's roofline columns: from the cache, else measured now (about a second, before the
// profiled window opens) and cached for the next run. Without them the report still has every time, and says why the
// shares are blank.
std::optional<profile::Ceilings> ceilings_for(Context& ctx) {
  if (!ctx.on_cuda()) return std::nullopt;
  try {
    const std::string uuid = kernels::cuda_device_uuid(ctx.device_info().index);
    const std::string path = profile::ceilings_cache_path();
    if (auto cached = profile::load_ceilings(path, uuid)) return cached;
    spdlog::info(
        "profiling: measuring this GPU's ceilings once, for the roofline columns (nanotrain devices --measure)");
    profile::Ceilings measured = kernels::measure_ceilings(ctx.exec());
    try {
      profile::store_ceilings(path, measured);
      spdlog::info("profiling: ceilings {} cached in {}", profile::describe(measured), path);
    } catch (const Error& e) {
      spdlog::warn("profiling: ceilings not cached: {}", e.what());
    }
    return measured;
  } catch (const Error& e) {
    spdlog::warn("profiling: no roofline columns: {}", e.what());
    return std::nullopt;
  }
}

}  // namespace

void validate_profile_out(const std::string& prefix) {
  check_outputs({{"--profile-out", prefix.empty() ? "" : prefix + ".csv", prefix + ".csv, .json and .trace.json"}});
}

profile::TimerChoice parse_profile_timer(const std::string& text) {
  if (auto choice = profile::parse_timer_choice(text)) return *choice;
  throw UsageError(cat("--profile-timer: must be auto, cupti, events or stamps, got '", text, "'"));
}

ProfileSession::ProfileSession(Context& ctx, bool enabled, std::string out_prefix, bool hold,
                               profile::TimerChoice timer, bool graphs, int sample_every)
    : ctx_(ctx), out_prefix_(std::move(out_prefix)) {
  if (!enabled) return;
  profile::TimingScene scene;
  scene.on_cuda = ctx.on_cuda();
  scene.sample_every = std::max(sample_every, 1);
  scene.graphs = graphs;
  scene.stamps_possible = ctx.on_cuda() && profile::launch_stamps_available() && ctx.exec().programmatic_launch &&
                          ctx.device_info().has_programmatic_launch();
  if (timer == profile::TimerChoice::stamps && ctx.on_cuda()) {
    if (!profile::launch_stamps_available())
      throw UsageError(
          "--profile-timer stamps: this build's kernels do not stamp their launches (a profiling build: "
          "NT_CMAKE_ARGS=-DNT_LAUNCH_STAMPS=ON scripts/setup)");
    if (!graphs)
      throw UsageError("--profile-timer stamps: launch stamps time the kernels of replayed graphs (--profile-graphs)");
    if (!scene.stamps_possible)
      throw UsageError(
          cat("--profile-timer stamps: kernels stamp their launches under programmatic dependent launch, "
              "which needs sm_90 code",
              ctx.exec().programmatic_launch ? "" : " and no --no-pdl", " (this device runs ",
              ctx.device_info().code_path(), ")"));
  }
  profile::ProfilerOptions o;
  o.timing = profile::timing_for(timer, scene);
  o.cupti_fallback = profile::cupti_fallback_for(timer);
  if (hold) o.hold = kernels::profile_hold_fn(ctx.exec());  // used by the events timer only
  o.device = ctx.describe();
  o.graphs = graphs;
  if (sample_every == 0)  // the default: every step, but a sample of the steps of graphs timed by launch stamps
    sample_every = o.timing == profile::Timing::stamps ? profile::kLaunchStampsSampleEvery : 1;
  if (sample_every > 1 && graphs && o.timing != profile::Timing::stamps)
    throw UsageError(
        cat("--profile-every: the steps of replayed graphs (--profile-graphs) are sampled by launch "
            "stamps only (a profiling build on sm_90 code); ",
            ctx.on_cuda() ? "CUPTI times every kernel of a replay" : "the CPU has no graphs"));
  o.sample_every = sample_every;
  o.ceilings = ceilings_for(ctx);
  profiler_ = std::make_unique<profile::KernelProfiler>(std::move(o));
}

ProfileSession::~ProfileSession() {
  if (ctx_.exec().observer == profiler_.get()) ctx_.set_observer(nullptr);
}

void ProfileSession::resume() {
  if (!profiler_) return;
  if (!started_) {
    ctx_.set_observer(profiler_.get());
    profiler_->start();
    started_ = true;
    if (!profiler_->timing_note().empty())
      spdlog::warn("profiling: no CUPTI ({}); timing kernels with CUDA events, about 2 us long per launch",
                   profiler_->timing_note());
    spdlog::info("profiling: kernel timer {}", profile::timing_name(profiler_->timing()));
  } else {
    profiler_->resume();
  }
}

void ProfileSession::pause() {
  if (!profiler_) return;
  profiler_->pause();
  profiler_->flush();
}

void ProfileSession::finish() {
  if (!profiler_ || !started_) return;
  profiler_->stop();
  ctx_.set_observer(nullptr);
  const auto& data = profiler_->data();
  std::printf("\n%s\n%s%s", profile::format_table(data).c_str(), profile::format_totals(data).c_str(),
              profile::format_steps(data).c_str());
  std::fflush(stdout);
  if (!out_prefix_.empty()) {
    profile::write_files(data, out_prefix_);
    spdlog::info("profile written to {0}.csv, {0}.json and {0}.trace.json", out_prefix_);
  }
}

}  // namespace nt::app
