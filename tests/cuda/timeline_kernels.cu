#include "tests/cuda/timeline_kernels.h"

#include "core/error.h"
#include "kernels/cuda/global_timer.cuh"
#include "kernels/cuda/launch.cuh"
#include "profile/launch_observer.h"

namespace nt::test {

namespace {

using kernels::cuda::global_timer_ns;
using kernels::cuda::StampRing;

__device__ void spin_for(uint64_t ns) {
  const uint64_t t0 = global_timer_ns();
  while (global_timer_ns() - t0 < ns) {
  }
}

__global__ void spin_kernel(int micros, bool beside, StampRing stamps) {
  kernels::cuda::begin_kernel(beside, stamps);
  if (threadIdx.x == 0) spin_for(uint64_t(micros) * 1000);
  kernels::cuda::end_kernel(beside, stamps);
}

constexpr int kMaxPhases = 4;
struct PhaseMicros {
  int n;
  int micros[kMaxPhases];
};

__global__ void phased_spin_kernel(PhaseMicros phases, profile::PhaseStamps phase_stamps, StampRing stamps) {
  kernels::cuda::begin_dependent_kernel(stamps);
  if (threadIdx.x != 0) return;
  for (int k = 0; k < phases.n; ++k) {
    phase_stamps.mark(static_cast<uint32_t>(k));
    spin_for(uint64_t(phases.micros[k]) * 1000);
  }
  phase_stamps.end();
}

constexpr const char* kPhaseNames[kMaxPhases] = {"phase 0", "phase 1", "phase 2", "phase 3"};

}  // namespace

void launch_spin(const kernels::Exec& exec, const char* name, int micros, bool beside) {
  profile::OpCost cost;
  cost.overlaps_previous = beside;
  kernels::cuda::launch(exec, name, cost, spin_kernel, dim3(1), dim3(32), 0, micros, beside);
}

void launch_phased_spin(const kernels::Exec& exec, const int* phase_micros, int count) {
  NT_CHECK(count >= 1 && count <= kMaxPhases, "launch_phased_spin: 1 to ", kMaxPhases, " phases");
  PhaseMicros phases{count, {}};
  for (int k = 0; k < count; ++k) phases.micros[k] = phase_micros[k];
  const auto stamps = profile::phase_stamps_for(exec.observer, kPhaseNames, static_cast<size_t>(count));
  kernels::cuda::launch(exec, "phased_spin", profile::OpCost{}, phased_spin_kernel, dim3(1), dim3(32), 0, phases,
                        stamps);
}

}  // namespace nt::test
