// The persistent mlp step's CPU twin (kernels/persistent_mlp.h) against a plain double-precision reference of the same
// training steps: the gather and normalization, the forward, softmax cross-entropy, every gradient from the weights
// before the step, SGD with weight decay and momentum. The twin sums in fp32 in its own fixed order; after a few
// steps on random data every weight agrees within 2e-5 of the largest (each sum has at most 784 terms of fp32
// rounding, sqrt(K)·eps ≈ 3e-6 each, carried over the steps by lr · the gradient), the loss within 1e-5.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/persistent_mlp.h"
#include "kernels/persistent_mlp_math.h"
#include "persistent_mlp_case.h"
#include "test_support.h"

namespace nt::test {
namespace {

PersistentMlpResult reference(const PersistentMlpCase& c, const PersistentMlpData& d) {
  const int L = c.layers(), B = c.B, D = c.width[0], C = c.width[L];
  std::vector<std::vector<double>> w(L), b(L), vw(L), vb(L), sw(L), sb(L);  // velocities or m; Adam's v
  for (int l = 0; l < L; ++l) {
    w[l].assign(d.weight[l].begin(), d.weight[l].end());
    b[l].assign(d.bias[l].begin(), d.bias[l].end());
    vw[l].assign(d.weight_velocity[l].begin(), d.weight_velocity[l].end());
    vb[l].assign(d.bias_velocity[l].begin(), d.bias_velocity[l].end());
    sw[l].assign(d.weight_second_moment[l].begin(), d.weight_second_moment[l].end());
    sb[l].assign(d.bias_second_moment[l].begin(), d.bias_second_moment[l].end());
  }
  const int P = c.height > 0 ? c.height * c.plane_width : D;
  PersistentMlpResult out;
  uint64_t t = d.adam_steps;  // Adam's step
  auto step = [&](double& p, double g, double& v, double& v2) {
    if (c.adam) {  // PyTorch's Adam and AdamW, betas (0.9, 0.999), eps 1e-8
      const double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
      if (c.decoupled)
        p *= 1 - double(c.lr) * c.weight_decay;
      else
        g += c.weight_decay * p;
      v = beta1 * v + (1 - beta1) * g;
      v2 = beta2 * v2 + (1 - beta2) * g * g;
      const double bc1 = 1 - std::pow(beta1, double(t)), bc2 = 1 - std::pow(beta2, double(t));
      p -= double(c.lr) / bc1 * v / (std::sqrt(v2) / std::sqrt(bc2) + eps);
      return;
    }
    g += c.weight_decay * p;
    if (c.momentum != 0) {
      v = c.momentum * v + g;
      p -= c.lr * v;
    } else {
      p -= c.lr * g;
    }
  };
  for (int s = 0; s < c.steps; ++s) {
    ++t;
    std::vector<std::vector<double>> act(L + 1);
    act[0].resize(size_t(B) * D);
    std::vector<int> y(B);
    for (int i = 0; i < B; ++i) {
      const int r = d.perm[c.first + int64_t(s) * B + i];
      y[i] = d.labels[r];
      for (int k = 0; k < D; ++k)
        act[0][size_t(i) * D + k] =
            (d.images[size_t(r) * D + k] / 255.0 - d.mean.value[k / P]) / d.std_dev.value[k / P];
    }
    for (int l = 0; l < L; ++l) {
      const int K = c.width[l], N = c.width[l + 1];
      act[l + 1].assign(size_t(B) * N, 0.0);
      for (int i = 0; i < B; ++i)
        for (int n = 0; n < N; ++n) {
          double z = b[l][n];
          for (int k = 0; k < K; ++k) z += act[l][size_t(i) * K + k] * w[l][size_t(n) * K + k];
          act[l + 1][size_t(i) * N + n] = l + 1 < L ? std::max(z, 0.0) : z;
        }
    }
    std::vector<double> dl(size_t(B) * C);
    for (int i = 0; i < B; ++i) {
      const double* z = &act[L][size_t(i) * C];
      double m = z[0];
      int arg = 0;
      for (int j = 1; j < C; ++j)
        if (z[j] > m) m = z[j], arg = j;
      double sum = 0;
      for (int j = 0; j < C; ++j) sum += std::exp(z[j] - m);
      out.loss_sum += std::log(sum) + m - z[y[i]];
      out.correct += arg == y[i];
      for (int j = 0; j < C; ++j) dl[size_t(i) * C + j] = (std::exp(z[j] - m) / sum - (j == y[i])) / B;
    }
    std::vector<double> d_out = dl;
    for (int l = L - 1; l >= 0; --l) {
      const int K = c.width[l], N = c.width[l + 1];
      std::vector<double> d_in(size_t(B) * K, 0.0);
      for (int i = 0; i < B; ++i)
        for (int k = 0; k < K; ++k) {
          double sum = 0;
          for (int n = 0; n < N; ++n) sum += d_out[size_t(i) * N + n] * w[l][size_t(n) * K + k];
          d_in[size_t(i) * K + k] = act[l][size_t(i) * K + k] > 0 ? sum : 0.0;
        }
      for (int n = 0; n < N; ++n) {
        for (int k = 0; k < K; ++k) {
          double g = 0;
          for (int i = 0; i < B; ++i) g += d_out[size_t(i) * N + n] * act[l][size_t(i) * K + k];
          step(w[l][size_t(n) * K + k], g, vw[l][size_t(n) * K + k], sw[l][size_t(n) * K + k]);
        }
        double g = 0;
        for (int i = 0; i < B; ++i) g += d_out[size_t(i) * N + n];
        step(b[l][n], g, vb[l][n], sb[l][n]);
      }
      d_out = std::move(d_in);
    }
  }
  for (int l = 0; l < L; ++l) {
    out.weight.emplace_back(w[l].begin(), w[l].end());
    out.bias.emplace_back(b[l].begin(), b[l].end());
    out.weight_velocity.emplace_back(vw[l].begin(), vw[l].end());
    out.bias_velocity.emplace_back(vb[l].begin(), vb[l].end());
    out.weight_second_moment.emplace_back(sw[l].begin(), sw[l].end());
    out.bias_second_moment.emplace_back(sb[l].begin(), sb[l].end());
  }
  out.adam_steps = c.adam ? t : 0;
  return out;
}

}  // namespace

TEST_CASE("persistent_mlp's CPU twin trains as a double-precision reference does", "[persistent]") {
  PersistentMlpCase cases[] = {
      {.width = {13, 7, 5, 3}, .B = 5, .steps = 4, .lr = 0.1f},
      {.width = {29, 33, 10}, .B = 7, .steps = 3, .lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f},
      {.width = {30, 9, 1, 6, 4},
       .B = 3,
       .steps = 3,
       .lr = 0.2f,
       .momentum = 0.5f,
       .height = 3,
       .plane_width = 5,
       .first = 4},
      {.width = {784, 40, 20, 10}, .B = 16, .steps = 2, .lr = 0.05f, .momentum = 0.9f},
      // The batch in groups (the GPU's clusters): chunks of 3, 3 and 1 rows; and 8 groups of 2.
      {.width = {29, 33, 10}, .B = 7, .groups = 3, .steps = 3, .lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f},
      {.width = {784, 40, 20, 10}, .B = 16, .groups = 8, .steps = 2, .lr = 0.05f, .momentum = 0.9f},
      // Adam and AdamW, from a resumed state (5 steps taken; the second moments positive, so each step's scale is
      // sqrt(v), which fp32 and double agree on to about 1e-7 of it).
      {.width = {784, 40, 20, 10}, .B = 16, .groups = 4, .steps = 3, .lr = 1e-3f, .weight_decay = 1e-4f, .adam = true},
      {.width = {29, 33, 10},
       .B = 7,
       .groups = 3,
       .steps = 3,
       .lr = 2e-3f,
       .weight_decay = 0.01f,
       .adam = true,
       .decoupled = true},
  };
  for (const PersistentMlpCase& c : cases) {
    INFO("layers " << c.layers() << ", D " << c.width[0] << ", B " << c.B << ", groups " << c.groups << ", momentum "
                   << c.momentum);
    const PersistentMlpData d = make_persistent_mlp_data(c);
    const PersistentMlpResult twin = run_persistent_mlp_cpu(c, d);
    const PersistentMlpResult want = reference(c, d);
    CHECK(persistent_mlp_relative_error(twin, want) < 2e-5);
    CHECK(std::abs(twin.loss_sum - want.loss_sum) <= 1e-5 * std::abs(want.loss_sum));
    CHECK(twin.correct == want.correct);
    CHECK(twin.adam_steps == want.adam_steps);
  }
}

TEST_CASE("persistent_mlp refuses what it does not serve, naming it", "[persistent]") {
  const PersistentMlpCase c{.width = {13, 7, 3}, .B = 5, .steps = 1};
  PersistentMlpData d = make_persistent_mlp_data(c);
  kernels::PersistentMlpArgs a;
  a.src.images = d.images.data(), a.src.labels = d.labels.data(), a.src.perm = d.perm.data(), a.src.D = 13;
  a.steps = 1, a.B = 5, a.layers = 2, a.width[0] = 13, a.width[1] = 7, a.width[2] = 3;
  for (int l = 0; l < 2; ++l) a.weight[l] = d.weight[l].data(), a.bias[l] = d.bias[l].data();
  double loss = 0;
  int64_t correct = 0;
  std::vector<unsigned char> workspace(kernels::persistent_mlp_workspace_bytes(a.width, 2, 5, 5));
  a.loss_sum = &loss, a.correct = &correct, a.workspace = workspace.data();
  auto refused = [&](kernels::PersistentMlpArgs bad, const char* phrase) {
    INFO(phrase);
    try {
      kernels::persistent_mlp(kernels::Exec{}, bad);
      FAIL("accepted");
    } catch (const InternalError& e) {  // a caller's bug: the engine checks what it passes (persistent_mlp_fits)
      CHECK(std::string(e.what()).find(phrase) != std::string::npos);
    }
  };
  kernels::PersistentMlpArgs bad = a;
  bad.src.shift = 2;
  refused(bad, "shift");
  bad = a, bad.width[2] = 33;
  refused(bad, "classes");
  bad = a, bad.B = 257;
  refused(bad, "B must be");
  bad = a, bad.width[0] = 12;
  refused(bad, "width[0]");
  bad = a, bad.momentum = 0.9f;
  refused(bad, "velocities");
  bad = a, bad.groups = 6;
  refused(bad, "groups must be");
  bad = a, bad.B = 4, bad.groups = 3;  // chunks of 2: the third group would be empty
  refused(bad, "empty");
  uint64_t adam_step[2] = {};
  bad = a, bad.adam_step = adam_step;  // Adam without its moments
  refused(bad, "moments");
  kernels::persistent_mlp(kernels::Exec{}, a);  // and the arguments as given run
  CHECK(std::isfinite(loss));
}

TEST_CASE("persistent_mlp's workspace: aligned parts that do not overlap, within its bytes", "[persistent]") {
  const int width[] = {784, 320, 7, 160, 10};  // three hidden layers, one of an odd width
  for (int B : {1, 5, 64, 256}) {
    const int groups = std::min(B, 8);
    INFO("B " << B << ", groups " << groups);
    const kernels::PersistentMlpWorkspace w = kernels::persistent_mlp_workspace(nullptr, width, 4, B, groups);
    CHECK(w.bytes == kernels::persistent_mlp_workspace_bytes(width, 4, B, groups));
    CHECK(reinterpret_cast<std::uintptr_t>(w.barrier) == 0);
    std::uintptr_t end = 2 * sizeof(unsigned int);  // the barrier's words
    for (int l = 0; l < 3; ++l) {
      const std::uintptr_t size = sizeof(float) * size_t(B) * size_t(width[l + 1]);
      for (const float* part : {w.activation[l + 1], w.gradient[l]}) {
        const auto at = reinterpret_cast<std::uintptr_t>(part);
        CHECK(at % 256 == 0);
        CHECK(at >= end);
        end = at + size;
      }
    }
    for (const float* part : {w.row_loss, w.row_hit}) {
      const auto at = reinterpret_cast<std::uintptr_t>(part);
      CHECK(at % 256 == 0);
      CHECK(at >= end);
      end = at + sizeof(float) * size_t(B);
    }
    // The groups' partials: every layer's weights then biases, in order, each layer from a multiple of 4 floats,
    // within one group's stride.
    size_t params = 0;
    for (int l = 0; l < 4; ++l) {
      CHECK(w.layer_offset[l] >= params);
      CHECK(w.layer_offset[l] < params + 4);
      CHECK(w.layer_offset[l] % 4 == 0);
      params = w.layer_offset[l] + size_t(width[l + 1]) * width[l] + width[l + 1];
    }
    CHECK(w.partial_stride >= params);
    CHECK(w.partial_stride % 64 == 0);
    const auto partial = reinterpret_cast<std::uintptr_t>(w.partial);
    CHECK(partial % 256 == 0);
    CHECK(partial >= end);
    end = partial + sizeof(float) * w.partial_stride * size_t(groups);
    CHECK(end <= w.bytes);
  }
}

}  // namespace nt::test

