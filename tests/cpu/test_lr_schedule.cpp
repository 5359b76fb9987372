// CPU tests of the per-step learning-rate schedules (kernels/lr_schedule.h):
//   one-cycle against a transcription of PyTorch's OneCycleLR.get_lr (its phase loop, anneal_strategy 'cos'), for
//   run lengths 1 to 1873 steps and several warm-up fractions, to 1e-15 (the same double operations in another order);
//   its anchors: 1/25 at the first step (one rounding off), exactly 1 at the end of the rise when that is a step and
//   1/25/1e4 at the last;
//   warmup-cosine: linear to 1 over round(w·T) steps, then non-increasing and positive to the last step;
//   past the last step the factor holds; lr_schedule_step reads and advances the counter;
//   train's flags: --warmup out of range or without a per-step schedule is one line and exit 2.
// Exact resume across a per-step schedule is in check_resume_is_exact (tests/support/test_support.cpp).
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/lr_schedule.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::LrSchedule;
using kernels::LrScheduleKind;

// PyTorch's OneCycleLR (torch/optim/lr_scheduler.py), lr / max_lr at step_num, two phases, cos annealing.
double one_cycle_reference(int64_t step_num, int64_t total_steps, double pct_start) {
  const double initial = 1.0 / 25.0, minimum = initial / 1e4;
  struct Phase {
    double end_step, start, end;
  };
  const Phase phases[] = {{pct_start * double(total_steps) - 1, initial, 1.0}, {double(total_steps - 1), 1.0, minimum}};
  double start_step = 0;
  for (int i = 0; i < 2; ++i) {
    const Phase& phase = phases[i];
    if (double(step_num) <= phase.end_step || i == 1) {
      const double pct = (double(step_num) - start_step) / (phase.end_step - start_step);
      return phase.end + (phase.start - phase.end) / 2.0 * (std::cos(M_PI * pct) + 1);
    }
    start_step = phase.end_step;
  }
  return 0;
}

TEST_CASE("one-cycle follows PyTorch's OneCycleLR step by step", "[cpu][lr-schedule]") {
  for (const int64_t steps : {2, 7, 100, 469, 1873})
    for (const double pct : {0.3, 0.25, 0.5, 0.1}) {
      INFO("steps " << steps << " pct_start " << pct);
      const LrSchedule schedule{.kind = LrScheduleKind::one_cycle, .total_steps = steps, .warmup = pct};
      // PyTorch divides by zero when its rise ends at step 0 (pct_start * T == 1): not a run anyone configures.
      if (pct * double(steps) - 1 <= 0) continue;
      for (int64_t s = 0; s < steps; ++s) {
        const double want = one_cycle_reference(s, steps, pct), got = kernels::lr_schedule_factor(schedule, s);
        INFO("step " << s);
        REQUIRE(std::abs(got - want) <= 1e-15);
      }
      // 1 + (1/25 - 1): PyTorch's anneal at pct 0, one rounding from 1/25.
      CHECK(std::abs(kernels::lr_schedule_factor(schedule, 0) - 1.0 / 25.0) <= 1e-16);
      CHECK(kernels::lr_schedule_factor(schedule, steps - 1) == 1.0 / 25.0 / 1e4);
    }
  // The rise ends on a step when pct_start * T is whole: the peak is exactly 1 there.
  const LrSchedule at_hundred{.kind = LrScheduleKind::one_cycle, .total_steps = 100, .warmup = 0.3};
  CHECK(kernels::lr_schedule_factor(at_hundred, 29) == 1.0);
  CHECK(kernels::lr_schedule_factor(at_hundred, 28) < 1.0);
  CHECK(kernels::lr_schedule_factor(at_hundred, 30) < 1.0);
}

TEST_CASE("warmup-cosine rises linearly to 1, then anneals towards 0 without reaching it", "[cpu][lr-schedule]") {
  for (const int64_t steps : {1, 2, 10, 469, 1873})
    for (const double warmup : {0.0, 0.05, 0.1, 0.5}) {
      INFO("steps " << steps << " warmup " << warmup);
      const LrSchedule schedule{.kind = LrScheduleKind::warmup_cosine, .total_steps = steps, .warmup = warmup};
      const int64_t warm = std::min<int64_t>(steps, std::max<int64_t>(1, std::llround(warmup * double(steps))));
      for (int64_t s = 0; s < warm; ++s)
        REQUIRE(kernels::lr_schedule_factor(schedule, s) == double(s + 1) / double(warm));
      double before = kernels::lr_schedule_factor(schedule, warm - 1);
      CHECK(before == 1.0);
      for (int64_t s = warm; s < steps; ++s) {
        const double f = kernels::lr_schedule_factor(schedule, s);
        INFO("step " << s);
        REQUIRE(f <= before);
        REQUIRE(f > 0);
        before = f;
      }
      if (warm < steps) CHECK(kernels::lr_schedule_factor(schedule, warm) == 1.0);  // cos(0): the peak held a step
    }
}

TEST_CASE("past the last step a schedule holds its last factor", "[cpu][lr-schedule]") {
  for (const auto kind : {LrScheduleKind::warmup_cosine, LrScheduleKind::one_cycle}) {
    const LrSchedule schedule{.kind = kind, .total_steps = 50, .warmup = 0.2};
    const double last = kernels::lr_schedule_factor(schedule, 49);
    CHECK(kernels::lr_schedule_factor(schedule, 50) == last);
    CHECK(kernels::lr_schedule_factor(schedule, 5000) == last);
  }
}

TEST_CASE("lr_schedule_step writes the factor of the counter's step and advances it", "[cpu][lr-schedule]") {
  const LrSchedule schedule{.kind = LrScheduleKind::one_cycle, .total_steps = 40, .warmup = 0.3};
  int64_t step = 3;
  float factor = std::nanf("");  // poisoned
  for (int64_t s = 3; s < 45; ++s) {
    kernels::lr_schedule_step(kernels::Exec{}, {.schedule = schedule, .step = &step, .factor = &factor});
    REQUIRE(step == s + 1);
    REQUIRE(factor == static_cast<float>(kernels::lr_schedule_factor(schedule, s)));
  }
}

TEST_CASE("train refuses --warmup out of range, or without a per-step schedule, in one line",
          "[cpu][lr-schedule][cli]") {
  struct Case {
    const char* flags;
    const char* says;
  };
  for (const Case c :
       {Case{"--lr-schedule one-cycle --warmup 1", "--warmup: must be in [0, 1), got 1"},
        Case{"--lr-schedule warmup-cosine --warmup -0.5", "--warmup: must be in [0, 1), got -0.5"},
        Case{"--warmup 0.2", "--warmup: applies to --lr-schedule warmup-cosine or one-cycle, not constant"},
        Case{"--lr-schedule cosine --warmup 0.2", "not cosine"}, Case{"--lr-schedule triangle", "--lr-schedule"}}) {
    const auto r = run_command(cat(cli_path(), " train --device cpu --data ", mnist_dir(), " ", c.flags));
    INFO(c.flags << "\n" << r.out);
    CHECK(r.exit_code == 2);
    CHECK(r.out.find(c.says) != std::string::npos);
  }
}

}  // namespace
}  // namespace nt::test
