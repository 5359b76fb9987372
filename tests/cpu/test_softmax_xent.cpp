// CPU tests of softmax cross-entropy (kernels/softmax_xent.h) against an independent reference in double precision,
// written from the definition (stable log-sum-exp, argmax with the lowest index on ties, as torch.argmax), on one
// thread and on a pool: loss, count and gradient; one class, ties, accumulation across calls, NaN logits and bad
// labels, B == 0. The loss and the gradient within xent_loss_allowed and xent_grad_tolerance (support/test_support.h,
// which give their reasons: sqrt(C)·eps from the exp sum, eps/B where p rounds near 1); the count exact, and
// evaluation mode the same bits as training.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/softmax_xent.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

// ---- softmax cross-entropy ---------------------------------------------------------------------------

struct XentReference {
  double loss_total = 0;  // Σ_b loss_b, what the op adds to loss_sum
  int64_t correct = 0;
  std::vector<double> dlogits;  // (B,C)
};

// The first index of the largest value (torch.argmax on rows without NaN).
int argmax_lowest(const float* x, int C) {
  int arg = 0;
  for (int c = 1; c < C; ++c)
    if (x[c] > x[arg]) arg = c;
  return arg;
}

// Double precision, written from the definition: stable log-sum-exp, argmax with the lowest index on ties.
XentReference xent_reference(const std::vector<float>& logits, const std::vector<int32_t>& labels, int B, int C) {
  XentReference ref;
  ref.dlogits.resize(size_t(B) * C);
  double total = 0;
  for (int b = 0; b < B; ++b) {
    const float* x = &logits[size_t(b) * C];
    const int arg = argmax_lowest(x, C);
    double m = x[arg], s = 0;
    for (int c = 0; c < C; ++c) s += std::exp(double(x[c]) - m);
    total += m + std::log(s) - x[labels[b]];
    ref.correct += arg == labels[b];
    for (int c = 0; c < C; ++c)
      ref.dlogits[size_t(b) * C + c] = (std::exp(double(x[c]) - m) / s - (c == labels[b] ? 1.0 : 0.0)) / B;
  }
  ref.loss_total = total;
  return ref;
}

struct XentResult {
  double loss_sum = 0;
  int64_t correct = 0;
  std::vector<float> dlogits;
};

XentResult run_xent(const Exec& exec, const std::vector<float>& logits, const std::vector<int32_t>& labels, int B,
                    int C, bool with_grad) {
  XentResult r;
  r.dlogits = poisoned(with_grad ? size_t(B) * C : 0);
  kernels::softmax_xent(exec, kernels::SoftmaxXentArgs<float>{.B = B,
                                                              .C = C,
                                                              .logits = logits.data(),
                                                              .labels = labels.data(),
                                                              .dlogits = with_grad ? r.dlogits.data() : nullptr,
                                                              .loss_sum = &r.loss_sum,
                                                              .correct = &r.correct});
  return r;
}

void check_xent_against_reference(const Exec& exec, const std::vector<float>& logits,
                                  const std::vector<int32_t>& labels, int B, int C) {
  XentReference ref = xent_reference(logits, labels, B, C);
  XentResult got = run_xent(exec, logits, labels, B, C, true);
  INFO("B=" << B << " C=" << C << " loss " << got.loss_sum << " want " << ref.loss_total);
  REQUIRE(std::abs(got.loss_sum - ref.loss_total) <= xent_loss_allowed(B, C, ref.loss_total));
  REQUIRE(got.correct == ref.correct);
  NT_REQUIRE_CLOSE(got.dlogits, ref.dlogits, xent_grad_tolerance(B, C));

  // Evaluation mode (no gradient) gives the same loss and count, bit for bit.
  XentResult eval = run_xent(exec, logits, labels, B, C, false);
  REQUIRE(eval.loss_sum == got.loss_sum);
  REQUIRE(eval.correct == got.correct);
}

TEST_CASE("softmax_xent matches a double-precision reference", "[cpu][xent]") {
  CpuExecs execs;
  struct Case {
    int B, C;
    float lo, hi;
  };
  // Shapes: a single row, odd sizes, the training batch, a wide row (C > 32 lanes), a large batch that
  // takes the parallel path; logits of ±80 and ±200 overflow exp() unless the row max is subtracted.
  const Case cases[] = {{1, 10, -3, 3},    {7, 10, -3, 3},    {64, 10, -3, 3},    {65, 33, -3, 3},
                        {5, 1000, -3, 3},  {64, 10, -80, 80}, {9, 1000, -80, 80}, {16, 10, -200, 200},
                        {4000, 10, -5, 5}, {40, 1000, -3, 3}};
  for (const Case& k : cases) {
    auto logits = random_floats(size_t(k.B) * k.C, k.lo, k.hi);
    auto labels = random_labels(k.B, k.C);
    check_xent_against_reference(execs.serial, logits, labels, k.B, k.C);
    check_xent_against_reference(execs.pooled, logits, labels, k.B, k.C);
  }
}

