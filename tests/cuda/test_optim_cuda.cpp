// CUDA tests of the optimizers (kernels/optim.h) against their CPU twins, on fresh random inputs, with pad elements
// around each range so that a write outside it fails, and pointers offset by one element (the scalar path):
//   sgd_update: bit for bit (same fp32 operations, explicit FMAs); velocity untouched without momentum.
//   adam_update: within a few ulp (kAdamTolerance gives why), expected bit-identical; the step counter exact.
// The device counters are advanced by the last block of each launch (kernels/cuda/grid_counter.cuh): checked
// after k calls, with thousands of blocks (n = 5e6), and across replays of a captured graph (Adam's step counter
// beside dropout's draw counter).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/dropout.h"
#include "kernels/optim.h"
#include "kernels/runtime.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

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
        INFO("n=" << n << " lr=" << h.lr << " momentum=" << h.momentum << " wd=" << h.weight_decay << " offsets p/g/v "
                  << off.p << "/" << off.g << "/" << off.v);
        const bool momentum = h.momentum != 0.f;
        std::vector<float> p = random_floats(n), v = random_floats(n);
        std::vector<float> v_before = v;

        DeviceBuffer<float> d_p(gpu, padded(p, off.p, kPad));
        DeviceBuffer<float> d_v(gpu, padded(v, off.v, kPad));
        DeviceBuffer<float> d_g(gpu, n + off.g + 1);
        for (int s = 0; s < kSteps; ++s) {
          std::vector<float> g = random_floats(n);
          kernels::sgd_update(
              Exec{},
              {.n = n, .params = p.data(), .grads = g.data(), .velocity = momentum ? v.data() : nullptr, .hyper = h});
          d_g.upload(padded(g, off.g, kPad));
          // Without momentum, pass velocity half of the time: it must not be touched either way.
          float* vel = (momentum || s % 2 == 1) ? d_v.get() + off.v : nullptr;
          kernels::sgd_update(
              gpu, {.n = n, .params = d_p.get() + off.p, .grads = d_g.get() + off.g, .velocity = vel, .hyper = h});
        }
        const auto got_p = d_p.download(), got_v = d_v.download();
        REQUIRE(same_bits(got_p.data() + off.p, p.data(), n));
        REQUIRE(same_bits(got_v.data() + off.v, momentum ? v.data() : v_before.data(), n));
        if (off.p) REQUIRE(got_p.front() == kPad);
        REQUIRE(got_p.back() == kPad);
        REQUIRE(got_v.back() == kPad);
      }
}

// ---- Adam / AdamW ------------------------------------------------------------------------------------

template <class T>
size_t count_bit_differences(const T* a, const T* b, size_t n) {
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) count += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return count;
}

template <class T>
std::vector<T> slice(const std::vector<T>& v, size_t offset, size_t n) {
  return std::vector<T>(v.begin() + offset, v.begin() + offset + n);
}

struct AdamCase {
  kernels::AdamHyper h;
  const char* name;
};

TEST_CASE("adam_update on CUDA matches the CPU twin and advances the step counter", "[cuda][adam]") {
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  const float kPad = -12345.f;  // outside [offset, offset+n): must never change
  const int kSteps = 3;
  const AdamCase cases[] = {{{1e-3f, 0.9f, 0.999f, 1e-8f, 0.f, false}, "Adam"},
                            {{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, false}, "Adam wd 0.01"},
                            {{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true}, "AdamW wd 0.01"},
                            {{0.05f, 0.3f, 0.99f, 1e-6f, 0.f, true}, "AdamW wd 0, beta1 < 0.5"}};
  for (size_t n : {size_t(1), size_t(7), size_t(1000003), size_t(5000000)})
    for (const AdamCase& k : cases)
      for (size_t offset : {size_t(0), size_t(1)}) {  // 1: every pointer misaligned, the scalar kernel
        if (n == 5000000 && k.h.decoupled && k.h.weight_decay == 0.f) continue;  // keep the run short
        INFO(k.name << ", n=" << n << ", offset " << offset);
        std::vector<float> p = random_floats(n), m(n, 0.f), v(n, 0.f);
        const size_t pad_begin = n > 64 ? n / 2 : n, pad_end = n > 64 ? n / 2 + 13 : n;  // zero padding
        std::fill(p.begin() + pad_begin, p.begin() + pad_end, 0.f);
        uint64_t cpu_step[2] = {0, 0};

        DeviceBuffer<float> d_p(gpu, padded(p, offset, kPad));
        DeviceBuffer<float> d_m(gpu, padded(m, offset, kPad));
        DeviceBuffer<float> d_v(gpu, padded(v, offset, kPad));
        DeviceBuffer<float> d_g(gpu, n + offset + 1);
        DeviceBuffer<uint64_t> d_step(gpu, counter_at(0));
        for (int s = 0; s < kSteps; ++s) {
          std::vector<float> g = random_floats(n, -2.f, 2.f);
          std::fill(g.begin() + pad_begin, g.begin() + pad_end, 0.f);
          kernels::adam_update(Exec{}, {.n = n,
                                        .params = p.data(),
                                        .grads = g.data(),
                                        .m = m.data(),
                                        .v = v.data(),
                                        .hyper = k.h,
                                        .step = cpu_step});
          d_g.upload(padded(g, offset, kPad));
          kernels::adam_update(gpu, {.n = n,
                                     .params = d_p.get() + offset,
                                     .grads = d_g.get() + offset,
                                     .m = d_m.get() + offset,
                                     .v = d_v.get() + offset,
                                     .hyper = k.h,
                                     .step = d_step.get()});
        }
        REQUIRE(d_step.download() == counter_at(kSteps));  // value = steps taken, done reset to 0
        const auto got_p = d_p.download(), got_m = d_m.download(), got_v = d_v.download();
        NT_REQUIRE_CLOSE(slice(got_p, offset, n), p, kAdamTolerance);
        NT_REQUIRE_CLOSE(slice(got_m, offset, n), m, kAdamTolerance);
        NT_REQUIRE_CLOSE(slice(got_v, offset, n), v, kAdamTolerance);
        const size_t differ = count_bit_differences(got_p.data() + offset, p.data(), n);
        if (differ != 0) WARN("adam_update: " << differ << " of " << n << " parameters differ in bits from the CPU");
        for (size_t i = pad_begin; i < pad_end; ++i) {  // padding stays +0
          REQUIRE(std::memcmp(&got_p[offset + i], &p[i], sizeof(float)) == 0);
          REQUIRE(got_p[offset + i] == 0.f);
        }
        for (const auto* buf : {&got_p, &got_m, &got_v}) {
          if (offset) REQUIRE(buf->front() == kPad);
          REQUIRE(buf->back() == kPad);
        }
      }
}

