// CUDA tests of the small op families against their CPU twins, on fresh random inputs, with every output
// poisoned (NaN) beforehand so that an element the kernel forgot to write fails.
//   softmax_xent: within the stated tolerance (the backends differ only by their expf/logf), count exact.
//   sgd_update, gather_batch (plain and randomly shifted), relu: bit for bit (same fp32 operations, explicit
//   FMAs, integer hashes shared by host and device).
// Odd sizes and pointers offset by one element exercise both the vectorized and the scalar paths.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/activation.h"
#include "kernels/batch.h"
#include "kernels/nonfinite.h"
#include "kernels/optim.h"
#include "kernels/runtime.h"
#include "kernels/softmax_xent.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;


// A host vector placed at `offset` elements into a device buffer whose other elements hold the poison,
// so that misaligned pointers can be tested and writes outside [offset, offset+n) detected.
template <class T>
std::vector<T> padded(const std::vector<T>& v, size_t offset, T pad) {
  std::vector<T> out(v.size() + offset + 1, pad);
  std::copy(v.begin(), v.end(), out.begin() + offset);
  return out;
}

// ---- softmax cross-entropy ---------------------------------------------------------------------------

// The backends share the row arithmetic and the summation order; they differ by expf (CUDA: 2 ulp,
// glibc: 1 ulp) and logf, which perturb s by a few eps relative, and then the rounding of its sum of C
// terms: sqrt(C)·eps on random data, as the log turns the relative error of s into an absolute error;
// plus a few eps of each row loss's own size. Summed over B rows (losses >= 0: Σ|loss_b| = |total|).
double xent_loss_allowed(int B, int C, double total) {
  return B * 8 * std::sqrt(double(C)) * kEps + 4 * kEps * std::abs(total);
}

// dlogits = (p - onehot)/B: p differs by the relative error of s and of expf; near 1, p is rounded on a
// 2^-24 grid, so p - 1 differs by ~eps/2 absolute however small the result: hence the 2·eps/B term.
Tolerance xent_grad_tolerance(int B, int C) {
  return {2 * kEps / B, 8 * std::sqrt(double(C)) * kEps,
          "softmax gradient: sqrt(C)*eps relative from the exp sum, eps/B absolute where p rounds near 1"};
}

enum class LogitKind { uniform, large, ties };

