// Launch stamps: the profiler's timer for the kernels of replayed CUDA graphs (Timing::stamps, docs/profiler.md,
// "Launch stamps").
//
// Every kernel of the engine passes griddepcontrol.wait once (kernels/cuda/launch.cuh), and under programmatic
// dependent launch that wait returns when the stream predecessor has completed and its writes are visible. While a
// profiler passes a ring, thread 0 of block 0 of every kernel writes two %globaltimer readings into a slot of the ring
// (an atomic counter gives it): when it started, and when its wait returned. So each kernel's release tells when its
// predecessor ended, and
//
//   release(k) = the time kernel k's wait returned: at its start for a dependent kernel, at its end for one that runs
//                beside its predecessor (begin_overlapping_kernel), which waits last
//   exclusive(k) = release(k + 1) - release(k)       span(k) = release(k + 1) - start(k)
//
// for kernels k and k + 1 of one replay of a graph. One atomic per kernel, and two stores: a kernel that waits first
// takes its slot and stores its start before its wait, while its predecessor still runs, and after the wait only
// reads the timer and stores the release; one beside its predecessor takes two slots after letting its successor
// launch (griddepcontrol.launch_dependents). CUPTI instruments every block instead (about 0.6 us per kernel in a graph
// epoch on an H100).
//
// Which slot a kernel takes does not matter: start times are in stream order (kernel k + 1 starts only after kernel
// k, having read its start, let it launch), and so are the releases of kernels beside their predecessors, so the host
// sorts each kind by time. One stream only.
//
// Where a kernel's end has no successor in the same replay to observe it (the last of a graph, a kernel launched
// eagerly after a host gap) it is not known. So a graph captured under this timer ends with a closing kernel
// (kLaunchStampsClose), whose release is the end of the graph's last kernel; eager launches are not timed.
//
// Only in a build configured with NT_LAUNCH_STAMPS (a profiling build), and only in the kernels' stamping twins
// (kernels/cuda/stamping_twins.h), which the launch path runs for the launches a profiler stamps
// (LaunchObserver::launch_stamp_ring), the ring as their last parameter. Every other kernel carries no stamping code
// and an empty StampRing: stamping code, even dormant, cost every kernel about 0.2 us (docs/profiler.md, "Launch
// stamps").
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace nt::profile {

// One slot. A kernel that waits first writes {start, release}; one that runs beside its predecessor writes {start, 0}
// when it starts and {0, release} in another slot when its closing wait returns. %globaltimer is never 0, so the
// slots say which kind they are: the host needs no list of which kernels run beside.
struct LaunchStamp {
  unsigned long long start_ns = 0;
  unsigned long long release_ns = 0;
};

struct LaunchStampRing {          // passed by value to every kernel
  LaunchStamp* slots = nullptr;   // nullptr: no profiler listens; kernels write nothing
  unsigned int* count = nullptr;  // slots taken since the last read; past capacity a stamp is counted and lost
  unsigned int capacity = 0;
};

// The kernel name of the closing launch (kernels/runtime.h, close_launch_stamps).
inline constexpr const char* kLaunchStampsClose = "launch_stamps_close";

#ifndef NT_LAUNCH_STAMPS
#define NT_LAUNCH_STAMPS 0
#endif
// This build's kernels stamp their launches (NT_LAUNCH_STAMPS).
constexpr bool launch_stamps_available() { return NT_LAUNCH_STAMPS != 0; }

// ---- reading them back (host; pure, so the CPU tests drive it) ----------------------------------------

struct StampedLaunch {  // what the profiler knows of each pending launch, in launch order
  int64_t replay = -1;  // which replay of a graph (or window of one) it belongs to; -1: launched eagerly
  bool closes = false;  // the closing launch of a replay: its release ends the replay's last kernel; not a row
  bool counted = true;  // a row; false: timed only to clip the next one's start (a sampled step's lead-in)
};

struct StampedTime {
  bool timed = false;
  uint64_t start_ns = 0, exclusive_start_ns = 0, end_ns = 0;
};

struct StampedTimes {
  std::vector<StampedTime> launches;  // [i] for launches[i] of the call
  int64_t untimed = 0;                // counted launches (not closing ones) without a time
  bool aligned = true;                // false: the slots did not line up with the launches; nothing was timed
  size_t start_slots = 0, release_slots = 0, waiting_for_release = 0;  // what was found, for the message
};

// Gives each launch its times from the slots of one batch (in any order). Start slots, by time, are matched to
// launches in order; release slots, by time, to the start slots that wait for one ({start, 0}). A launch is timed when
// the next launch belongs to the same replay; where the counts disagree nothing is (aligned = false).
StampedTimes times_from_launch_stamps(const std::vector<StampedLaunch>& launches,
                                      const std::vector<LaunchStamp>& slots);

}  // namespace nt::profile
