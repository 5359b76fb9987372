// CPU tests of the small op families: softmax cross-entropy, SGD, batch gather (plain and randomly
// shifted), ReLU.
// Each op against an independent reference: double precision for the arithmetic ones, the exact fp32
// formula for gather and ReLU (which are specified bit for bit).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/activation.h"
#include "kernels/batch.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/optim.h"
#include "kernels/softmax_xent.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

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

// Each row loss is log(s) + (m - x_label) in fp32: s sums C terms, so its relative error (which becomes
// the absolute error of log s) grows like sqrt(C)·eps on random data, and the final additions add a few
// eps of the row loss's own size. Summed over B rows (losses are >= 0, so Σ|loss_b| = |total|).
double xent_loss_allowed(int B, int C, double total) {
  return B * 8 * std::sqrt(double(C)) * kEps + 4 * kEps * std::abs(total);
}

// dlogits = (p - onehot)/B: p carries ~sqrt(C)·eps relative error from s, and where p is near 1 it is
// rounded on a 2^-24 grid, so p - 1 has an absolute error of ~eps/2 however small the result: hence an
// absolute term of 2·eps/B besides the relative one.
Tolerance xent_grad_tolerance(int B, int C) {
  return {2 * kEps / B, 8 * std::sqrt(double(C)) * kEps,
          "softmax gradient: sqrt(C)*eps relative from the exp sum, eps/B absolute where p rounds near 1"};
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
  kernels::softmax_xent(exec, kernels::SoftmaxXentArgs<float>{.B = B, .C = C, .logits = logits.data(),
                                                              .labels = labels.data(),
                                                              .dlogits = with_grad ? r.dlogits.data() : nullptr,
                                                              .loss_sum = &r.loss_sum, .correct = &r.correct});
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
  const Case cases[] = {{1, 10, -3, 3},     {7, 10, -3, 3},   {64, 10, -3, 3},   {65, 33, -3, 3},
                        {5, 1000, -3, 3},   {64, 10, -80, 80}, {9, 1000, -80, 80}, {16, 10, -200, 200},
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
    kernels::softmax_xent(Exec{}, kernels::SoftmaxXentArgs<float>{.B = B, .C = C, .logits = logits.data(),
                                                                  .labels = labels.data(), .dlogits = dlogits.data(),
                                                                  .loss_sum = &loss_sum, .correct = &correct});
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
  kernels::softmax_xent(Exec{}, kernels::SoftmaxXentArgs<float>{.B = 0, .C = 10, .loss_sum = &loss_sum, .correct = &correct});
  REQUIRE(loss_sum == 2.5);
  REQUIRE(correct == 7);
}

// ---- SGD ---------------------------------------------------------------------------------------------

// PyTorch's SGD (dampening 0, no Nesterov) in double, over `steps` steps with fresh gradients each.
void sgd_reference(std::vector<double>& p, std::vector<double>& v, const std::vector<std::vector<float>>& grads,
                   const kernels::SgdHyper& h) {
  for (const auto& grad : grads)
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad[i] + double(h.weight_decay) * p[i];
      v[i] = double(h.momentum) * v[i] + g;
      p[i] -= double(h.lr) * (h.momentum != 0.f ? v[i] : g);
    }
}

