// KernelProfiler: times every launch that the one launch path reports (kernels/cuda/launch.cuh,
// kernels/cpu/op_scope.h) and files it under the step, phase and layer open at that moment (profile/scope.h).
// Attach it with ctx.set_observer(&profiler); with no observer attached nothing is recorded.
//
//   KernelProfiler profiler({Timing::cuda_events, kernels::profile_hold_fn(exec)});
//   ctx.set_observer(&profiler);
//   profiler.start();  ...enqueue steps...;  profiler.stop();     // stop() synchronizes once and reads all
//   std::puts(format_table(profiler.data()).c_str());
//
// GPU (Timing::cuda_events). A pool of CUDA event pairs is created once, at start(). begin() records a pair's
// start event on the launch's stream, end() its stop event; nothing waits. flush() synchronizes once, reads
// the elapsed time of every pending pair, aggregates, and hands the pairs back to the pool. Flushes happen at
// stop(), when the caller asks (the end of an epoch), and when the pool runs dry: one synchronization per
// `pool_pairs` launches at most, never one per kernel.
//
// Fidelity (GPU). An event is timestamped when the stream reaches it. If the GPU has caught up with the host,
// a kernel's start event fires before the host has even submitted the kernel, and launch overhead is counted
// as kernel time. So inside a step (profile::StepScope) the profiler holds the stream before the step's first
// launch (a HoldFn: a one-thread kernel spinning on a host-written flag) and releases it when the step closes,
// i.e. once the host has queued the whole step: the step's kernels then run back to back from a full queue,
// each start event firing as the previous kernel ends. The GPU runs step s while the host queues step s+1,
// so the hold costs throughput only when the host is the bottleneck anyway. Details: docs/profiler.md.
//
// Window. start() ... stop() (with pause()/resume() in between) measure the host wall clock of the profiled
// region; the report sets the sum of kernel times against it, so launch gaps show.
//
// Single-threaded: launches and scopes come from the thread that called start().
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "profile/hold.h"
#include "profile/launch_observer.h"
#include "profile/profile_data.h"
#include "profile/scope.h"

namespace nt::profile {

enum class Timing { host, cuda_events };

struct ProfilerOptions {
  Timing timing = Timing::host;
  HoldFn hold;                          // GPU: keeps the stream behind the host within a step; empty = none
  int pool_pairs = 16384;               // CUDA event pairs; a dry pool flushes
  size_t max_trace_launches = 2'000'000;
  std::string device;                   // where it runs, for the report
};

class KernelProfiler final : public LaunchObserver, public StepListener {
 public:
  explicit KernelProfiler(ProfilerOptions options);
  ~KernelProfiler() override;
  KernelProfiler(const KernelProfiler&) = delete;
  KernelProfiler& operator=(const KernelProfiler&) = delete;

  void start();   // opens the window; listens to this thread's steps; GPU: creates the pool, cudaProfilerStart
  void pause();   // closes the window (GPU: waits for the work queued so far)
  void resume();
  void flush();   // one synchronization; every pending launch is read and aggregated
  void stop();    // pause + flush; stops listening; GPU: cudaProfilerStop

  const ProfileData& data() const { return data_; }
  int64_t flushes() const { return flushes_; }

  // LaunchObserver
  void begin(const char* kernel, void* stream) override;
  void end(const char* kernel, void* stream, const OpCost& cost) override;
  // StepListener
  void step_opened() noexcept override;
  void step_closed() noexcept override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Open {  // a launch between begin() and end()
    Launch launch;
    int pair = -1;                // GPU: its event pair
    Clock::time_point t0{};       // CPU: when it began
    bool ended = false;
  };
  struct Gpu;  // CUDA state (events, the hold flag), kept out of this header

  Launch describe(const char* kernel);
  double host_us(Clock::time_point t) const;
  void open_gate() noexcept;
  void synchronize();

  ProfilerOptions options_;
  ProfileData data_;
  std::unique_ptr<Gpu> gpu_;
  std::vector<Open> open_;        // CPU: a stack; GPU: every launch since the last flush, in order
  bool started_ = false, running_ = false, stopped_ = false;
  Clock::time_point origin_{}, window_start_{};
  bool in_step_ = false;
  int64_t flushes_ = 0;
};

}  // namespace nt::profile
