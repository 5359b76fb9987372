// The fused classifier head on CUDA against its CPU twin (the unfused ops in sequence), on fresh random
// inputs, outputs poisoned with NaN. The two sum in different orders, so every output is compared within
// a tolerance derived below from the fp32 rounding of each sum and its propagation through the softmax.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/classifier_head.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::ClassifierHeadArgs;
using kernels::Exec;

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::abs(x)));
  return m;
}

enum class HeadInput { uniform, large_logits, tied_classes };

const char* input_name(HeadInput kind) {
  return kind == HeadInput::uniform ? "uniform" : kind == HeadInput::large_logits ? "large logits" : "tied classes";
}

// The host side of one head problem, and its outputs.
struct HeadCase {
  int B, K, C;
  bool bias, backward, dx, mask;
  std::vector<float> x, weight, bias_v;
  std::vector<int32_t> labels;

  HeadCase(int B_, int K_, int C_, bool bias_, bool backward_, bool dx_, bool mask_, HeadInput kind)
      : B(B_), K(K_), C(C_), bias(bias_), backward(backward_), dx(dx_), mask(mask_) {
    x = random_floats(size_t(B) * K, -1, 1);  // half of x <= 0: the mask selects
    const float w = kind == HeadInput::large_logits ? 80.f / std::sqrt(float(K)) * 2 : 1.f / std::sqrt(float(K));
    weight = random_floats(size_t(C) * K, -w, w);
    bias_v = random_floats(size_t(C), -0.5f, 0.5f);
    if (kind == HeadInput::tied_classes && C >= 3) {  // class 2 duplicates class 0: equal logits, the tie rule
      std::copy_n(weight.begin(), K, weight.begin() + 2 * K);
      bias_v[2] = bias_v[0];
    }
    labels = random_labels(size_t(B), C);
  }
};

struct HeadOutputs {
  std::vector<float> logits, dlogits, dweight, dbias, dx;
  double loss = 0;
  int64_t correct = 0;
};

constexpr double kLossBefore = 0.25;  // the counters already hold an earlier batch
constexpr int64_t kCorrectBefore = 3;

HeadOutputs run_cpu(const HeadCase& c, kernels::Math math = kernels::Math::fp32) {
  HeadOutputs o;
  o.logits.assign(size_t(c.B) * c.C, kPoison);
  o.dlogits.assign(size_t(c.B) * c.C, kPoison);
  o.dweight.assign(size_t(c.C) * c.K, kPoison);
  o.dbias.assign(size_t(c.C), kPoison);
  o.dx.assign(size_t(c.B) * c.K, kPoison);
  o.loss = kLossBefore, o.correct = kCorrectBefore;
  ClassifierHeadArgs h;
  h.B = c.B, h.K = c.K, h.C = c.C;
  h.x = c.x.data(), h.weight = c.weight.data(), h.bias = c.bias ? c.bias_v.data() : nullptr;
  h.labels = c.labels.data(), h.logits = o.logits.data(), h.loss_sum = &o.loss, h.correct = &o.correct;
  if (c.backward) {
    h.dlogits = o.dlogits.data(), h.dweight = o.dweight.data(), h.dbias = c.bias ? o.dbias.data() : nullptr;
    h.dx = c.dx ? o.dx.data() : nullptr, h.mask_dx = c.dx && c.mask;
  }
  Exec cpu;
  cpu.math = math;
  kernels::classifier_head(cpu, h);
  return o;
}

HeadOutputs run_cuda(const Exec& gpu, const HeadCase& c) {
  DeviceBuffer<float> x(gpu, c.x), weight(gpu, c.weight), bias(gpu, c.bias_v);
  DeviceBuffer<int32_t> labels(gpu, c.labels);
  DeviceBuffer<float> logits(gpu, poisoned(size_t(c.B) * c.C)), dlogits(gpu, poisoned(size_t(c.B) * c.C));
  DeviceBuffer<float> dweight(gpu, poisoned(size_t(c.C) * c.K)), dbias(gpu, poisoned(size_t(c.C)));
  DeviceBuffer<float> dx(gpu, poisoned(size_t(c.B) * c.K));
  DeviceBuffer<double> loss(gpu, std::vector<double>{kLossBefore});
  DeviceBuffer<int64_t> correct(gpu, std::vector<int64_t>{kCorrectBefore});
  ClassifierHeadArgs h;
  h.B = c.B, h.K = c.K, h.C = c.C;
  h.x = x.get(), h.weight = weight.get(), h.bias = c.bias ? bias.get() : nullptr;
  h.labels = labels.get(), h.logits = logits.get(), h.loss_sum = loss.get(), h.correct = correct.get();
  if (c.backward) {
    h.dlogits = dlogits.get(), h.dweight = dweight.get(), h.dbias = c.bias ? dbias.get() : nullptr;
    h.dx = c.dx ? dx.get() : nullptr, h.mask_dx = c.dx && c.mask;
  }
  kernels::classifier_head(gpu, h);
  return {logits.download(), dlogits.download(), dweight.download(),   dbias.download(),
          dx.download(),     loss.download()[0], correct.download()[0]};
}

