// The persistent mlp step's epoch (kernels/persistent_mlp.h): one launch for an epoch's SGD steps of the mlp
// (784 -> 320 -> 160 -> 10) on data of MNIST's shape and format (60,000 random 28x28 uint8 images), at batch 64
// (938 steps) and 256 (235 steps), momentum 0.9. CUDA events around the launch after a warm-up, the median of 7
// (bench_timing.h). Evaluation is not part of the op, so the figure is the training steps of an epoch alone; the
// per-kernel path's epoch (nanotrain train) adds its 157 evaluation batches. Then one more launch per batch under the
// KernelProfiler (CUPTI where it loads, else CUDA events), whose table splits the kernel into the phases it stamps
// (profile/phase_stamps.h): what a step is made of, as block 0 sees it. The batch runs in the groups the device
// chooses (persistent_mlp_groups, one cluster each), and for comparison in 4, 8 and 16 groups where they fit; then
// once with Adam instead of SGD, in the device's groups.
//
//   bench_persistent_mlp [--steps N]       N: steps per launch at batch 64 (default 938; batch 256 runs N / 4)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/bench_timing.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/persistent_mlp.h"
#include "kernels/profile_delay.h"
#include "kernels/runtime.h"
#include "profile/kernel_profiler.h"
#include "profile/report.h"

namespace {

using nt::kernels::Exec;

template <class T>
T* upload(const Exec& exec, const std::vector<T>& host) {
  auto* p = static_cast<T*>(nt::kernels::device_alloc(exec.backend, host.size() * sizeof(T)));
  nt::kernels::copy_host_to_device(exec, p, host.data(), host.size() * sizeof(T));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  int steps64 = 938;
  if (const auto bad = nt::bench::parse_count(argc, argv, "bench_persistent_mlp", "--steps", 4, 100000, &steps64))
    return *bad;
  const auto found = nt::bench::cuda_bench_exec("bench_persistent_mlp");
  if (!found) return 1;
  const nt::kernels::Exec exec = *found;
  const int width[] = {784, 320, 160, 10};
  constexpr int kImages = 60000, kLayers = 3;
  std::mt19937_64 rng(7);
  std::vector<uint8_t> images(size_t(kImages) * 784), labels(kImages);
  for (auto& p : images) p = static_cast<uint8_t>(rng() % 256);
  for (auto& l : labels) l = static_cast<uint8_t>(rng() % 10);
  std::vector<int32_t> perm(size_t(kImages) + 256);
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int32_t>(i % kImages);
  std::shuffle(perm.begin(), perm.begin() + kImages, rng);

  std::printf("persistent mlp 784-320-160-10, SGD momentum 0.9, one launch per epoch's steps\n");
  std::vector<std::string> tables;
  for (const int B : {64, 256}) {
    const int steps = B == 64 ? steps64 : steps64 / 4;
    const int chosen = nt::kernels::cuda::persistent_mlp_groups(width, kLayers, B);
    if (chosen == 0) {
      std::printf("%5d | does not fit this device\n", B);
      continue;
    }
    nt::kernels::PersistentMlpArgs a;
    a.src.images = upload(exec, images), a.src.labels = upload(exec, labels), a.src.perm = upload(exec, perm);
    a.src.D = 784, a.src.mean = 0.1307f, a.src.std = 0.3081f;
    a.steps = steps, a.B = B, a.layers = kLayers;
    for (int l = 0; l <= kLayers; ++l) a.width[l] = width[l];
    for (int l = 0; l < kLayers; ++l) {
      const size_t n = size_t(width[l]) * width[l + 1];
      const float bound = 1.f / std::sqrt(float(width[l]));
      std::uniform_real_distribution<float> u(-bound, bound);
      std::vector<float> w(n), b(static_cast<size_t>(width[l + 1]));
      for (auto& x : w) x = u(rng);
      for (auto& x : b) x = u(rng);
      a.weight[l] = upload(exec, w), a.bias[l] = upload(exec, b);
      a.weight_velocity[l] = upload(exec, std::vector<float>(n, 0.f));
      a.bias_velocity[l] = upload(exec, std::vector<float>(b.size(), 0.f));
    }
    a.lr = 0.01f, a.momentum = 0.9f;
    a.loss_sum = upload(exec, std::vector<double>{0.0});
    a.correct = upload(exec, std::vector<int64_t>{0});
    a.workspace = upload(
        exec, std::vector<unsigned char>(
                  nt::kernels::persistent_mlp_workspace_bytes(width, 3, B, nt::kernels::kPersistentMaxGroups), 0));
    std::vector<int> group_counts{chosen};
    for (const int g : {4, 8, 16})
      if (g != chosen && g <= std::min(B, nt::kernels::kPersistentMaxGroups)) group_counts.push_back(g);
    for (const int groups : group_counts) {
      a.groups = groups;
      try {
        const double us = nt::bench::time_loop_us(static_cast<cudaStream_t>(exec.stream), 1, 7,
                                                  [&] { nt::kernels::persistent_mlp(exec, a); });
        std::printf("batch %d, %d steps, %d groups%s: %.2f ms per launch, %.2f us per step\n", B, steps, groups,
                    groups == chosen ? " (the device's)" : "", us / 1000.0, us / steps);
      } catch (const nt::InternalError& e) {
        std::printf("batch %d, %d groups: %s\n", B, groups, e.what());
      }
    }
    a.groups = chosen;

    // Adam (lr 1e-3, PyTorch's betas and eps) from its first step, the moments from zero; then SGD again below.
    nt::kernels::PersistentMlpArgs adam = a;
    adam.adam.lr = 1e-3;
    adam.adam_step = upload(exec, std::vector<uint64_t>{0, 0});
    for (int l = 0; l < kLayers; ++l) {
      const size_t n = size_t(width[l]) * width[l + 1];
      adam.weight_second_moment[l] = upload(exec, std::vector<float>(n, 0.f));
      adam.bias_second_moment[l] = upload(exec, std::vector<float>(size_t(width[l + 1]), 0.f));
    }
    const double adam_us = nt::bench::time_loop_us(static_cast<cudaStream_t>(exec.stream), 1, 7,
                                                   [&] { nt::kernels::persistent_mlp(exec, adam); });
    std::printf("batch %d, %d steps, %d groups, Adam: %.2f ms per launch, %.2f us per step\n", B, steps, chosen,
                adam_us / 1000.0, adam_us / steps);

    nt::profile::ProfilerOptions options;
    options.timing = nt::profile::Timing::cupti;
    options.device = "cuda";
    options.hold = nt::kernels::profile_hold_fn(exec);
    nt::profile::KernelProfiler profiler(std::move(options));
    nt::kernels::Exec profiled = exec;
    profiled.observer = &profiler;
    profiler.start();
    nt::kernels::persistent_mlp(profiled, a);
    profiler.stop();
    tables.push_back("batch " + std::to_string(B) + ", one launch under the profiler (" +
                     nt::profile::timing_name(profiler.timing()) + "):\n" + nt::profile::format_table(profiler.data()));
  }
  for (const auto& t : tables) std::printf("\n%s", t.c_str());
  return 0;
}