std::vector<float> make_logits(size_t n, LogitKind kind) {
  switch (kind) {
    case LogitKind::uniform: return random_floats(n, -3, 3);
    case LogitKind::large: return random_floats(n, -80, 80);  // exp overflows fp32 unless the max is taken out
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
        kernels::softmax_xent(Exec{}, kernels::SoftmaxXentArgs<float>{.B = B, .C = C, .logits = logits.data(),
                                                                      .labels = labels.data(), .dlogits = cpu_grad.data(),
                                                                      .loss_sum = &cpu_loss, .correct = &cpu_correct});

        DeviceBuffer<float> d_logits(gpu, logits);
        DeviceBuffer<int32_t> d_labels(gpu, labels);
        DeviceBuffer<float> d_grad(gpu, poisoned(n));
        DeviceBuffer<double> d_loss(gpu, std::vector<double>{0.5});
        DeviceBuffer<int64_t> d_correct(gpu, std::vector<int64_t>{2});
        const kernels::SoftmaxXentArgs<float> on_gpu{.B = B, .C = C, .logits = d_logits.get(), .labels = d_labels.get(),
                                                     .dlogits = d_grad.get(), .loss_sum = d_loss.get(),
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
    kernels::softmax_xent(gpu, kernels::SoftmaxXentArgs<float>{.B = B, .C = C, .logits = d_logits.get(),
                                                               .labels = d_labels.get(), .dlogits = d_grad.get(),
                                                               .loss_sum = d_loss.get(), .correct = d_correct.get()});
    return d_loss.download()[0];
  };
  const double first = run_once();
  const double second = run_once();
  REQUIRE(std::memcmp(&first, &second, sizeof first) == 0);  // same bits: fixed reduction order

  logits[5 * C + 3] = std::numeric_limits<float>::quiet_NaN();
  d_logits.upload(logits);
  REQUIRE(std::isnan(run_once()));
}

// ---- SGD ---------------------------------------------------------------------------------------------

struct Offsets {
  size_t p, g, v;  // elements into each buffer: 0 keeps 16-byte alignment, anything else breaks it
};

TEST_CASE("sgd_update on CUDA is bit-identical to the CPU twin", "[cuda][optim]") {
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  const float kPad = -12345.f;  // outside [offset, offset+n): must never change
  const int kSteps = 3;
  const kernels::SgdHyper hypers[] = {{0.1f, 0.f, 0.f}, {0.05f, 0.9f, 0.f}, {0.05f, 0.9f, 5e-4f}, {0.01f, 0.f, 1e-2f}};
  const Offsets offsets[] = {{0, 0, 0}, {1, 1, 1}, {0, 1, 0}, {0, 0, 3}};
  for (size_t n : {size_t(1), size_t(7), size_t(1023), size_t(250890)})
    for (const auto& h : hypers)
      for (const Offsets& off : offsets) {
        INFO("n=" << n << " lr=" << h.lr << " momentum=" << h.momentum << " wd=" << h.weight_decay
                  << " offsets p/g/v " << off.p << "/" << off.g << "/" << off.v);
        const bool momentum = h.momentum != 0.f;
        std::vector<float> p = random_floats(n), v = random_floats(n);
        std::vector<float> v_before = v;

        DeviceBuffer<float> d_p(gpu, padded(p, off.p, kPad));
        DeviceBuffer<float> d_v(gpu, padded(v, off.v, kPad));
        DeviceBuffer<float> d_g(gpu, n + off.g + 1);
        for (int s = 0; s < kSteps; ++s) {
          std::vector<float> g = random_floats(n);
          kernels::sgd_update(Exec{}, {.n = n, .params = p.data(), .grads = g.data(),
                                       .velocity = momentum ? v.data() : nullptr, .hyper = h});
          d_g.upload(padded(g, off.g, kPad));
          // Without momentum, pass velocity half of the time: it must not be touched either way.
          float* vel = (momentum || s % 2 == 1) ? d_v.get() + off.v : nullptr;
          kernels::sgd_update(gpu, {.n = n, .params = d_p.get() + off.p, .grads = d_g.get() + off.g, .velocity = vel,
                                    .hyper = h});
        }
        const auto got_p = d_p.download(), got_v = d_v.download();
        REQUIRE(same_bits(got_p.data() + off.p, p.data(), n));
        REQUIRE(same_bits(got_v.data() + off.v, momentum ? v.data() : v_before.data(), n));
        if (off.p) REQUIRE(got_p.front() == kPad);
        REQUIRE(got_p.back() == kPad);
        REQUIRE(got_v.back() == kPad);
      }
}

// ---- batch gather --------------------------------------------------------------------------------------

// The GPU gather twice, the second beside the first (it writes other buffers, as a training step's gather runs
// beside the optimizer update), each checked against the CPU twin's x and y bit for bit, outputs poisoned.
void check_gather_twice(const Exec& gpu, const kernels::BatchSource& src, int64_t first, int B, size_t x_offset,
                        const std::vector<float>& cpu_x, const std::vector<int32_t>& cpu_y) {
  const size_t n = cpu_x.size();
  DeviceBuffer<float> d_x(gpu, padded(poisoned(n), x_offset, kPoison)), d_x2(gpu, padded(poisoned(n), x_offset, kPoison));
  DeviceBuffer<int32_t> d_y(gpu, std::vector<int32_t>(B, -1)), d_y2(gpu, std::vector<int32_t>(B, -1));
  kernels::gather_batch(gpu, {.src = src, .first = first, .B = B, .x = d_x.get() + x_offset, .y = d_y.get()});
  kernels::gather_batch(gpu, {.src = src, .first = first, .B = B, .x = d_x2.get() + x_offset, .y = d_y2.get(),
                              .overlaps_previous = true});
  for (const auto* out : {&d_x, &d_x2}) {
    const auto got_x = out->download();
    REQUIRE(same_bits(got_x.data() + x_offset, cpu_x.data(), n));
    REQUIRE(std::isnan(got_x.back()));  // nothing written past the batch
    if (x_offset) REQUIRE(std::isnan(got_x.front()));
  }
  for (const auto* out : {&d_y, &d_y2}) REQUIRE(out->download() == cpu_y);
}

TEST_CASE("gather_batch on CUDA is bit-identical to the CPU twin", "[cuda][batch]") {
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  struct Case {
    int N, D, B;
    int64_t first;
    size_t image_offset, x_offset;  // bytes into the image buffer, floats into x: breaks the vector path
  };
  const Case cases[] = {{300, 784, 64, 100, 0, 0}, {300, 784, 64, 7, 0, 1}, {300, 784, 33, 0, 1, 0},
                        {50, 13, 17, 20, 0, 0},    {10000, 784, 10000, 0, 0, 0}, {5, 1, 5, 0, 0, 0}};
  for (const Case& k : cases) {
    INFO("N=" << k.N << " D=" << k.D << " B=" << k.B << " first=" << k.first << " offsets " << k.image_offset
              << "/" << k.x_offset);
    std::vector<uint8_t> images(size_t(k.N) * k.D), labels(k.N);
    std::uniform_int_distribution<int> byte(0, 255), digit(0, 9);
    for (auto& px : images) px = static_cast<uint8_t>(byte(rng()));
    for (auto& l : labels) l = static_cast<uint8_t>(digit(rng()));
    std::vector<int32_t> perm(k.N);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
    const float mean = 0.1307f, std_dev = 0.3081f;

    const size_t n = size_t(k.B) * k.D;
    std::vector<float> cpu_x(n);
    std::vector<int32_t> cpu_y(k.B);
    const kernels::BatchSource cpu_src{.images = images.data(), .labels = labels.data(), .perm = perm.data(),
                                       .D = k.D, .mean = mean, .std = std_dev};
    kernels::gather_batch(Exec{}, {.src = cpu_src, .first = k.first, .B = k.B, .x = cpu_x.data(), .y = cpu_y.data()});

    DeviceBuffer<uint8_t> d_images(gpu, padded(images, k.image_offset, uint8_t{0}));
    DeviceBuffer<uint8_t> d_labels(gpu, labels);
    DeviceBuffer<int32_t> d_perm(gpu, perm);
    const kernels::BatchSource src{d_images.get() + k.image_offset, d_labels.get(), d_perm.get(), k.D, mean, std_dev};
    check_gather_twice(gpu, src, k.first, k.B, k.x_offset, cpu_x, cpu_y);
  }
}

// ---- batch gather with random shifts ---------------------------------------------------------------------

// Random (C,H,W) images, labels and a permutation, uploaded; the CPU twin reads the host copies.
struct ShiftCase {
  int N, C, H, W, k, B;
  int64_t first;
  size_t x_offset;  // floats into x: a misaligned output
};

struct ShiftInputs {
  std::vector<uint8_t> images, labels;
  std::vector<int32_t> perm;
  explicit ShiftInputs(const ShiftCase& k) : images(size_t(k.N) * k.C * k.H * k.W), labels(k.N), perm(k.N) {
    std::uniform_int_distribution<int> byte(0, 255), digit(0, 9);
    for (auto& px : images) px = static_cast<uint8_t>(byte(rng()));
    for (auto& l : labels) l = static_cast<uint8_t>(digit(rng()));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
  }
};

kernels::BatchSource shift_source(const ShiftCase& k, const uint8_t* images, const uint8_t* labels,
                                  const int32_t* perm, const uint64_t* key) {
  kernels::BatchSource s{images, labels, perm, k.C * k.H * k.W, 0.1307f, 0.3081f};
  s.height = k.H, s.width = k.W, s.shift = k.k, s.shift_key = key;
  return s;
}

TEST_CASE("gather_batch with random shifts on CUDA is bit-identical to the CPU twin", "[cuda][batch][shift]") {
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  // MNIST's shape at two offsets; odd planes; channels; a shift beyond the image; one column; rows wider
  // than a block's x threads (the column loop strides); a batch past the grid's y limit (rows stride).
  const ShiftCase cases[] = {{300, 1, 28, 28, 2, 64, 100, 0}, {300, 1, 28, 28, 4, 64, 7, 1},
                             {50, 1, 7, 5, 3, 17, 20, 0},     {40, 3, 9, 11, 1, 33, 0, 1},
                             {30, 1, 4, 3, 8, 25, 5, 0},      {20, 2, 13, 1, 2, 20, 0, 0},
                             {40, 1, 5, 300, 3, 9, 3, 1},     {10000, 1, 28, 28, 2, 10000, 0, 0},
                             {70001, 1, 3, 5, 1, 70001, 0, 0}};
  for (const ShiftCase& k : cases) {
    INFO("N=" << k.N << " C=" << k.C << " H=" << k.H << " W=" << k.W << " k=" << k.k << " B=" << k.B
              << " first=" << k.first << " x offset " << k.x_offset);
    const ShiftInputs in(k);
    const uint64_t key = kernels::counter_key(rng()(), 3);
    const size_t n = size_t(k.B) * k.C * k.H * k.W;

    std::vector<float> cpu_x = poisoned(n);
    std::vector<int32_t> cpu_y(k.B, -1);
    kernels::gather_batch(Exec{}, {.src = shift_source(k, in.images.data(), in.labels.data(), in.perm.data(), &key),
                                   .first = k.first, .B = k.B, .x = cpu_x.data(), .y = cpu_y.data()});

    DeviceBuffer<uint8_t> d_images(gpu, in.images), d_labels(gpu, in.labels);
    DeviceBuffer<int32_t> d_perm(gpu, in.perm);
    DeviceBuffer<uint64_t> d_key(gpu, std::vector<uint64_t>{key});
    check_gather_twice(gpu, shift_source(k, d_images.get(), d_labels.get(), d_perm.get(), d_key.get()), k.first, k.B,
                       k.x_offset, cpu_x, cpu_y);
  }
}

TEST_CASE("a captured shifted gather reads each epoch's key from device memory on replay", "[cuda][batch][shift]") {
  CudaExec cuda;
  Exec capture_exec = cuda.exec;
  capture_exec.debug_sync = false;  // synchronizing is what a capture forbids
  const ShiftCase k{256, 1, 28, 28, 2, 64, 64, 0};
  const ShiftInputs in(k);
  const size_t n = size_t(k.B) * k.C * k.H * k.W;
  const uint64_t seed = 77;

  DeviceBuffer<uint8_t> d_images(cuda.exec, in.images), d_labels(cuda.exec, in.labels);
  DeviceBuffer<int32_t> d_perm(cuda.exec, in.perm);
  DeviceBuffer<uint64_t> d_key(cuda.exec, std::vector<uint64_t>{kernels::counter_key(seed, 0)});
  DeviceBuffer<float> d_x(cuda.exec, poisoned(n));
  DeviceBuffer<int32_t> d_y(cuda.exec, std::vector<int32_t>(k.B, -1));
  const auto src = shift_source(k, d_images.get(), d_labels.get(), d_perm.get(), d_key.get());
  kernels::Graph graph = kernels::Graph::capture(capture_exec, [&] {
    kernels::gather_batch(capture_exec, {.src = src, .first = k.first, .B = k.B, .x = d_x.get(), .y = d_y.get()});
  });
  REQUIRE(graph.node_count() == 1);

  std::vector<float> previous;
  for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
    INFO("epoch " << epoch);
    const uint64_t key = kernels::counter_key(seed, epoch);
    d_key.upload({key});  // what DeviceBatcher::begin_epoch does, once per epoch
    graph.launch(capture_exec);
    std::vector<float> cpu_x = poisoned(n);
    std::vector<int32_t> cpu_y(k.B, -1);
    kernels::gather_batch(Exec{}, {.src = shift_source(k, in.images.data(), in.labels.data(), in.perm.data(), &key),
                                   .first = k.first, .B = k.B, .x = cpu_x.data(), .y = cpu_y.data()});
    const auto got_x = d_x.download();
    REQUIRE(same_bits(got_x, cpu_x));
    REQUIRE(d_y.download() == cpu_y);
    REQUIRE(!same_bits(got_x, previous));  // fresh shifts every epoch
    previous = got_x;
  }
}

