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
// and end on the GPU itself (profile/cupti_tracer.h). begin() only notes the launch, whose name, phase, layer
// and cost the profiler knows; nothing is enqueued on the stream and nothing is tagged, since one stream runs
// its kernels in submission order: flush() synchronizes, has CUPTI deliver its buffers, and gives the i-th
// record by start time to the i-th launch (match_in_stream_order), only when the counts agree. A launch
// without a record is counted (data().launches_without_record), never dropped silently. If CUPTI cannot load
// or start (not installed, CUPTI_ERROR_INSUFFICIENT_PRIVILEGES, another tool holding it), the profiler falls
// back to events and timing_note() says why (or throws, if ProfilerOptions::cupti_fallback is false).
//
// CUDA graphs (CUPTI or launch stamps, with ProfilerOptions::graphs). Launches observed while a graph is captured
// (capture_begin() ... capture_end()) are kept as a sequence; each replay of the graph appends that sequence
// to the pending launches, with fresh step, phase and layer ids, and CUPTI's records of the replayed kernels
// are matched like eager ones. So a profiled run can keep its graphs. It is an option, not the default: CUPTI's
// records of graph kernels lengthen a graph epoch and some of its kernels, while eager launches, which are bound
// by the host, absorb the records at no measurable cost (docs/profiler.md, "CUDA graphs").
//
// GPU, Timing::stamps (a profiling build, NT_LAUNCH_STAMPS; replayed graphs only, sm_90 code under programmatic
// launch; the constructor throws nt::Error in a build without it). Every launch of a captured graph that the
// profiler times runs its kernel's stamping twin, which writes when it started and when its wait for its predecessor
// returned into a ring the profiler owns (launch_stamp_ring(), profile/launch_stamps.h); the others run the plain
// kernel. A kernel's exclusive time runs from its own release to its successor's, so a kernel is timed only when its
// successor stamps in the same window: a graph captured under this timer ends with a closing launch, and launches
// made eagerly are counted without a time. Sampled, the windows are the sampled steps (below). flush() reads the ring
// once. Without it (and always with the events timer, which cannot bracket replayed kernels) the engine runs eagerly
// while it is observed (times_graph_replays()); a replay the profiler is told of then counts as launches without a
// time.
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
// Sampling (ProfilerOptions::sample_every = N > 1): only every N-th step is timed (the steps the engine opens:
// training steps and evaluation batches; launches outside a step are not timed). What it is for: with CUPTI
// every launch costs the host time, which an eager epoch of short kernels feels in full (docs/profiler.md), and a
// timer that is off between samples costs nothing. With CUPTI the step before a sampled one is recorded too but not
// counted: its last kernel's end is where the sampled step's first kernel, launched early under programmatic dependent
// launch, starts running for itself (see match_in_stream_order). With launch stamps (replayed graphs; the steps are
// those of the capture, and each replay runs them again) the step before a sampled one stamps too, uncounted, for the
// same reason, and so does the launch after it, whose release ends the sampled step's last kernel; every other launch
// of the graph runs its plain kernel. The report names the sampling; counts and totals are those of the sampled
// steps.
//
// Window. start() ... stop() (with pause()/resume() in between) measure the host wall clock of the profiled
// region; the report sets the sum of kernel times against it, so launch gaps show.
//
// Single-threaded: launches and scopes come from the thread that called start().
#pragma once

#include <chrono>
#include <cstdint>
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

enum class Timing { host, cuda_events, cupti, stamps };
const char* timing_name(Timing t);  // "host", "cuda events", "cupti", "launch stamps"

