// The profiler's hold: keep the GPU behind the host for the length of a step, so that each start event is
// recorded while its kernel is already queued (profile/kernel_profiler.h, docs/profiler.md).
//
//   profile_hold(exec, {flag, target})  the stream waits until *flag - target >= 0 (as int32, so the counter
//                                      may wrap), where flag is host-mapped memory that the host writes;
//                                      or until a timeout of kProfileHoldTimeoutUs has passed, a safety net
//                                      so that a hold the host never releases cannot hang the device.
// CPU: nothing to hold (a host op runs when it is called), so the CPU twin does nothing.
#pragma once

#include <cstdint>

#include "kernels/dispatch.h"
#include "profile/hold.h"

namespace nt::kernels {

inline constexpr uint32_t kProfileHoldTimeoutUs = 50'000;

struct ProfileHoldArgs {
  const uint32_t* flag = nullptr;  // (1) host-mapped, written by the host; read until it reaches target
  uint32_t target = 0;
};

namespace cpu {
void profile_hold(const Exec& exec, const ProfileHoldArgs& a);
}
namespace cuda {
void profile_hold(const Exec& exec, const ProfileHoldArgs& a);
}
inline void profile_hold(const Exec& exec, const ProfileHoldArgs& a) {
  dispatch<cpu::profile_hold, cuda::profile_hold>(exec, a);
}

// The hold for a profiler on `exec`'s backend: profile_hold through the launch path but unobserved (it is
// not a kernel of the model), on the stream the profiler names. None on the CPU, and none with debug-sync,
// which would synchronize right after the hold, before the host could release it.
inline profile::HoldFn profile_hold_fn(const Exec& exec) {
  if (!exec.on_cuda() || exec.debug_sync) return {};
  Exec unobserved = exec;
  unobserved.observer = nullptr;
  return [unobserved](void* stream, const uint32_t* flag, uint32_t target) {
    Exec e = unobserved;
    e.stream = stream;
    profile_hold(e, {.flag = flag, .target = target});
  };
}

}  // namespace nt::kernels