// ---- ReLU -------------------------------------------------------------------------------------------------

TEST_CASE("relu on CUDA is bit-identical to the CPU twin, in place and misaligned", "[cuda][relu]") {
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  const float inf = std::numeric_limits<float>::infinity();
  for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(1023), size_t(250890)})
    for (size_t offset : {size_t(0), size_t(1)}) {
      INFO("n=" << n << " offset " << offset);
      std::vector<float> x = random_floats(n), dy = random_floats(n);
      if (n >= 7) {  // the edges: NaN, signed zeros, infinities
        x[1] = kPoison;
        x[2] = -0.f;
        x[3] = 0.f;
        x[4] = inf;
        x[5] = -inf;
        dy[6] = inf;
      }
      std::vector<float> cpu_y(n), cpu_dx(n);
      kernels::relu_forward(Exec{}, kernels::ReluArgs<float>{.n = n, .x = x.data(), .y = cpu_y.data()});
      kernels::relu_backward(Exec{}, kernels::ReluArgs<float>{.n = n, .y = cpu_y.data(), .dy = dy.data(),
                                                              .dx = cpu_dx.data()});

      // Out of place; dx stays aligned while y and dy may not be, so the paths mix.
      DeviceBuffer<float> d_x(gpu, padded(x, offset, 0.f));
      DeviceBuffer<float> d_y(gpu, padded(poisoned(n), offset, 0.f));
      DeviceBuffer<float> d_dy(gpu, padded(dy, offset, 0.f));
      DeviceBuffer<float> d_dx(gpu, padded(poisoned(n), 0, 0.f));
      kernels::relu_forward(gpu, kernels::ReluArgs<float>{.n = n, .x = d_x.get() + offset, .y = d_y.get() + offset});
      const auto got_y = d_y.download();
      REQUIRE(same_bits(got_y.data() + offset, cpu_y.data(), n));
      REQUIRE(got_y.back() == 0.f);  // nothing written past the end
      kernels::relu_backward(gpu, kernels::ReluArgs<float>{.n = n, .y = d_y.get() + offset, .dy = d_dy.get() + offset,
                                                           .dx = d_dx.get()});
      const auto got_dx = d_dx.download();
      REQUIRE(same_bits(got_dx.data(), cpu_dx.data(), n));
      REQUIRE(got_dx.back() == 0.f);

      // In place: y over x, then dx over dy.
      kernels::relu_forward(gpu, kernels::ReluArgs<float>{.n = n, .x = d_x.get() + offset, .y = d_x.get() + offset});
      REQUIRE(same_bits(d_x.download().data() + offset, cpu_y.data(), n));
      kernels::relu_backward(gpu, kernels::ReluArgs<float>{.n = n, .y = d_x.get() + offset, .dy = d_dy.get() + offset,
                                                           .dx = d_dy.get() + offset});
      REQUIRE(same_bits(d_dy.download().data() + offset, cpu_dx.data(), n));
    }
}

}  // namespace
}  // namespace nt::test

