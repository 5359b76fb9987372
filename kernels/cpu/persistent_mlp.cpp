// The persistent mlp step's CPU twin (kernels/persistent_mlp.h): the GPU kernel's arithmetic, step by step, in one
// thread. Every operation is kernels/persistent_mlp_math.h's, so only logf (the loss value) separates the two backends.
//
// Shapes: x = a[-1] (B, w[0]); a[l] (B, w[l+1]) for the hidden layers; logits and their gradient (B, C); d[l], the
// gradient at layer l's output, (B, w[l+1]). W[l] (w[l+1], w[l]) row-major.
#include <algorithm>
#include <vector>

#include "kernels/persistent_mlp.h"
#include "kernels/persistent_mlp_math.h"

namespace nt::kernels::cpu {

namespace {

using persistent::dot16;
using persistent::dot4;
using persistent::fma_rn;
using persistent::ParamStep;

// The batch of step s, normalized (kernels/batch.h), and its labels.
void gather(const PersistentMlpArgs& a, int64_t first, std::vector<float>& x, std::vector<int>& y) {
  const BatchSource& src = a.src;
  const int D = src.D;
  const int P = src.height > 0 && src.width > 0 ? src.height * src.width : D;
  for (int b = 0; b < a.B; ++b) {
    const int64_t r = src.perm[first + b];
    y[b] = src.labels[r];
    for (int k = 0; k < D; ++k) {
      const int c = k / P;
      x[size_t(b) * D + k] = normalize_pixel(src.images[r * D + k], src.mean.value[c], src.std.value[c]);
    }
  }
}

// Σ_b term(b) over the batch in kernels/persistent_mlp.h's order: one chain in increasing b within each group, then
// the groups' sums left to right.
template <class Term>
float batch_sum(const PersistentMlpArgs& a, Term term) {
  const int chunk = persistent_mlp_chunk(a.B, a.groups);
  float total = 0.f;
  for (int q = 0; q < a.groups; ++q) {
    float g = 0.f;
    for (int b = q * chunk; b < std::min(a.B, (q + 1) * chunk); ++b) g = term(b, g);
    total = q == 0 ? g : persistent::add_rn(total, g);
  }
  return total;
}

// W and b take `step` for dW = dᵀ·in (d: (B, N), in: (B, K)) and db = Σ_b d, each sum over the batch in batch_sum's
// order; their optimizer state (velocities or moments) at the same index of theirs.
void update_layer(const PersistentMlpArgs& a, const ParamStep& step, int l, const float* d, const float* in) {
  const int K = a.width[l], N = a.width[l + 1];
  float unused = 0.f;
  auto state = [&](float* tensor, size_t i) -> float& { return tensor ? tensor[i] : unused; };
  for (int n = 0; n < N; ++n) {
    for (int k = 0; k < K; ++k) {
      const float g =
          batch_sum(a, [&](int b, float chain) { return fma_rn(d[size_t(b) * N + n], in[size_t(b) * K + k], chain); });
      const size_t i = size_t(n) * K + k;
      step.apply(a.weight[l][i], g, state(a.weight_velocity[l], i), state(a.weight_second_moment[l], i));
    }
    const float g = batch_sum(a, [&](int b, float chain) { return persistent::add_rn(chain, d[size_t(b) * N + n]); });
    step.apply(a.bias[l][n], g, state(a.bias_velocity[l], n), state(a.bias_second_moment[l], n));
  }
}

}  // namespace

void persistent_mlp(const Exec& exec, const PersistentMlpArgs& a) {
  (void)exec;
  check_persistent_mlp(a);
  const int L = a.layers, B = a.B, C = a.width[L];
  const uint64_t t0 = a.adam_step ? a.adam_step[0] : 0;  // Adam's steps so far

  // act[0] = x, act[l + 1] = layer l's output (the head's: logits, then their gradient in place); grad[l] = d[l].
  std::vector<std::vector<float>> act(size_t(L) + 1);
  std::vector<std::vector<float>> grad(static_cast<size_t>(L));
  for (int l = 0; l <= L; ++l) act[l].resize(size_t(B) * a.width[l]);
  for (int l = 0; l < L; ++l) grad[l].resize(size_t(B) * a.width[l + 1]);
  std::vector<int> y(static_cast<size_t>(B));

  for (int s = 0; s < a.steps; ++s) {
    const ParamStep step = persistent::param_step(a, t0 + uint64_t(s) + 1);
    gather(a, a.first + int64_t(s) * B, act[0], y);
    for (int l = 0; l < L; ++l) {
      const int K = a.width[l], N = a.width[l + 1];
      for (int b = 0; b < B; ++b)
        for (int n = 0; n < N; ++n)
          act[l + 1][size_t(b) * N + n] = persistent::linear_out(
              dot16(&act[l][size_t(b) * K], &a.weight[l][size_t(n) * K], K), a.bias[l][n], l + 1 < L);
    }
    double loss = 0.0;
    int64_t hits = 0;
    std::vector<float>& dlogits = grad[L - 1];
    for (int b = 0; b < B; ++b) {
      float* row = &dlogits[size_t(b) * C];
      for (int c = 0; c < C; ++c) row[c] = act[L][size_t(b) * C + c];
      bool hit = false;
      loss += double(persistent::softmax_xent_row(row, C, y[b], B, &hit));
      hits += hit ? 1 : 0;
    }
    *a.loss_sum += loss;
    *a.correct += hits;
    // Each input gradient from the weights before the step, then the step.
    for (int l = L - 1; l >= 0; --l) {
      const int K = a.width[l], N = a.width[l + 1];
      if (l > 0) {
        for (int b = 0; b < B; ++b)
          for (int i = 0; i < K; ++i) {
            // The head's columns are short (C terms): dot4; a hidden layer's are wide: dot16 (as on the GPU).
            const float sum = l == L - 1 ? dot4(&grad[l][size_t(b) * N], &a.weight[l][i], N, K)
                                         : dot16(&grad[l][size_t(b) * N], &a.weight[l][i], N, K);
            grad[l - 1][size_t(b) * K + i] = act[l][size_t(b) * K + i] > 0.f ? sum : 0.f;
          }
      }
      update_layer(a, step, l, grad[l].data(), act[l].data());
    }
  }
  if (a.adam_step) a.adam_step[0] = t0 + uint64_t(a.steps);
}

}  // namespace nt::kernels::cpu
