// CPU GEMM microbenchmark: the 8 GEMMs of one training step of the reference MLP (784→320→160→10),
// at batch 64 and 256, with 1 and 2 threads. Each time is the median of many calls after a warm-up
// (steady_clock around each call; inputs stay cache-resident, as they do in training); the best call
// is shown too, since on a shared machine the median also measures the neighbours.
//
//   bench_gemm_cpu [--threads N] [--batch B] [--pin]   (defaults: threads 1 and 2, batch 64 and 256)
// --pin puts the caller on CPU 0 and the pool's workers on the other CPUs (Linux): on a busy machine the
// scheduler may otherwise stack both threads on one CPU, and the 2-thread times measure that instead.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <pthread.h>
#include <sched.h>

#include "kernels/cpu/thread_pool.h"
#include "kernels/gemm.h"

namespace {

using nt::kernels::Epilogue;

struct Case {
  const char* what;
  int M, N, K;
  bool trans_a, trans_b;
  Epilogue epilogue;
  bool row_sums;
};

// Linear layers store W as (out, in): forward Y = X·Wᵀ (+bias, ReLU), dW = dYᵀ·X with the bias
// gradient as A's row sums, dX = dY·W masked by the previous ReLU's output.
std::vector<Case> step_cases(int B) {
  return {
      {"fwd  784->320", B, 320, 784, false, true, Epilogue::bias_relu, false},
      {"fwd  320->160", B, 160, 320, false, true, Epilogue::bias_relu, false},
      {"fwd  160->10", B, 10, 160, false, true, Epilogue::bias, false},
      {"dW   10x160", 10, 160, B, true, false, Epilogue::none, true},
      {"dX   10->160", B, 160, 10, false, false, Epilogue::relu_mask, false},
      {"dW   160x320", 160, 320, B, true, false, Epilogue::none, true},
      {"dX   160->320", B, 320, 160, false, false, Epilogue::relu_mask, false},
      {"dW   320x784", 320, 784, B, true, false, Epilogue::none, true},
  };
}

std::vector<float> random_vector(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

struct Timing {
  double median, best;  // seconds per call
};

// Seconds per call of one case on one execution handle: the median, and the best as a hint of what
// the median would be on an otherwise idle machine.
Timing time_case(const Case& c, const nt::kernels::Exec& exec) {
  std::mt19937 rng(42);
  const size_t a_rows = c.trans_a ? c.K : c.M, a_cols = c.trans_a ? c.M : c.K;
  const size_t b_rows = c.trans_b ? c.N : c.K, b_cols = c.trans_b ? c.K : c.N;
  auto A = random_vector(a_rows * a_cols, rng), B = random_vector(b_rows * b_cols, rng);
  auto bias = random_vector(c.N, rng), mask = random_vector(size_t(c.M) * c.N, rng);
  std::vector<float> C(size_t(c.M) * c.N), sums(c.M);

  nt::kernels::GemmDesc d;
  d.M = c.M, d.N = c.N, d.K = c.K, d.trans_a = c.trans_a, d.trans_b = c.trans_b;
  d.A = A.data(), d.lda = int(a_cols), d.B = B.data(), d.ldb = int(b_cols), d.C = C.data(), d.ldc = c.N;
  d.epilogue = c.epilogue, d.bias = bias.data(), d.mask = mask.data();
  d.a_row_sums = c.row_sums ? sums.data() : nullptr;

  const double flops = 2.0 * c.M * c.N * c.K;
  const int reps = int(std::clamp(5e9 / flops, 300.0, 20000.0));  // 300 calls of the largest, 20000 of tiny ones
  for (int i = 0; i < reps / 10 + 10; ++i) nt::kernels::gemm(exec, d);
  std::vector<double> seconds(reps);
  for (auto& s : seconds) {
    auto t0 = std::chrono::steady_clock::now();
    nt::kernels::gemm(exec, d);
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::nth_element(seconds.begin(), seconds.begin() + reps / 2, seconds.end());
  return {seconds[reps / 2], *std::min_element(seconds.begin(), seconds.end())};
}

// Restricts the calling thread to CPUs [first, last] (threads it creates later inherit the mask).
void pin_to(int first, int last) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu = first; cpu <= last; ++cpu) CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> thread_counts{1, 2}, batches{64, 256};
  bool pin = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--pin"))
      pin = true;
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      thread_counts = {std::atoi(argv[++i])};
    else if (!std::strcmp(argv[i], "--batch") && i + 1 < argc)
      batches = {std::atoi(argv[++i])};
    else
      return std::fprintf(stderr, "usage: %s [--threads N] [--batch B] [--pin]\n", argv[0]), 2;
  }
  const int train_images = 60000;

  for (int B : batches) {
    const auto cases = step_cases(B);
    std::vector<double> step_seconds(thread_counts.size(), 0.0);
    double step_flops = 0;
    std::printf("\nbatch %d%s\n", B, pin ? " (threads pinned)" : "");
    std::printf("%-15s %-16s %-6s %-15s", "gemm", "MxNxK", "trans", "epilogue");
    for (int t : thread_counts) std::printf(" | %d thr: %8s %7s %8s", t, "ms", "GFLOP/s", "best ms");
    std::printf("\n");
    for (const auto& c : cases) {
      char shape[48];
      std::snprintf(shape, sizeof shape, "%dx%dx%d", c.M, c.N, c.K);
      std::printf("%-15s %-16s %c%c     %-15s", c.what, shape, c.trans_a ? 'T' : 'N', c.trans_b ? 'T' : 'N',
                  nt::kernels::gemm_kernel_name(c.epilogue));
      const double flops = 2.0 * c.M * c.N * c.K;
      step_flops += flops;
      for (size_t i = 0; i < thread_counts.size(); ++i) {
        if (pin) pin_to(1, std::max(1, thread_counts[i] - 1));  // the pool's workers inherit this
        nt::kernels::ThreadPool pool(thread_counts[i]);
        if (pin) pin_to(0, 0);
        nt::kernels::Exec exec;
        exec.pool = &pool;
        const Timing t = time_case(c, exec);
        step_seconds[i] += t.median;
        std::printf(" |        %8.4f %7.1f %8.4f", t.median * 1e3, flops / t.median * 1e-9, t.best * 1e3);
      }
      std::printf("\n");
    }
    const int steps = (train_images + B - 1) / B;
    for (size_t i = 0; i < thread_counts.size(); ++i)
      std::printf(
          "%d thread(s): GEMMs per step %.3f ms (%.1f GFLOP/s) -> per epoch (%d steps, batch %d)"
          " %.3f s\n",
          thread_counts[i], step_seconds[i] * 1e3, step_flops / step_seconds[i] * 1e-9, steps, B,
          step_seconds[i] * steps);
  }
  return 0;
}
