#include "apps/profiling.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>

#include "apps/command.h"
#include "kernels/profile_delay.h"
#include "profile/report.h"

namespace nt::app {

void validate_profile_out(const std::string& prefix) {
  namespace fs = std::filesystem;
  const fs::path parent = fs::path(prefix).parent_path();
  if (!parent.empty() && !fs::is_directory(parent))
    throw UsageError(cat("--profile-out: folder '", parent.string(), "' does not exist"));
}

ProfileSession::ProfileSession(Context& ctx, bool enabled, std::string out_prefix, bool hold)
    : ctx_(ctx), out_prefix_(std::move(out_prefix)) {
  if (!enabled) return;
  profile::ProfilerOptions o;
  o.timing = ctx.on_cuda() ? profile::Timing::cuda_events : profile::Timing::host;
  if (hold) o.hold = kernels::profile_hold_fn(ctx.exec());
  o.device = ctx.describe();
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
  std::printf("\n%s\n%s", profile::format_table(data).c_str(), profile::format_totals(data).c_str());
  std::fflush(stdout);
  if (!out_prefix_.empty()) {
    profile::write_files(data, out_prefix_);
    spdlog::info("profile written to {0}.csv, {0}.json and {0}.trace.json", out_prefix_);
  }
}

}  // namespace nt::app
