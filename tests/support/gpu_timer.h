// Profiler options for the profiler's own GPU tests: exactly the timer asked for (no fallback from CUPTI to events,
// which would hide a CUPTI that does not load), on the device "cuda", timing replayed graphs when asked.
#pragma once

#include "profile/kernel_profiler.h"

namespace nt::test {

inline profile::ProfilerOptions gpu_timer(profile::Timing timing, bool graphs) {
  profile::ProfilerOptions o;
  o.timing = timing;
  o.cupti_fallback = false;
  o.device = "cuda";
  o.graphs = graphs;
  return o;
}

}  // namespace nt::test