// What the user asks for (--profile-timer): auto = launch stamps for replayed graphs where kernels can stamp, else
// cupti if it loads, else events (with a warning).
enum class TimerChoice { automatic, cupti, events, stamps };
// "auto", "cupti", "events", "stamps"; else nullopt
std::optional<TimerChoice> parse_timer_choice(std::string_view text);
// Where the timing is chosen.
struct TimingScene {
  bool on_cuda = false;
  int sample_every = 1;
  bool graphs = false;           // the kernels of replayed graphs are timed (ProfilerOptions::graphs)
  bool stamps_possible = false;  // a profiling build whose kernels can stamp: sm_90 code, programmatic launch
};
// The timing for a choice (the CPU is always timed by the host clock) and whether falling back from cupti to events
// is allowed (only for auto). Sampled (sample_every > 1), auto means events: CUPTI costs every launch about the same
// whether it records it or not, so only events get cheaper between samples. Replayed graphs, auto means launch
// stamps where possible (a profiling build): CUPTI's instrumentation lengthens a graph epoch by about 16%.
Timing timing_for(TimerChoice choice, const TimingScene& scene);
inline bool cupti_fallback_for(TimerChoice choice) { return choice != TimerChoice::cupti; }

// The sampling of `train --profile-graphs` under launch stamps unless the user chooses: a sampled step and its lead-in
// stamp, so 2 steps in 8 run the stamping twins, which cost a graph epoch about 5% when every step runs them
// (docs/profiler.md, "Launch stamps").
inline constexpr int kLaunchStampsSampleEvery = 8;

struct ProfilerOptions {
  Timing timing = Timing::host;
  HoldFn hold;                         // events: keeps the stream behind the host within a step; empty = none
  int pool_pairs = 16384;              // launches read back at once (events: CUDA event pairs); then a flush
  uint32_t stamp_capacity = 1u << 16;  // GPU: phase stamps kept between two flushes (16 bytes each)
  uint32_t launch_stamp_capacity =
      1u << 20;  // stamps: slots between two flushes (16 bytes each; two per beside kernel)
  size_t max_trace_launches = 2'000'000;
  std::string device;                // where it runs, for the report
  bool cupti_fallback = true;        // cupti: fall back to events if CUPTI fails (else throw nt::Error)
  std::string cupti_library;         // cupti: this file instead of the search (cupti_tracer.h); "" = search
  bool graphs = false;               // cupti, stamps: time the kernels of replayed CUDA graphs (see above)
  int sample_every = 1;              // time one step in N (see above); 1 = every launch
  std::optional<Ceilings> ceilings;  // the device's measured ceilings, for the report's roofline columns
};

class KernelProfiler final : public LaunchObserver, public StepListener {
 public:
  explicit KernelProfiler(ProfilerOptions options);
  ~KernelProfiler() override;
  KernelProfiler(const KernelProfiler&) = delete;
  KernelProfiler& operator=(const KernelProfiler&) = delete;

  void start();  // opens the window; listens to this thread's steps; GPU: creates the pool, cudaProfilerStart
  void pause();  // closes the window (GPU: waits for the work queued so far)
  void resume();
  void flush();  // one synchronization; every pending launch is read and aggregated
  void stop();   // pause + flush; stops listening; GPU: cudaProfilerStop

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
  // LaunchObserver, graphs
  bool times_graph_replays() const override {
    return (timing_ == Timing::cupti || timing_ == Timing::stamps) && options_.graphs;
  }
  bool times_with_launch_stamps() const override { return timing_ == Timing::stamps && started_ && !stopped_; }
  LaunchStampRing launch_stamp_ring() const override { return stamp_this_launch_ ? stamp_ring_ : LaunchStampRing{}; }
  void capture_begin() override;
  int capture_end() override;
  void replayed(int sequence, void* stream) override;
  PhaseStamps phase_stamps(const char* const* names, size_t count) override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Open {  // a launch between begin() and end()
    Launch launch;
    int pair = -1;           // GPU: its event pair
    Clock::time_point t0{};  // CPU: when it began
    bool ended = false;
    bool counted = true;   // false: recorded only for the clip of the next one (sampling, lead-in)
    uint32_t stamps = 0;   // its phase stamps' tag (0: none)
    uint32_t stream = 0;   // CUPTI: the stream's id in the kernel records
    int64_t replay = -1;   // the graph replay it belongs to (-1: launched eagerly); stamps: its window of stamps
    bool closes = false;   // stamps: its release ends its window's last kernel; not a row
    bool stamped = false;  // stamps: its kernel's stamping twin ran
  };
  // What a launch of a graph captured under the launch-stamps timer does (see Sampling above).
  enum class StampRole : uint8_t { plain, counted, lead_in, closes };
  struct Gpu;        // CUDA state (events, the hold flag, the CUPTI tracer), kept out of this header
  struct Sequence {  // the launches of a captured graph
    std::vector<Launch> launches;
    std::vector<uint32_t> stamps;        // [i]: the phase stamps' tag of launches[i] (0: none)
    uint64_t first_id = 0, last_id = 0;  // the range of their (nonzero) scope ids
    // Timing::stamps: [i] what launches[i] does, and the window of consecutive stamping launches it is in.
    std::vector<StampRole> roles;
    std::vector<int> windows;
    int window_count = 0;
    int64_t steps = 0, sampled_steps = 0;  // the steps opened in the capture, and those sampled
  };

