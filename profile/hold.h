// The profiler's way to keep the GPU behind the host for the length of a step (see kernel_profiler.h).
//
// A HoldFn enqueues on `stream` a wait that ends when the host has written a value >= `target` into
// *device_flag (host-mapped memory that the profiler owns and writes), or after a safety timeout. The launch
// path provides one (kernels/profile_delay.h: profile_hold_fn); profile/ cannot launch kernels itself.
#pragma once

#include <cstdint>
#include <functional>

namespace nt::profile {

using HoldFn = std::function<void(void* stream, const uint32_t* device_flag, uint32_t target)>;

}  // namespace nt::profile
