// Profiling for the commands (train --profile, profile): a KernelProfiler on the context's backend, attached
// while the profiled work runs, and the report at the end (table, totals, --profile-out files).
//
//   ProfileSession profiling(ctx, enabled, out_prefix, /*hold=*/true);
//   profiling.resume();  ...work...;  profiling.pause();   // repeatable: the window is the sum
//   profiling.finish();                                      // prints the table, writes the files
//
// With enabled == false every call does nothing and no observer is ever attached.
#pragma once

#include <memory>
#include <string>

#include "engine/context.h"
#include "profile/kernel_profiler.h"

namespace nt::app {

// --profile-out PREFIX: its folder must exist (UsageError naming the flag).
void validate_profile_out(const std::string& prefix);

class ProfileSession {
 public:
  // hold: keep the GPU behind the host within steps (see profile/kernel_profiler.h); off for runs under
  // Nsight Compute, which serializes every launch and would stall each hold until its timeout.
  ProfileSession(Context& ctx, bool enabled, std::string out_prefix, bool hold = true);
  ~ProfileSession();  // detaches the profiler if finish() was not reached
  ProfileSession(const ProfileSession&) = delete;
  ProfileSession& operator=(const ProfileSession&) = delete;

  bool enabled() const { return profiler_ != nullptr; }
  void resume();   // the first call attaches the profiler and starts it
  void pause();    // closes the window and reads the events so far (one synchronization)
  void finish();   // stops, detaches, prints the table and totals, writes --profile-out files

 private:
  Context& ctx_;
  std::string out_prefix_;
  std::unique_ptr<profile::KernelProfiler> profiler_;
  bool started_ = false;
};

}  // namespace nt::app