TEST_CASE("exp_rn is e^x within 2 ulp, with expf's limits", "[cpu][persistent]") {
  // Every 997th float from below the smallest subnormal's range to the largest finite result, against e^x in double.
  // The bound: Cephes' polynomial for expf, in correctly rounded steps (kernels/persistent_mlp_math.h).
  using nt::kernels::persistent::exp_rn;
  double worst_ulp = 0;
  for (float x = -87.f; x < 88.7f;) {
    const double want = std::exp(static_cast<double>(x));
    const auto w = static_cast<float>(want);
    const double ulp = static_cast<double>(std::nextafter(w, INFINITY)) - static_cast<double>(w);
    worst_ulp = std::max(worst_ulp, std::abs(static_cast<double>(exp_rn(x)) - want) / ulp);
    for (int i = 0; i < 997; ++i) x = std::nextafter(x, 100.f);
  }
  INFO("worst " << worst_ulp << " ulp");
  CHECK(worst_ulp < 2);
  CHECK(exp_rn(0.f) == 1.f);
  CHECK(std::isnan(exp_rn(NAN)));
  CHECK(exp_rn(-INFINITY) == 0.f);
  CHECK(exp_rn(-200.f) == 0.f);
  CHECK(std::isinf(exp_rn(89.f)));
  CHECK(exp_rn(-103.f) > 0.f);  // subnormal results stay, as expf's do
  CHECK(std::abs(exp_rn(-100.f) / static_cast<float>(std::exp(-100.0)) - 1) < 0.01);  // within a subnormal's grain
}
