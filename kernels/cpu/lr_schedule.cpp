// lr_schedule_step on the CPU (contract in kernels/lr_schedule.h; GPU twin kernels/cuda/lr_schedule.cu).
#include "kernels/lr_schedule.h"
#include "kernels/cpu/op_scope.h"

namespace nt::kernels::cpu {

void lr_schedule_step(const Exec& exec, const LrScheduleArgs& a) {
  const OpScope scope(exec, "lr_schedule_step", {.bytes = 2 * sizeof(int64_t) + sizeof(float)});
  const int64_t s = *a.step;
  *a.factor = static_cast<float>(lr_schedule_factor(a.schedule, s));
  *a.step = s + 1;
}

}  // namespace nt::kernels::cpu