TEST_CASE("sgd_update matches PyTorch's SGD in double", "[cpu][optim]") {
  CpuExecs execs;
  const int kSteps = 4;
  const kernels::SgdHyper hypers[] = {
      {0.1f, 0.f, 0.f}, {0.05f, 0.9f, 0.f}, {0.05f, 0.9f, 5e-4f}, {0.01f, 0.f, 1e-2f}, {0.5f, 0.5f, 0.1f}};
  const size_t sizes[] = {1, 7, 1023, 250890};  // 250890: the MLP's parameter count, several parallel chunks
  for (const auto& h : hypers)
    for (size_t n : sizes)
      for (const Exec* exec : {&execs.serial, &execs.pooled}) {
        INFO("n=" << n << " lr=" << h.lr << " momentum=" << h.momentum << " wd=" << h.weight_decay);
        std::vector<float> p = random_floats(n, -1, 1);
        std::vector<double> p_ref(p.begin(), p.end()), v_ref(n, 0.0);
        std::vector<std::vector<float>> grads;
        for (int s = 0; s < kSteps; ++s) grads.push_back(random_floats(n, -1, 1));
        sgd_reference(p_ref, v_ref, grads, h);

        const bool momentum = h.momentum != 0.f;
        std::vector<float> v(momentum ? n : 0, 0.f);  // velocity starts at 0; absent without momentum
        for (const auto& g : grads)
          kernels::sgd_update(*exec, {.n = n, .params = p.data(), .grads = g.data(),
                                      .velocity = momentum ? v.data() : nullptr, .hyper = h});

        // Each step rounds g, v and p a few times (relative eps of values of order 1) and the errors add
        // over the steps; 16 eps per step of the largest value bounds them without hiding a wrong formula.
        Tolerance tol{0, 16.0 * kSteps * kEps, "SGD: a few fp32 roundings per step, accumulated over the steps"};
        NT_REQUIRE_CLOSE(p, p_ref, tol);
        if (momentum) NT_REQUIRE_CLOSE(v, v_ref, tol);
      }
}

TEST_CASE("sgd_update without momentum never touches velocity", "[cpu][optim]") {
  const size_t n = 100;
  auto p = random_floats(n), g = random_floats(n);
  std::vector<float> v = random_floats(n), v_before = v;
  kernels::sgd_update(Exec{}, {.n = n, .params = p.data(), .grads = g.data(), .velocity = v.data(),
                               .hyper = {.lr = 0.1f, .momentum = 0.f, .weight_decay = 1e-3f}});
  REQUIRE(same_bits(v, v_before));
}

TEST_CASE("sgd_update is the same on one thread and on a pool", "[cpu][optim]") {
  CpuExecs execs;
  const size_t n = 250890;
  auto p1 = random_floats(n), g = random_floats(n), v1 = random_floats(n);
  auto p2 = p1, v2 = v1;
  kernels::SgdHyper h{0.05f, 0.9f, 5e-4f};
  kernels::sgd_update(execs.serial, {.n = n, .params = p1.data(), .grads = g.data(), .velocity = v1.data(),
                                     .hyper = h});
  kernels::sgd_update(execs.pooled, {.n = n, .params = p2.data(), .grads = g.data(), .velocity = v2.data(),
                                     .hyper = h});
  REQUIRE(same_bits(p1, p2));
  REQUIRE(same_bits(v1, v2));
}

// ---- batch gather --------------------------------------------------------------------------------------

struct SyntheticData {
  int N, D;
  std::vector<uint8_t> images, labels;
  std::vector<int32_t> perm;
  SyntheticData(int n, int d) : N(n), D(d), images(size_t(n) * d), labels(n), perm(n) {
    std::uniform_int_distribution<int> byte(0, 255), digit(0, 9);
    for (auto& px : images) px = static_cast<uint8_t>(byte(rng()));
    for (auto& l : labels) l = static_cast<uint8_t>(digit(rng()));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
  }
  kernels::BatchSource source() const {
    return {.images = images.data(), .labels = labels.data(), .perm = perm.data(), .D = D, .mean = 0.1307f,
            .std = 0.3081f};
  }
};

TEST_CASE("gather_batch is exactly ToTensor then Normalize of the permuted rows", "[cpu][batch]") {
  CpuExecs execs;
  struct Case {
    int N, D, B;
    int64_t first;
  };
  const Case cases[] = {{50, 784, 17, 10}, {50, 13, 7, 43}, {200, 784, 64, 128}, {3, 1, 3, 0}};
  for (const Case& k : cases)
    for (const Exec* exec : {&execs.serial, &execs.pooled}) {
      INFO("N=" << k.N << " D=" << k.D << " B=" << k.B << " first=" << k.first);
      SyntheticData data(k.N, k.D);
      std::vector<float> x = poisoned(size_t(k.B) * k.D);
      std::vector<int32_t> y(k.B, -1);
      kernels::gather_batch(*exec, {.src = data.source(), .first = k.first, .B = k.B, .x = x.data(), .y = y.data()});

      const float mean = 0.1307f, std_dev = 0.3081f;
      for (int b = 0; b < k.B; ++b) {
        int32_t r = data.perm[k.first + b];
        REQUIRE(y[b] == data.labels[r]);
        for (int d = 0; d < k.D; ++d) {
          float want = (float(data.images[size_t(r) * k.D + d]) / 255.0f - mean) / std_dev;
          REQUIRE(x[size_t(b) * k.D + d] == want);  // bit-exact: the same three fp32 operations
        }
      }
    }
}

