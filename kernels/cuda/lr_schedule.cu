// lr_schedule_step on the GPU (contract in kernels/lr_schedule.h; CPU twin kernels/cpu/lr_schedule.cpp). One thread:
// the step's factor is one value, read by the update kernel that follows it in the stream.
#include "kernels/cuda/launch.cuh"
#include "kernels/lr_schedule.h"

namespace nt::kernels::cuda {

namespace {

__global__ void lr_schedule_step_kernel(LrSchedule schedule, int64_t* __restrict__ step, float* __restrict__ factor,
                                        StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int64_t s = *step;
  *factor = static_cast<float>(lr_schedule_factor(schedule, s));
  *step = s + 1;
}

}  // namespace

void lr_schedule_step(const Exec& exec, const LrScheduleArgs& a) {
  launch(exec, "lr_schedule_step", {.bytes = 2 * sizeof(int64_t) + sizeof(float)}, lr_schedule_step_kernel, dim3(1),
         dim3(1), 0, a.schedule, a.step, a.factor);
}

}  // namespace nt::kernels::cuda