  Launch describe(const char* kernel);
  // A scope's name, interned once per opening of the scope (its id), not once per launch: the launches of an eager
  // step pay the host for every lookup, and a layer's launches share one opening.
  struct ScopeName {
    uint64_t id = 0;
    int name = kNoName;
  };
  int scope_name(ScopeName& cache, const ScopeInfo& scope);
  double host_us(Clock::time_point t) const;
  void open_gate() noexcept;
  void synchronize();
  void fall_back(const std::string& why);         // cupti -> cuda_events, or throws
  bool holds() const;                             // events with a hold function
  enum class Take { counted, lead_in, skipped };  // what becomes of a launch (sampling)
  Take take_for_step(int64_t step) const;
  Take take_now() const;              // for a launch issued now
  StampRole stamp_role_in_capture();  // Timing::stamps: for a launch captured now
  void set_recording(bool on);        // cupti: records for the launches to come, or none
  void flush_events();
  void flush_cupti();
  void flush_stamps();
  void read_stamps(const std::vector<size_t>& trace_index);  // after a flush's launches were added

  ProfilerOptions options_;
  Timing timing_ = Timing::host;
  std::string timing_note_;
  ProfileData data_;
  std::unique_ptr<Gpu> gpu_;
  std::vector<Open> open_;  // CPU: a stack; GPU: every launch since the last flush, in order
  std::vector<Sequence> sequences_;
  ScopeName step_name_, phase_name_, layer_name_;
  int capturing_ = -1;  // the sequence being captured, or -1
  bool started_ = false, running_ = false, stopped_ = false;
  Clock::time_point origin_{}, window_start_{};
  bool in_step_ = false;
  int64_t flushes_ = 0;
  Take step_take_ = Take::counted;  // of the open step
  bool skipping_launch_ = false;    // between begin() and end() of a launch that is not timed
  std::string deferred_error_;      // a failure inside step_opened/closed (noexcept), thrown at the next launch
  // Phase stamps: the names each tag declared (tags count from 1), and the tag the next launch takes.
  struct StampNames {
    const char* const* names = nullptr;
    size_t count = 0;
  };
  std::vector<StampNames> stamp_names_{{}};
  uint32_t next_launch_stamps_ = 0;
  int64_t replays_ = 0;             // graph replays seen
  int closing_name_ = -1;           // the interned name of kLaunchStampsClose
  LaunchStampRing stamp_ring_;      // Timing::stamps, between start() and stop()
  bool stamp_this_launch_ = false;  // the launch begun last runs its stamping twin with stamp_ring_
  bool window_open_ = false;        // capturing: the last launch stamped, and the window goes on
};

}  // namespace nt::profile