// ---- batch gather with random shifts ---------------------------------------------------------------------

constexpr float kShiftMean = 0.1307f, kShiftStd = 0.3081f;  // the normalization of the shift tests (MNIST's)

// Synthetic (C,H,W) images with pixels in [1, 255], so that no source pixel equals the zero fill and a
// translation is recognisable from its output alone.
struct ShiftData {
  int N, C, H, W, D;
  std::vector<uint8_t> images, labels;
  std::vector<int32_t> perm;
  ShiftData(int n, int c, int h, int w)
      : N(n), C(c), H(h), W(w), D(c * h * w), images(size_t(n) * D), labels(n), perm(n) {
    std::uniform_int_distribution<int> byte(1, 255), digit(0, 9);
    for (auto& px : images) px = static_cast<uint8_t>(byte(rng()));
    for (auto& l : labels) l = static_cast<uint8_t>(digit(rng()));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
  }
  kernels::BatchSource source(int k, const uint64_t* key) const {
    kernels::BatchSource s{.images = images.data(), .labels = labels.data(), .perm = perm.data(), .D = D,
                           .mean = kShiftMean, .std = kShiftStd};
    s.height = H, s.width = W, s.shift = k, s.shift_key = key;
    return s;
  }
};

bool same_shift(kernels::PixelShift a, kernels::PixelShift b) { return a.dy == b.dy && a.dx == b.dx; }

TEST_CASE("gather_batch with shift 0 is the plain gather, bit for bit", "[cpu][batch][shift]") {
  CpuExecs execs;
  for (const Exec* exec : {&execs.serial, &execs.pooled}) {
    ShiftData data(100, 1, 28, 28);
    const int B = 37;
    const int64_t first = 50;
    const uint64_t key = kernels::counter_key(7, 3);
    std::vector<float> plain = poisoned(size_t(B) * data.D), unshifted = poisoned(size_t(B) * data.D);
    std::vector<int32_t> y_plain(B, -1), y_unshifted(B, -1);
    kernels::BatchSource src{.images = data.images.data(), .labels = data.labels.data(), .perm = data.perm.data(),
                             .D = data.D, .mean = kShiftMean, .std = kShiftStd};
    kernels::gather_batch(*exec, {.src = src, .first = first, .B = B, .x = plain.data(), .y = y_plain.data()});
    kernels::gather_batch(*exec, {.src = data.source(0, &key), .first = first, .B = B, .x = unshifted.data(),
                                  .y = y_unshifted.data()});
    REQUIRE(same_bits(plain, unshifted));
    REQUIRE(y_plain == y_unshifted);
    kernels::gather_batch(*exec, {.src = data.source(0, nullptr), .first = first, .B = B, .x = unshifted.data(),
                                  .y = y_unshifted.data()});
    REQUIRE(same_bits(plain, unshifted));  // the key is not even read
  }
}

