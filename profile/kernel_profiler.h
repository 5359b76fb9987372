// KernelProfiler: times every launch that the one launch path reports (kernels/cuda/launch.cuh,
// kernels/cpu/op_scope.h) and files it under the step, phase and layer open at that moment (profile/scope.h).
// Attach it with ctx.set_observer(&profiler); with no observer attached nothing is recorded.
//
//   KernelProfiler profiler({Timing::cupti, kernels::profile_hold_fn(exec)});
//   ctx.set_observer(&profiler);
//   profiler.start();  ...enqueue steps...;  profiler.stop();     // stop() synchronizes once and reads all
//   std::puts(format_table(profiler.data()).c_str());
//
// Three timers (docs/profiler.md):
//
// GPU, Timing::cupti (the default on the GPU when CUPTI loads). CUPTI's activity API records each kernel's start
// and end on the GPU itself (profile/cupti_tracer.h). begin() pushes the launch's index as an external
// correlation id and end() pops it, so each kernel record maps back to the launch, whose name, phase, layer and
// cost the profiler knows; nothing is enqueued on the stream, and no hold is needed, since a record's start is
// the kernel's own start, not a marker the stream reaches earlier. flush() synchronizes, has CUPTI deliver its
// buffers and matches the records; a launch without a record is counted (data().launches_without_record), never
// dropped silently. If CUPTI cannot load or start (not installed, CUPTI_ERROR_INSUFFICIENT_PRIVILEGES, another
// tool holding it), the profiler falls back to events and timing_note() says why (or throws, if
// ProfilerOptions::cupti_fallback is false).
//
// GPU, Timing::cuda_events. A pool of CUDA event pairs is created once, at start(). begin() records a pair's
// start event on the launch's stream, end() its stop event; nothing waits. An event is timestamped when the
// stream reaches it, so if the GPU has caught up with the host a start event fires before the kernel is even
// submitted; inside a step (profile::StepScope) the profiler therefore holds the stream before the step's first
// launch (a HoldFn: a one-thread kernel spinning on a host-written flag) and releases it when the step closes.
// What remains is the bracket itself: about 2 us per launch on an H100 (docs/profiler.md, Fidelity).
//
// Both GPU timers read back in batches: at stop(), when the caller asks (the end of an epoch), and when
// `pool_pairs` launches are pending: one synchronization per `pool_pairs` launches at most, never one per kernel.
//
// CPU, Timing::host: steady_clock around each op.
//
// Window. start() ... stop() (with pause()/resume() in between) measure the host wall clock of the profiled
// region; the report sets the sum of kernel times against it, so launch gaps show.
//
// Single-threaded: launches and scopes come from the thread that called start().
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "profile/cupti_tracer.h"
#include "profile/hold.h"
#include "profile/launch_observer.h"
#include "profile/profile_data.h"
#include "profile/scope.h"

namespace nt::profile {

enum class Timing { host, cuda_events, cupti };
const char* timing_name(Timing t);  // "host", "cuda events", "cupti"

// What the user asks for (--profile-timer): auto = cupti if it loads, else events (with a warning).
enum class TimerChoice { automatic, cupti, events };
std::optional<TimerChoice> parse_timer_choice(std::string_view text);  // "auto", "cupti", "events"; else nullopt
// The timing for a choice on a backend (the CPU is always timed by the host clock) and whether falling back
// from cupti to events is allowed (only for auto).
Timing timing_for(TimerChoice choice, bool on_cuda);
inline bool cupti_fallback_for(TimerChoice choice) { return choice != TimerChoice::cupti; }

struct ProfilerOptions {
  Timing timing = Timing::host;
  HoldFn hold;                          // events: keeps the stream behind the host within a step; empty = none
  int pool_pairs = 16384;               // launches read back at once (events: CUDA event pairs); then a flush
  size_t max_trace_launches = 2'000'000;
  std::string device;                   // where it runs, for the report
  bool cupti_fallback = true;           // cupti: fall back to events if CUPTI fails (else throw nt::Error)
  std::string cupti_library;            // cupti: this file instead of the search (cupti_tracer.h); "" = search
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
  Timing timing() const { return timing_; }                        // in effect (after a fallback: cuda_events)
  const std::string& timing_note() const { return timing_note_; }  // why CUPTI was not used; "" if it was

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
  struct Gpu;  // CUDA state (events, the hold flag, the CUPTI tracer), kept out of this header

  Launch describe(const char* kernel);
  CuptiMatch match_in_stream_order(std::vector<CuptiKernelRecord> kernels, const CuptiMatch& by_id) const;
  double host_us(Clock::time_point t) const;
  void open_gate() noexcept;
  void synchronize();
  void fall_back(const std::string& why);  // cupti -> cuda_events, or throws
  bool holds() const;                      // events with a hold function
  void flush_events();
  void flush_cupti();

  ProfilerOptions options_;
  Timing timing_ = Timing::host;
  std::string timing_note_;
  ProfileData data_;
  std::unique_ptr<Gpu> gpu_;
  std::vector<Open> open_;        // CPU: a stack; GPU: every launch since the last flush, in order
  bool started_ = false, running_ = false, stopped_ = false;
  Clock::time_point origin_{}, window_start_{};
  bool in_step_ = false;
  int64_t flushes_ = 0;
};

}  // namespace nt::profile
