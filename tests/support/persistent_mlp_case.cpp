#include "persistent_mlp_case.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "test_support.h"

namespace nt::test {

PersistentMlpData make_persistent_mlp_data(const PersistentMlpCase& c) {
  PersistentMlpData d;
  const int D = c.width.front(), C = c.width.back();
  const int images = std::max(37, c.B + 3);  // fewer than an epoch's positions: every image comes back
  std::uniform_int_distribution<int> pixel(0, 255), label(0, C - 1), index(0, images - 1);
  d.images.resize(size_t(images) * D);
  for (auto& p : d.images) p = static_cast<uint8_t>(pixel(rng()));
  d.labels.resize(size_t(images));
  for (auto& l : d.labels) l = static_cast<uint8_t>(label(rng()));
  d.perm.resize(size_t(c.first) + size_t(c.steps) * c.B);
  for (auto& r : d.perm) r = index(rng());
  const int planes = c.height > 0 ? D / (c.height * c.plane_width) : 1;
  const float means[] = {0.1307f, 0.45f, 0.5f, 0.4f}, stds[] = {0.3081f, 0.25f, 0.2f, 0.3f};
  d.mean = kernels::ChannelValues(means, planes);
  d.std_dev = kernels::ChannelValues(stds, planes);
  for (int l = 0; l < c.layers(); ++l) {
    const int K = c.width[l], N = c.width[l + 1];
    const float bound = 1.f / std::sqrt(float(K));  // PyTorch's Linear initialization range
    d.weight.push_back(random_floats(size_t(N) * K, -bound, bound));
    d.bias.push_back(random_floats(size_t(N), -bound, bound));
    d.weight_velocity.push_back(random_floats(size_t(N) * K, -0.01f, 0.01f));  // a run resumed mid-training
    d.bias_velocity.push_back(random_floats(size_t(N), -0.01f, 0.01f));
    // Adam's second moments of a resumed run: positive, so that sqrt(v) and not eps sets each step's scale.
    d.weight_second_moment.push_back(random_floats(size_t(N) * K, 1e-5f, 1e-4f));
    d.bias_second_moment.push_back(random_floats(size_t(N), 1e-5f, 1e-4f));
  }
  d.adam_steps = 5;
  return d;
}

kernels::PersistentMlpArgs persistent_mlp_args(const PersistentMlpCase& c, const PersistentMlpData& d) {
  kernels::PersistentMlpArgs a;
  a.src.images = d.images.data(), a.src.labels = d.labels.data(), a.src.perm = d.perm.data();
  a.src.D = c.width.front(), a.src.mean = d.mean, a.src.std = d.std_dev;
  a.src.height = c.height, a.src.width = c.plane_width;
  a.first = c.first, a.steps = c.steps, a.B = c.B, a.groups = c.groups, a.layers = c.layers();
  for (int l = 0; l <= c.layers(); ++l) a.width[l] = c.width[l];
  a.lr = c.lr, a.momentum = c.momentum, a.weight_decay = c.weight_decay;
  a.adam.lr = c.lr, a.adam.weight_decay = c.weight_decay, a.adam.decoupled = c.decoupled;
  return a;
}

PersistentMlpResult run_persistent_mlp_cpu(const PersistentMlpCase& c, const PersistentMlpData& d) {
  PersistentMlpResult r;
  r.weight = d.weight, r.bias = d.bias, r.weight_velocity = d.weight_velocity, r.bias_velocity = d.bias_velocity;
  r.weight_second_moment = d.weight_second_moment, r.bias_second_moment = d.bias_second_moment;
  kernels::PersistentMlpArgs a = persistent_mlp_args(c, d);
  for (int l = 0; l < c.layers(); ++l) {
    a.weight[l] = r.weight[l].data(), a.bias[l] = r.bias[l].data();
    a.weight_velocity[l] = r.weight_velocity[l].data(), a.bias_velocity[l] = r.bias_velocity[l].data();
    a.weight_second_moment[l] = r.weight_second_moment[l].data(),
    a.bias_second_moment[l] = r.bias_second_moment[l].data();
  }
  uint64_t counter[2] = {d.adam_steps, 0};
  if (c.adam) a.adam_step = counter;
  std::vector<unsigned char> workspace(kernels::persistent_mlp_workspace_bytes(a.width, a.layers, a.B, a.groups));
  a.workspace = workspace.data();
  a.loss_sum = &r.loss_sum, a.correct = &r.correct;
  kernels::persistent_mlp(kernels::Exec{}, a);
  r.adam_steps = c.adam ? counter[0] : 0;
  return r;
}

namespace {
template <class F>
void each_tensor(const PersistentMlpResult& a, const PersistentMlpResult& b, F f) {
  for (size_t l = 0; l < a.weight.size(); ++l) {
    f(a.weight[l], b.weight[l]);
    f(a.bias[l], b.bias[l]);
    f(a.weight_velocity[l], b.weight_velocity[l]);
    f(a.bias_velocity[l], b.bias_velocity[l]);
    f(a.weight_second_moment[l], b.weight_second_moment[l]);
    f(a.bias_second_moment[l], b.bias_second_moment[l]);
  }
}
}  // namespace

double persistent_mlp_relative_error(const PersistentMlpResult& got, const PersistentMlpResult& want) {
  double diff = 0, scale = 0;
  each_tensor(got, want, [&](const std::vector<float>& g, const std::vector<float>& w) {
    for (size_t i = 0; i < w.size(); ++i) {
      const double d = std::abs(double(g[i]) - double(w[i]));
      diff = std::isnan(d) ? INFINITY : std::max(diff, d);
      scale = std::max(scale, double(std::abs(w[i])));
    }
  });
  return diff / std::max(scale, 1e-30);
}

bool same_bits(const PersistentMlpResult& a, const PersistentMlpResult& b) {
  bool same = std::memcmp(&a.loss_sum, &b.loss_sum, sizeof a.loss_sum) == 0 && a.correct == b.correct &&
              a.adam_steps == b.adam_steps;
  each_tensor(a, b, [&](const std::vector<float>& x, const std::vector<float>& y) { same = same && same_bits(x, y); });
  return same;
}

}  // namespace nt::test