TEST_CASE("gather_batch with shift k translates each image by its drawn (dy, dx), zero-filled", "[cpu][batch][shift]") {
  CpuExecs execs;
  struct Case {
    int N, C, H, W, k, B;
    int64_t first;
  };
  // MNIST's shape; odd and non-square planes; several channels; a shift beyond the image (k > H, W);
  // a one-column image; a batch spanning several CPU tasks.
  const Case cases[] = {{120, 1, 28, 28, 2, 64, 30}, {60, 1, 7, 5, 3, 33, 17}, {40, 3, 9, 11, 1, 40, 0},
                        {30, 1, 4, 3, 8, 25, 5},     {20, 2, 13, 1, 2, 20, 0}, {300, 1, 6, 6, 4, 250, 50}};
  for (const Case& k : cases)
    for (const Exec* exec : {&execs.serial, &execs.pooled}) {
      INFO("N=" << k.N << " C=" << k.C << " H=" << k.H << " W=" << k.W << " k=" << k.k << " B=" << k.B
                << " first=" << k.first);
      ShiftData data(k.N, k.C, k.H, k.W);
      const uint64_t key = kernels::counter_key(rng()(), 1);
      std::vector<float> x = poisoned(size_t(k.B) * data.D);
      std::vector<int32_t> y(k.B, -1);
      kernels::gather_batch(*exec, {.src = data.source(k.k, &key), .first = k.first, .B = k.B, .x = x.data(),
                                    .y = y.data()});

      for (int b = 0; b < k.B; ++b) {
        const int32_t r = data.perm[k.first + b];
        REQUIRE(y[b] == data.labels[r]);
        const kernels::PixelShift drawn = kernels::batch_shift(key, uint64_t(k.first + b), k.k);
        REQUIRE(std::abs(drawn.dy) <= k.k);
        REQUIRE(std::abs(drawn.dx) <= k.k);
        const auto found = matching_shifts(&data.images[size_t(r) * data.D], k.C, k.H, k.W, k.k, kShiftMean, kShiftStd,
                                           &x[size_t(b) * data.D]);
        INFO("b=" << b << " drawn (" << drawn.dy << ", " << drawn.dx << ")");
        REQUIRE(!found.empty());  // some translation in range explains the output exactly
        REQUIRE(std::any_of(found.begin(), found.end(), [&](kernels::PixelShift s) { return same_shift(s, drawn); }));
      }
    }
}

TEST_CASE("the shifts differ across examples and epochs and repeat for the same (seed, epoch)", "[cpu][batch][shift]") {
  CpuExecs execs;
  ShiftData data(500, 1, 12, 10);
  const int k = 2, B = 500;
  const uint64_t seed = 1234;
  auto gather = [&](const Exec& exec, uint64_t epoch) {
    const uint64_t key = kernels::counter_key(seed, epoch);
    std::vector<float> x = poisoned(size_t(B) * data.D);
    std::vector<int32_t> y(B, -1);
    kernels::gather_batch(exec, {.src = data.source(k, &key), .first = 0, .B = B, .x = x.data(), .y = y.data()});
    return x;
  };
  // The shift of each example, recovered from the output alone (pixels >= 1 make it unique here).
  auto shifts_of = [&](const std::vector<float>& x) {
    std::vector<kernels::PixelShift> s;
    for (int b = 0; b < B; ++b) {
      auto found = matching_shifts(&data.images[size_t(data.perm[b]) * data.D], data.C, data.H, data.W, k,
                                   kShiftMean, kShiftStd, &x[size_t(b) * data.D]);
      REQUIRE(found.size() == 1);
      s.push_back(found[0]);
    }
    return s;
  };
  const auto epoch1 = gather(execs.serial, 1);
  REQUIRE(same_bits(epoch1, gather(execs.serial, 1)));  // reproducible
  REQUIRE(same_bits(epoch1, gather(execs.pooled, 1)));  // whatever the thread count
  const auto s1 = shifts_of(epoch1), s2 = shifts_of(gather(execs.serial, 2));

  // Across examples: 500 draws cover every value of dy and of dx and most of the 25 pairs.
  int dy_seen[2 * k + 1] = {}, dx_seen[2 * k + 1] = {};
  std::vector<int> pairs;
  for (const auto& s : s1) {
    ++dy_seen[s.dy + k], ++dx_seen[s.dx + k];
    pairs.push_back((s.dy + k) * (2 * k + 1) + s.dx + k);
  }
  for (int v = 0; v <= 2 * k; ++v) CHECK((dy_seen[v] > 0 && dx_seen[v] > 0));
  std::sort(pairs.begin(), pairs.end());
  CHECK(std::unique(pairs.begin(), pairs.end()) - pairs.begin() >= 20);

  // Across epochs: the same positions get other shifts (equal by chance with probability 1/25 each).
  int same = 0;
  for (int b = 0; b < B; ++b) same += same_shift(s1[b], s2[b]) ? 1 : 0;
  CHECK(same < B / 5);
}