TEST_CASE("adam_update on CUDA with n == 0 still advances the step counter", "[cuda][adam]") {
  CudaExec cuda;
  DeviceBuffer<uint64_t> d_step(cuda.exec, counter_at(17));
  kernels::adam_update(cuda.exec, {.n = 0, .hyper = kernels::AdamHyper{}, .step = d_step.get()});
  REQUIRE(d_step.download() == counter_at(18));
}

// ---- the counters inside a captured graph ------------------------------------------------------------

TEST_CASE("adam and dropout counters advance on every replay of a captured graph", "[cuda][adam][dropout]") {
  CudaExec cuda;
  Exec capture_exec = cuda.exec;
  capture_exec.debug_sync = false;  // synchronizing is what a capture forbids
  const size_t n = 100003;
  const float p = 0.5f;
  const kernels::AdamHyper h{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, true};
  std::vector<float> params = random_floats(n), m(n, 0.f), v(n, 0.f);
  const std::vector<float> grads = random_floats(n), x = random_floats(n);

  DeviceBuffer<float> d_p(cuda.exec, params), d_m(cuda.exec, m), d_v(cuda.exec, v), d_g(cuda.exec, grads);
  DeviceBuffer<float> d_x(cuda.exec, x), d_y(cuda.exec, n);
  DeviceBuffer<uint8_t> d_mask(cuda.exec, n);
  DeviceBuffer<uint64_t> d_step(cuda.exec, counter_at(0)), d_draws(cuda.exec, counter_at(0));
  kernels::Graph graph = kernels::Graph::capture(capture_exec, [&] {
    kernels::adam_update(capture_exec, {.n = n,
                                        .params = d_p.get(),
                                        .grads = d_g.get(),
                                        .m = d_m.get(),
                                        .v = d_v.get(),
                                        .hyper = h,
                                        .step = d_step.get()});
    kernels::dropout_forward(capture_exec, kernels::DropoutArgs<float>{.n = n,
                                                                       .p = p,
                                                                       .seed = 11,
                                                                       .counter = d_draws.get(),
                                                                       .x = d_x.get(),
                                                                       .y = d_y.get(),
                                                                       .mask = d_mask.get()});
  });
  REQUIRE(graph.node_count() == 2);

  uint64_t cpu_step[2] = {0, 0}, cpu_draws[2] = {0, 0};
  std::vector<float> cpu_y(n);
  std::vector<uint8_t> cpu_mask(n), previous_mask;
  for (int replay = 1; replay <= 4; ++replay) {
    INFO("replay " << replay);
    graph.launch(capture_exec);
    kernels::adam_update(Exec{}, {.n = n,
                                  .params = params.data(),
                                  .grads = grads.data(),
                                  .m = m.data(),
                                  .v = v.data(),
                                  .hyper = h,
                                  .step = cpu_step});
    kernels::dropout_forward(Exec{}, kernels::DropoutArgs<float>{.n = n,
                                                                 .p = p,
                                                                 .seed = 11,
                                                                 .counter = cpu_draws,
                                                                 .x = x.data(),
                                                                 .y = cpu_y.data(),
                                                                 .mask = cpu_mask.data()});
    REQUIRE(d_step.download() == counter_at(uint64_t(replay)));
    REQUIRE(d_draws.download() == counter_at(uint64_t(replay)));
    NT_REQUIRE_CLOSE(d_p.download(), params, kAdamTolerance);  // the bias corrections of t = replay
    const auto got_mask = d_mask.download();
    REQUIRE(got_mask == cpu_mask);  // draw = replay - 1: a fresh mask every replay
    REQUIRE(got_mask != previous_mask);
    previous_mask = got_mask;
  }
}

}  // namespace
}  // namespace nt::test
