// Per-step learning-rate schedules (train --lr-schedule warmup-cosine | one-cycle). The optimizer's update multiplies
// its lr by a device-resident factor (kernels/optim.h, lr_scale); lr_schedule_step sets that factor at the start of
// each optimizer step from a device-resident step counter, so one captured epoch replays with the right factor at
// every step, and a resumed run continues from the counter its checkpoint holds.
//
// For step s (0-based) of a run of T steps, with warm-up fraction w:
//   warmup-cosine   W = max(1, round(w·T)) steps rising linearly, then cosine annealing to 0 at step T:
//                     s < W:  (s + 1) / W
//                     s ≥ W:  (1 + cos(π·(s − W) / (T − W))) / 2
//   one-cycle       PyTorch's OneCycleLR(max_lr = lr, total_steps = T, pct_start = w, anneal_strategy 'cos',
//                   div_factor 25, final_div_factor 1e4, three_phase False), the rate only (no momentum cycling):
//                     initial = 1/25, minimum = initial/1e4, up = w·T − 1
//                     s ≤ up:  anneal(initial, 1, s / up)
//                     s > up:  anneal(1, minimum, (s − up) / (T − 1 − up))
//                     anneal(a, b, p) = b + (a − b)/2 · (1 + cos(π·p))
//   Past the last step (s ≥ T) the factor stays at its value for T − 1.
// Computed in double on both backends and rounded once to fp32. CUDA's double cos is within 2 ulp of the correctly
// rounded value (CUDA C Programming Guide, "Double-Precision Floating-Point Functions"), so the GPU's fp32 factor is
// the CPU's or, rarely, one fp32 ulp from it: the GPU test allows that, and the update it scales differs from the CPU
// twin's by at most 1 part in 2^23.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/dispatch.h"

namespace nt::kernels {

enum class LrScheduleKind : int32_t { warmup_cosine, one_cycle };

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::warmup_cosine;
  int64_t total_steps = 1;  // T >= 1: every optimizer step of the run
  double warmup = 0.1;      // w in [0, 1): the fraction of T over which the rate rises
};

NT_HOST_DEVICE inline double lr_schedule_cos(double x) {
#if defined(__CUDA_ARCH__)
  return ::cos(x);
#else
  return std::cos(x);
#endif
}

// The factor on the optimizer's lr at step s (see above).
NT_HOST_DEVICE inline double lr_schedule_factor(const LrSchedule& schedule, int64_t s) {
  constexpr double kPi = 3.14159265358979323846;
  const int64_t steps = schedule.total_steps;
  if (s >= steps) s = steps - 1;
  if (schedule.kind == LrScheduleKind::warmup_cosine) {
    int64_t warm = static_cast<int64_t>(schedule.warmup * double(steps) + 0.5);
    warm = warm < 1 ? 1 : (warm > steps ? steps : warm);
    if (s < warm) return double(s + 1) / double(warm);
    return 0.5 * (1.0 + lr_schedule_cos(kPi * double(s - warm) / double(steps - warm)));
  }
  constexpr double kInitial = 1.0 / 25.0, kMinimum = kInitial / 1e4;
  auto anneal = [](double from, double to, double pct) {
    return to + (from - to) / 2.0 * (1.0 + lr_schedule_cos(kPi * pct));
  };
  const double up = schedule.warmup * double(steps) - 1.0;
  if (double(s) <= up || steps == 1) return anneal(kInitial, 1.0, up > 0 ? double(s) / up : 1.0);
  const double down = double(steps - 1) - up;
  return anneal(1.0, kMinimum, down > 0 ? (double(s) - up) / down : 1.0);
}

// lr_schedule_step reads *step (s), writes *factor = lr_schedule_factor(schedule, s) rounded to fp32, and leaves
// *step = s + 1. One value each: a launch of one thread on the GPU.
struct LrScheduleArgs {
  LrSchedule schedule;
  int64_t* step = nullptr;  // (1) the optimizer steps taken so far, read and written
  float* factor = nullptr;  // (1) the optimizer's lr factor, written
};

namespace cpu {
void lr_schedule_step(const Exec& exec, const LrScheduleArgs& a);
}
namespace cuda {
void lr_schedule_step(const Exec& exec, const LrScheduleArgs& a);
}
inline void lr_schedule_step(const Exec& exec, const LrScheduleArgs& a) {
  dispatch<cpu::lr_schedule_step, cuda::lr_schedule_step>(exec, a);
}

}  // namespace nt::kernels