TEST_CASE("softmax_xent with one class has zero loss and gradient", "[cpu][xent]") {
  const int B = 6, C = 1;
  auto logits = random_floats(B, -50, 50);
  std::vector<int32_t> labels(B, 0);
  XentResult r = run_xent(Exec{}, logits, labels, B, C, true);
  REQUIRE(r.loss_sum == 0.0);  // log(1) + (x - x), exact
  REQUIRE(r.correct == B);
  for (float d : r.dlogits) REQUIRE(d == 0.f);
}

TEST_CASE("softmax_xent ties take the lowest index, as torch.argmax", "[cpu][xent]") {
  const int C = 10;
  // Row 0: max 5 at classes 2 and 7, label 2 -> counted. Row 1: same logits, label 7 -> not counted.
  // Row 2: all equal, label 0 -> counted. Row 3: all equal, label 4 -> not counted.
  std::vector<float> logits(4 * C, 0.f);
  logits[2] = logits[7] = 5.f;
  logits[C + 2] = logits[C + 7] = 5.f;
  std::vector<int32_t> labels = {2, 7, 0, 4};
  XentResult r = run_xent(Exec{}, logits, labels, 4, C, true);
  REQUIRE(r.correct == 2);
  XentReference ref = xent_reference(logits, labels, 4, C);
  REQUIRE(std::abs(r.loss_sum - ref.loss_total) <= xent_loss_allowed(4, C, ref.loss_total));
}

TEST_CASE("softmax_xent accumulates loss_sum and correct across calls", "[cpu][xent]") {
  const int B = 64, C = 10;
  auto logits = random_floats(size_t(B) * C, -4, 4);
  auto labels = random_labels(B, C);
  XentResult once = run_xent(Exec{}, logits, labels, B, C, false);

  double loss_sum = 1.25;  // counters already holding earlier batches
  int64_t correct = 3;
  std::vector<float> dlogits = poisoned(size_t(B) * C);
  for (int call = 0; call < 2; ++call)
    kernels::softmax_xent(Exec{}, kernels::SoftmaxXentArgs<float>{.B = B,
                                                                  .C = C,
                                                                  .logits = logits.data(),
                                                                  .labels = labels.data(),
                                                                  .dlogits = dlogits.data(),
                                                                  .loss_sum = &loss_sum,
                                                                  .correct = &correct});
  REQUIRE(loss_sum == (1.25 + once.loss_sum) + once.loss_sum);  // each call adds the same double
  REQUIRE(correct == 3 + 2 * once.correct);
}

TEST_CASE("softmax_xent does not hide NaN logits or bad labels", "[cpu][xent]") {
  const int B = 3, C = 10;
  auto logits = random_floats(size_t(B) * C, -2, 2);
  std::vector<int32_t> labels = {1, 2, 3};
  SECTION("a NaN logit makes the batch loss NaN, and only its row's gradient") {
    logits[C + 4] = kNaN;
    XentResult r = run_xent(Exec{}, logits, labels, B, C, true);
    REQUIRE(std::isnan(r.loss_sum));
    for (int c = 0; c < C; ++c) {
      REQUIRE(std::isfinite(r.dlogits[c]));
      REQUIRE(std::isnan(r.dlogits[C + c]));
      REQUIRE(std::isfinite(r.dlogits[2 * C + c]));
    }
  }
  SECTION("a label outside [0,C) gives a NaN loss and is never counted") {
    labels[1] = C;
    XentResult r = run_xent(Exec{}, logits, labels, B, C, false);
    REQUIRE(std::isnan(r.loss_sum));
    const int64_t valid_hits =
        (argmax_lowest(&logits[0], C) == labels[0]) + (argmax_lowest(&logits[2 * C], C) == labels[2]);
    REQUIRE(r.correct == valid_hits);
  }
}

TEST_CASE("softmax_xent with B == 0 touches nothing", "[cpu][xent]") {
  double loss_sum = 2.5;
  int64_t correct = 7;
  kernels::softmax_xent(Exec{},
                        kernels::SoftmaxXentArgs<float>{.B = 0, .C = 10, .loss_sum = &loss_sum, .correct = &correct});
  REQUIRE(loss_sum == 2.5);
  REQUIRE(correct == 7);
}

}  // namespace
}  // namespace nt::test