TEST_CASE("batch_shift draws each offset uniformly from [-k, k]", "[cpu][batch][shift]") {
  for (int k : {1, 2, 8}) {
    const int n = 2 * k + 1, draws = 200000;
    std::vector<int> dy(n), dx(n);
    const uint64_t key = kernels::counter_key(99, uint64_t(k));
    for (int p = 0; p < draws; ++p) {
      const auto s = kernels::batch_shift(key, uint64_t(p), k);
      REQUIRE((s.dy >= -k && s.dy <= k && s.dx >= -k && s.dx <= k));
      ++dy[s.dy + k], ++dx[s.dx + k];
    }
    // Each count is binomial with mean draws/n and sd below sqrt(draws/n); 6 sd never fails by chance.
    const double mean = double(draws) / n, bound = 6 * std::sqrt(mean);
    for (int v = 0; v < n; ++v) {
      INFO("k=" << k << " offset " << v - k);
      CHECK(std::abs(dy[v] - mean) < bound);
      CHECK(std::abs(dx[v] - mean) < bound);
    }
  }
}

// ---- ReLU -------------------------------------------------------------------------------------------------

TEST_CASE("relu_forward and relu_backward, out of place and in place", "[cpu][relu]") {
  CpuExecs execs;
  const size_t sizes[] = {1, 7, 1000, 300001};  // the last spans several parallel chunks
  for (size_t n : sizes)
    for (const Exec* exec : {&execs.serial, &execs.pooled}) {
      INFO("n=" << n);
      std::vector<float> x = random_floats(n, -1, 1);
      x[0] = 0.f;  // the boundary: relu(0) = 0 and its mask is 0
      std::vector<float> dy = random_floats(n, -1, 1);
      std::vector<float> y_want(n), dx_want(n);
      for (size_t i = 0; i < n; ++i) {
        y_want[i] = x[i] > 0.f ? x[i] : 0.f;
        dx_want[i] = x[i] > 0.f ? dy[i] : 0.f;
      }

      std::vector<float> y = poisoned(n);
      kernels::relu_forward(*exec, kernels::ReluArgs<float>{.n = n, .x = x.data(), .y = y.data()});
      REQUIRE(same_bits(y, y_want));
      std::vector<float> dx = poisoned(n);
      kernels::relu_backward(*exec, kernels::ReluArgs<float>{.n = n, .y = y.data(), .dy = dy.data(), .dx = dx.data()});
      REQUIRE(same_bits(dx, dx_want));

      std::vector<float> inplace = x;
      kernels::relu_forward(*exec, kernels::ReluArgs<float>{.n = n, .x = inplace.data(), .y = inplace.data()});
      REQUIRE(same_bits(inplace, y_want));
      std::vector<float> grad = dy;
      kernels::relu_backward(*exec,
                             kernels::ReluArgs<float>{.n = n, .y = y.data(), .dy = grad.data(), .dx = grad.data()});
      REQUIRE(same_bits(grad, dx_want));
    }
}

TEST_CASE("relu keeps NaN in the forward pass and masks infinite gradients", "[cpu][relu]") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {kNaN, -inf, inf, -2.f, 3.f};
  std::vector<float> y = poisoned(x.size());
  kernels::relu_forward(Exec{}, kernels::ReluArgs<float>{.n = x.size(), .x = x.data(), .y = y.data()});
  REQUIRE(std::isnan(y[0]));
  REQUIRE(y[1] == 0.f);
  REQUIRE(y[2] == inf);
  REQUIRE(y[3] == 0.f);
  REQUIRE(y[4] == 3.f);

  std::vector<float> yb = {0.f, -1.f, 2.f};
  std::vector<float> dy = {inf, -inf, 5.f};
  std::vector<float> dx = poisoned(3);
  kernels::relu_backward(Exec{}, kernels::ReluArgs<float>{.n = 3, .y = yb.data(), .dy = dy.data(), .dx = dx.data()});
  REQUIRE(dx == std::vector<float>{0.f, 0.f, 5.f});
}

}  // namespace
}  // namespace nt::test