void check_head(const HeadCase& c, const HeadOutputs& got, const HeadOutputs& want,
                kernels::Math math = kernels::Math::fp32) {
  // logits: K-term dot products summed in different orders (lane-strided + butterfly vs blocked); the
  // rounding scales with the terms' magnitudes, not with the logit, which may be their cancellation.
  const double logit_terms = max_term_sum(
      c.B, c.C, c.K, [&](int b, int k) { return c.x[size_t(b) * c.K + k]; },
      [&](int j, int k) { return c.weight[size_t(j) * c.K + k]; });
  const Tolerance logit_tol{fp32_dot(c.K).rel_tol * logit_terms, fp32_dot(c.K).rel_tol,
                            "logits: 8*sqrt(K)*eps of the products' magnitude sum"};
  NT_REQUIRE_CLOSE(got.logits, want.logits, logit_tol);
  const double delta = logit_tol.abs_tol + logit_tol.rel_tol * max_abs(want.logits) + 4 * kEps;  // per logit

  // Row loss = logsumexp(z) - z_label moves by at most 2·delta when every logit moves by delta (both terms are
  // 1-Lipschitz in the max norm); plus softmax_xent's own rounding (see test_softmax_xent_cuda.cpp).
  const double loss_allowed = c.B * (2 * delta + 8 * std::sqrt(double(c.C)) * kEps) + 4 * kEps * std::abs(want.loss);
  INFO("loss: cuda " << got.loss << ", cpu " << want.loss);
  REQUIRE(std::abs(got.loss - want.loss) <= loss_allowed);
  // Only rows whose top two logits are within rounding of each other may be counted differently.
  REQUIRE(std::abs(got.correct - want.correct) <= near_ties(want.logits, c.B, c.C, 2 * delta));
  if (!c.backward) return;

  // dlogits = (softmax - onehot)/B: logits that each move by delta move a probability by at most delta/2
  // (Σ_j |∂p_c/∂z_j| = 2·p_c·(1 - p_c) <= 1/2); 2·delta leaves room for the exp's own rounding.
  const double dl_abs = (2 * delta + 2 * kEps) / c.B;
  NT_REQUIRE_CLOSE(got.dlogits, want.dlogits,
                   (Tolerance{dl_abs, 8 * std::sqrt(double(c.C)) * kEps,
                              "dlogits: 2*delta/B from the logits, sqrt(C)*eps from the exp sum"}));
  // What the products see of a dlogit: under BF16 it is rounded, and two dlogits that differ by dl_abs may round to
  // neighbouring BF16 values, one BF16 step (2^-7 relative) apart.
  const double dl_operand = dl_abs + (math == kernels::Math::bf16 ? std::ldexp(1.0, -7) * max_abs(want.dlogits) : 0.0);
  // dW = dlogitsᵀ·x over B rows: each dlogit's error times |x| <= 1, B times; plus the B-term sum's rounding,
  // relative to its terms' magnitudes.
  const double dw_terms = max_term_sum(
      c.C, c.K, c.B, [&](int j, int b) { return want.dlogits[size_t(b) * c.C + j]; },
      [&](int k, int b) { return c.x[size_t(b) * c.K + k]; });
  NT_REQUIRE_CLOSE(got.dweight, want.dweight,
                   (Tolerance{c.B * dl_operand * max_abs(c.x) + fp32_dot(c.B).rel_tol * dw_terms, fp32_dot(c.B).rel_tol,
                              "dW: B dlogit errors times max|x|, and a B-term fp32 sum of its terms' magnitude"}));
  if (c.bias)
    NT_REQUIRE_CLOSE(
        got.dbias, want.dbias,
        (Tolerance{c.B * dl_operand, fp32_dot(c.B).rel_tol, "db: B dlogit errors, and a B-term fp32 sum"}));
  if (c.dx) {
    const double dx_terms = max_term_sum(
        c.B, c.K, c.C, [&](int b, int j) { return want.dlogits[size_t(b) * c.C + j]; },
        [&](int k, int j) { return c.weight[size_t(j) * c.K + k]; });
    NT_REQUIRE_CLOSE(
        got.dx, want.dx,
        (Tolerance{c.C * dl_operand * max_abs(c.weight) + fp32_dot(c.C).rel_tol * dx_terms, fp32_dot(c.C).rel_tol,
                   "dx: C dlogit errors times max|W|, and a C-term fp32 sum of its terms' magnitude"}));
  }
}

