// The profiler's hold on the CPU: nothing to do. Host ops run when they are called, so there is no queue
// for a timer to get ahead of (see kernels/profile_delay.h).
#include "kernels/profile_delay.h"

namespace nt::kernels::cpu {

void profile_hold(const Exec&, const ProfileHoldArgs&) {}

}  // namespace nt::kernels::cpu
