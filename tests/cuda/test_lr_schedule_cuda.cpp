// CUDA test of lr_schedule_step (kernels/lr_schedule.h) against its CPU twin: every step of runs of 1 to 1873 steps and
// a few past the end, both schedules, several warm-up fractions, from a counter at 0 and from one mid-run (a resumed
// run). The factor is poisoned before each launch; it must equal the CPU's, or be one fp32 ulp from it where CUDA's
// double cos (2 ulp) rounds to the other side (kernels/lr_schedule.h); the counter exact.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/lr_schedule.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::LrSchedule;
using kernels::LrScheduleKind;

int32_t float_bits(float f) {
  int32_t i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}

TEST_CASE("lr_schedule_step on CUDA gives the CPU twin's factor at every step", "[cuda][lr-schedule]") {
  CudaExec cuda;
  const kernels::Exec& gpu = cuda.exec;
  DeviceBuffer<int64_t> d_step(gpu, 1);
  DeviceBuffer<float> d_factor(gpu, 1);
  size_t compared = 0, one_ulp = 0;
  for (const auto kind : {LrScheduleKind::warmup_cosine, LrScheduleKind::one_cycle})
    for (const int64_t steps : {1, 3, 469, 1873})
      for (const double warmup : {0.0, 0.1, 0.3})
        for (const int64_t first : {int64_t(0), steps / 2}) {
          INFO("kind " << int(kind) << " steps " << steps << " warmup " << warmup << " from step " << first);
          const LrSchedule schedule{.kind = kind, .total_steps = steps, .warmup = warmup};
          int64_t cpu_step = first;
          d_step.upload({first});
          for (int64_t s = first; s < steps + 3; ++s) {
            float cpu_factor = 0;
            kernels::lr_schedule_step(kernels::Exec{},
                                      {.schedule = schedule, .step = &cpu_step, .factor = &cpu_factor});
            d_factor.upload({std::nanf("")});
            kernels::lr_schedule_step(gpu, {.schedule = schedule, .step = d_step.get(), .factor = d_factor.get()});
            const float got = d_factor.download()[0];
            INFO("step " << s << " cpu " << cpu_factor << " gpu " << got);
            const int32_t distance = std::abs(float_bits(got) - float_bits(cpu_factor));
            REQUIRE(std::isfinite(got));
            REQUIRE(distance <= 1);
            one_ulp += distance == 1;
            ++compared;
          }
          REQUIRE(d_step.download()[0] == cpu_step);
          REQUIRE(cpu_step == steps + 3);
        }
  WARN(one_ulp << " of " << compared << " factors one fp32 ulp from the CPU's");
  CHECK(one_ulp * 100 <= compared);  // the last bit of a double cos decides a float's rounding rarely
}

}  // namespace
}  // namespace nt::test