TEST_CASE("classifier_head on CUDA matches the CPU twin (the unfused ops)", "[cuda][head]") {
  CudaExec cuda;
  for (int B : {1, 7, 64, 65, 256})
    for (int K : {1, 33, 160, 784})
      for (int C : {1, 2, 10, 17, 32})
        for (HeadInput kind : {HeadInput::uniform, HeadInput::large_logits, HeadInput::tied_classes}) {
          // Vary the optional parts with the sizes rather than multiplying the cases.
          const bool bias = (B + C) % 2 == 1 || kind != HeadInput::uniform;
          const bool dx = K != 33, mask = (B + K) % 2 == 0;
          HeadCase c(B, K, C, bias, /*backward=*/true, dx, mask, kind);
          INFO("B=" << B << " K=" << K << " C=" << C << " " << input_name(kind) << (bias ? " bias" : "")
                    << (dx ? (mask ? " dx masked" : " dx") : ""));
          check_head(c, run_cuda(cuda.exec, c), run_cpu(c));
        }
}

TEST_CASE("classifier_head on CUDA with BF16 operands matches the CPU twin in BF16", "[cuda][head]") {
  // Exec::math BF16: x, W and each dlogit are rounded where the products read them, in the kernel and in the twin's
  // GEMMs alike (kernels/operand.h), so the tolerances are fp32's, plus a BF16 step where a dlogit's rounding flips.
  if (!cuda_device().has_tf32()) return check_context_refuses(kernels::Math::bf16);
  CudaExec cuda;
  Exec gpu = cuda.exec;
  gpu.math = kernels::Math::bf16;
  for (int B : {1, 7, 64, 256})
    for (int K : {1, 33, 784})
      for (int C : {2, 10, 17}) {
        const bool bias = (B + C) % 2 == 1, dx = K != 33, mask = (B + K) % 2 == 0;
        HeadCase c(B, K, C, bias, /*backward=*/true, dx, mask, HeadInput::uniform);
        INFO("B=" << B << " K=" << K << " C=" << C << (bias ? " bias" : "")
                  << (dx ? (mask ? " dx masked" : " dx") : ""));
        const HeadOutputs got = run_cuda(gpu, c), want = run_cpu(c, kernels::Math::bf16);
        check_head(c, got, want, kernels::Math::bf16);
        if (K == 784 && B == 64) REQUIRE_FALSE(same_bits(want.logits, run_cpu(c).logits));  // the rounding shows
      }
}

TEST_CASE("classifier_head on CUDA in evaluation: logits, loss and count only", "[cuda][head]") {
  CudaExec cuda;
  for (int B : {1, 64, 1000}) {
    HeadCase c(B, 160, 10, true, /*backward=*/false, false, false, HeadInput::uniform);
    INFO("B=" << B);
    const HeadOutputs got = run_cuda(cuda.exec, c), want = run_cpu(c);
    check_head(c, got, want);
    for (const auto* untouched : {&got.dlogits, &got.dweight, &got.dbias, &got.dx})  // still the poison
      REQUIRE(std::all_of(untouched->begin(), untouched->end(), [](float v) { return std::isnan(v); }));
  }
}

TEST_CASE("classifier_head on CUDA is bit-reproducible and refuses more classes than it serves", "[cuda][head]") {
  CudaExec cuda;
  HeadCase c(64, 160, 10, true, true, true, true, HeadInput::uniform);
  const HeadOutputs a = run_cuda(cuda.exec, c), b = run_cuda(cuda.exec, c);
  REQUIRE(same_bits(a.logits, b.logits));
  REQUIRE(same_bits(a.dweight, b.dweight));
  REQUIRE(same_bits(a.dx, b.dx));
  REQUIRE(std::memcmp(&a.loss, &b.loss, sizeof a.loss) == 0);

  HeadCase wide(4, 8, kernels::kHeadMaxClasses + 1, true, true, false, false, HeadInput::uniform);
  REQUIRE_THROWS_WITH(run_cuda(cuda.exec, wide), Contains("the CUDA kernel serves 1..32 classes"));
}

}  // namespace
}  // namespace nt::test
