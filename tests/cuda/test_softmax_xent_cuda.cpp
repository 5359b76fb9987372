// CUDA tests of softmax cross-entropy (kernels/softmax_xent.h) against the CPU twin, on fresh random logits
// (uniform, large enough to overflow exp without the row max, ties), the gradient poisoned (NaN) beforehand so
// that an element the kernel forgot to write fails: the loss and the gradient within xent_loss_allowed and
// xent_grad_tolerance (support/test_support.h: the backends differ only by their expf/logf), the count exact; the
// counters accumulate; the loss is bit-reproducible (fixed reduction order) and keeps NaN.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/runtime.h"
#include "kernels/softmax_xent.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

// ---- softmax cross-entropy ---------------------------------------------------------------------------

enum class LogitKind { uniform, large, ties };

std::vector<float> make_logits(size_t n, LogitKind kind) {
  switch (kind) {
    case LogitKind::uniform:
      return random_floats(n, -3, 3);
    case LogitKind::large:
      return random_floats(n, -80, 80);  // exp overflows fp32 unless the max is taken out
    case LogitKind::ties: {
      auto v = random_floats(n, 0, 4);
      for (auto& x : v) x = std::floor(x);  // four values: equal maxima in most rows
      return v;
    }
  }
  return {};
}

const char* kind_name(LogitKind kind) {
  return kind == LogitKind::uniform ? "uniform" : kind == LogitKind::large ? "large" : "ties";
}

TEST_CASE("softmax_xent on CUDA matches the CPU twin", "[cuda][xent]") {
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  for (int B : {1, 7, 64, 65, 256, 1000, 10000})
    for (int C : {1, 10, 33, 1000})
      for (LogitKind kind : {LogitKind::uniform, LogitKind::large, LogitKind::ties}) {
        INFO("B=" << B << " C=" << C << " logits " << kind_name(kind));
        const size_t n = size_t(B) * C;
        auto logits = make_logits(n, kind);
        auto labels = random_labels(B, C);

        double cpu_loss = 0.5;  // counters already holding an earlier batch
        int64_t cpu_correct = 2;
        std::vector<float> cpu_grad(n);
        kernels::softmax_xent(Exec{}, kernels::SoftmaxXentArgs<float>{.B = B,
                                                                      .C = C,
                                                                      .logits = logits.data(),
                                                                      .labels = labels.data(),
                                                                      .dlogits = cpu_grad.data(),
                                                                      .loss_sum = &cpu_loss,
                                                                      .correct = &cpu_correct});

        DeviceBuffer<float> d_logits(gpu, logits);
        DeviceBuffer<int32_t> d_labels(gpu, labels);
        DeviceBuffer<float> d_grad(gpu, poisoned(n));
        DeviceBuffer<double> d_loss(gpu, std::vector<double>{0.5});
        DeviceBuffer<int64_t> d_correct(gpu, std::vector<int64_t>{2});
        const kernels::SoftmaxXentArgs<float> on_gpu{.B = B,
                                                     .C = C,
                                                     .logits = d_logits.get(),
                                                     .labels = d_labels.get(),
                                                     .dlogits = d_grad.get(),
                                                     .loss_sum = d_loss.get(),
                                                     .correct = d_correct.get()};
        kernels::softmax_xent(gpu, on_gpu);
        const double gpu_loss = d_loss.download()[0];
        const int64_t gpu_correct = d_correct.download()[0];

        INFO("loss: cuda " << gpu_loss << ", cpu " << cpu_loss);
        REQUIRE(std::abs(gpu_loss - cpu_loss) <= xent_loss_allowed(B, C, cpu_loss - 0.5));
        REQUIRE(gpu_correct == cpu_correct);
        NT_REQUIRE_CLOSE(d_grad.download(), cpu_grad, xent_grad_tolerance(B, C));

        // Evaluation mode: no gradient, the counters accumulate (a second call adds the same again).
        auto evaluation = on_gpu;
        evaluation.dlogits = nullptr;
        kernels::softmax_xent(gpu, evaluation);
        const double increment = gpu_loss - 0.5;
        REQUIRE(std::abs(d_loss.download()[0] - (gpu_loss + increment)) <= 4 * kEps * std::abs(gpu_loss + increment));
        REQUIRE(d_correct.download()[0] == 2 + 2 * (cpu_correct - 2));
      }
}

TEST_CASE("softmax_xent on CUDA is bit-reproducible and keeps NaN", "[cuda][xent]") {
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  const int B = 1000, C = 10;
  auto logits = random_floats(size_t(B) * C, -5, 5);
  auto labels = random_labels(B, C);
  DeviceBuffer<float> d_logits(gpu, logits);
  DeviceBuffer<int32_t> d_labels(gpu, labels);
  DeviceBuffer<float> d_grad(gpu, size_t(B) * C);

  auto run_once = [&] {
    DeviceBuffer<double> d_loss(gpu, std::vector<double>{0.0});
    DeviceBuffer<int64_t> d_correct(gpu, std::vector<int64_t>{0});
    kernels::softmax_xent(gpu, kernels::SoftmaxXentArgs<float>{.B = B,
                                                               .C = C,
                                                               .logits = d_logits.get(),
                                                               .labels = d_labels.get(),
                                                               .dlogits = d_grad.get(),
                                                               .loss_sum = d_loss.get(),
                                                               .correct = d_correct.get()});
    return d_loss.download()[0];
  };
  const double first = run_once();
  const double second = run_once();
  REQUIRE(std::memcmp(&first, &second, sizeof first) == 0);  // same bits: fixed reduction order

  logits[5 * C + 3] = std::numeric_limits<float>::quiet_NaN();
  d_logits.upload(logits);
  REQUIRE(std::isnan(run_once()));
}

}  // namespace
}  // namespace nt::test