// ---- count_nonfinite -----------------------------------------------------------------------------------

namespace nt::test {
namespace {

// Random values with NaN, +inf and -inf planted at random places (none when `bad` is 0), and the largest finite
// floats and denormals, which are finite and must not count.
std::vector<float> with_nonfinite(size_t n, size_t bad) {
  auto x = random_floats(n);
  const float planted[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
  for (size_t i = 0; i < bad && n > 0; ++i) x[rng()() % n] = planted[i % 3];
  if (n > 2) x[n / 2] = std::numeric_limits<float>::max(), x[n / 3] = std::numeric_limits<float>::denorm_min();
  return x;
}

}  // namespace
}  // namespace nt::test

TEST_CASE("count_nonfinite on CUDA counts as the CPU twin does, and accumulates", "[cuda][nonfinite]") {
  using namespace nt;
  test::CudaExec cuda;
  const kernels::Exec cpu;
  for (const size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000003}, size_t{4'000'037}})
    for (const size_t bad : {size_t{0}, size_t{1}, size_t{5}, n}) {
      INFO("n " << n << " planted " << bad);
      const auto x = test::with_nonfinite(n, bad);
      int64_t want = 41;  // a count already there: the op adds to it
      kernels::count_nonfinite(cpu, {.x = x.data(), .n = int64_t(n), .count = &want});
      test::DeviceBuffer<float> d_x(cuda.exec, x.empty() ? std::vector<float>{0.f} : x);
      test::DeviceBuffer<int64_t> d_count(cuda.exec, std::vector<int64_t>{41});
      kernels::count_nonfinite(cuda.exec, {.x = d_x.get(), .n = int64_t(n), .count = d_count.get()});
      CHECK(d_count.download().front() == want);
      if (bad == 0) CHECK(want == 41);
    }
}
