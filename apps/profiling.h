// Profiling for the commands (train --profile, profile): a KernelProfiler on the context's backend, attached
// while the profiled work runs, and the report at the end (table, totals, --profile-out files).
//
//   ProfileSession profiling(ctx, enabled, out_prefix, /*hold=*/true, parse_profile_timer("auto"));
//   profiling.resume();  ...work...;  profiling.pause();   // repeatable: the window is the sum
//   profiling.finish();                                      // prints the table, writes the files
//
// With enabled == false every call does nothing and no observer is ever attached.
//
// --profile-timer (GPU): auto (the default) times the kernels of replayed graphs with launch stamps where kernels can
// write them (profile/launch_stamps.h), and otherwise with CUPTI's activity records when CUPTI loads and starts, else
// with CUDA events and a one-line warning saying why; cupti insists (an error if it cannot be used); events uses event
// pairs (the run under Nsight Compute, which holds CUPTI itself, must use them); stamps insists on launch stamps.
#pragma once

#include <memory>
#include <string>

#include "engine/context.h"
#include "profile/kernel_profiler.h"

namespace nt::app {

// --profile-out PREFIX: its folder must exist (UsageError naming the flag).
void validate_profile_out(const std::string& prefix);

// --profile-timer auto|cupti|events|stamps (UsageError naming the flag for anything else).
profile::TimerChoice parse_profile_timer(const std::string& text);
inline constexpr const char* kProfileTimerHelp =
    "GPU kernel timer: auto (launch stamps for --profile-graphs in a profiling build, else CUPTI if it loads, else "
    "CUDA events), "
    "cupti (CUPTI or an error), events (CUDA event pairs; for runs under Nsight Compute), stamps (launch stamps: "
    "replayed graphs on sm_90 only)";

class ProfileSession {
 public:
  // hold: with the events timer, keep the GPU behind the host within steps (see profile/kernel_profiler.h); off
  // for runs under Nsight Compute, which serializes every launch and would stall each hold until its timeout.
  // timer: --profile-timer. An explicit cupti that cannot load throws nt::Error here.
  // graphs: time the kernels of replayed CUDA graphs (launch stamps or CUPTI; --profile-graphs), else run eagerly.
  // An explicit stamps timer where stamps cannot time (no graphs, no programmatic launch) throws UsageError.
  // sample_every: time one step in N (--profile-every; profile/kernel_profiler.h, Sampling); 0: every step, but
  // kLaunchStampsSampleEvery for replayed graphs timed by launch stamps. Sampled graphs need launch stamps
  // (UsageError).
  ProfileSession(Context& ctx, bool enabled, std::string out_prefix, bool hold = true,
                 profile::TimerChoice timer = profile::TimerChoice::automatic, bool graphs = false,
                 int sample_every = 1);
  ~ProfileSession();  // detaches the profiler if finish() was not reached
  ProfileSession(const ProfileSession&) = delete;
  ProfileSession& operator=(const ProfileSession&) = delete;

  bool enabled() const { return profiler_ != nullptr; }
  void resume();  // the first call attaches the profiler and starts it
  void pause();   // closes the window and reads the events so far (one synchronization)
  void finish();  // stops, detaches, prints the table and totals, writes --profile-out files

 private:
  Context& ctx_;
  std::string out_prefix_;
  std::unique_ptr<profile::KernelProfiler> profiler_;
  bool started_ = false;
};

}  // namespace nt::app
