// The profiler's hold on the GPU: one thread spins until the host releases the step (kernels/profile_delay.h).
//
// flag: one uint32 in host-mapped pinned memory, read with volatile loads so each poll goes to memory; the
// host stores the step's target when the step has been queued. The poll sleeps ~0.5 us between reads
// (__nanosleep, sm_70+), so the waiting thread takes next to no issue slots, and the release is seen within
// about a microsecond plus the PCIe read latency. %globaltimer (ns) bounds the wait: past
// kProfileHoldTimeoutUs the kernel returns anyway. The hold is never profiled itself (the profiler launches
// it unobserved) and sits before a step's first start event, so it is never counted as kernel time.
#include <cstdint>

#include "kernels/cuda/global_timer.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/profile_delay.h"

namespace nt::kernels::cuda {

namespace {

// One thread; returns when *flag has reached target (wrap-around safe) or after timeout_ns.
__global__ void profile_hold_kernel(const volatile uint32_t* flag, uint32_t target, uint64_t timeout_ns,
                                    StampRing stamps) {
  begin_dependent_kernel(stamps);
  const uint64_t t0 = global_timer_ns();
  while (static_cast<int32_t>(*flag - target) < 0 && global_timer_ns() - t0 < timeout_ns) __nanosleep(500);
}

}  // namespace

void profile_hold(const Exec& exec, const ProfileHoldArgs& a) {
  launch(exec, "profile_hold", profile::OpCost{}, profile_hold_kernel, dim3(1), dim3(1), 0, a.flag, a.target,
         uint64_t{kProfileHoldTimeoutUs} * 1000);
}

}  // namespace nt::kernels::cuda
