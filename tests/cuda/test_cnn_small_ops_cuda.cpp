// CUDA tests of the CNN's small op families against their CPU twins, on fresh random inputs, outputs
// poisoned beforehand (NaN, or an impossible index / mask byte) so that an unwritten element fails, and
// pad elements around each range so that a write outside it fails.
//   adam_update: within a few ulp (see adam_tolerance), expected bit-identical; the step counter exact.
//   dropout: masks, y and dx bit for bit (integer hash, the same two fp32 products; NaN payloads aside);
//   the counter exact.
//   maxpool2d: y, argmax and dx bit for bit (selects, and fixed-order sums from +0).
// The device counters are advanced by the last block of each launch (kernels/cuda/grid_counter.cuh):
// checked after k calls, with thousands of blocks (n = 5e6), and across replays of a captured graph.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/dropout.h"
#include "kernels/optim.h"
#include "kernels/pool.h"
#include "kernels/runtime.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Same bits, except that any NaN equals any NaN: a NaN made by arithmetic (NaN / (1 - p), inf * 0) is the
// canonical 0x7fffffff on the GPU and x86's default NaN (or the input's payload) on the CPU.
bool same_bits_or_both_nan(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!(std::isnan(a[i]) && std::isnan(b[i])) && std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  return true;
}

template <class T>
size_t count_bit_differences(const T* a, const T* b, size_t n) {
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) count += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return count;
}

// A host vector placed at `offset` elements into a device buffer whose other elements hold `pad`, so that
// misaligned pointers can be tested and writes outside [offset, offset+n) detected.
template <class T>
std::vector<T> padded(const std::vector<T>& v, size_t offset, T pad) {
  std::vector<T> out(v.size() + offset + 1, pad);
  std::copy(v.begin(), v.end(), out.begin() + offset);
  return out;
}

template <class T>
std::vector<T> slice(const std::vector<T>& v, size_t offset, size_t n) {
  return std::vector<T>(v.begin() + offset, v.begin() + offset + n);
}

std::vector<uint64_t> counter_at(uint64_t value) { return {value, 0}; }

// ---- Adam / AdamW ------------------------------------------------------------------------------------

// Both backends run the same correctly rounded fp32 operations (explicit FMAs, IEEE sqrt and division,
// the same double-precision bias corrections), so they are expected to agree bit for bit. The tolerance
// still allows what one ulp of difference in a sqrt or division (should the device's differ) would do
// after a few steps: a few ulp of the update, which is below a few ulp of the result's scale (max |p|,
// |m| or |v|), since |p| ~ 1 and the update ~ lr. A wrong t, index or missing decay is far larger.
const Tolerance kAdamTolerance{0, 4 * std::ldexp(1.0, -23),
                               "sqrt/div rounding may differ by an ulp: 4 eps of the scale (max |x|)"};

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
          kernels::adam_update(Exec{}, {.n = n, .params = p.data(), .grads = g.data(), .m = m.data(), .v = v.data(),
                                        .hyper = k.h, .step = cpu_step});
          d_g.upload(padded(g, offset, kPad));
          kernels::adam_update(gpu, {.n = n, .params = d_p.get() + offset, .grads = d_g.get() + offset,
                                     .m = d_m.get() + offset, .v = d_v.get() + offset, .hyper = k.h,
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

// ---- dropout --------------------------------------------------------------------------------------------

struct DropoutOffsets {
  size_t xy, mask;  // elements into the float buffers and into the mask: anything but 0 takes the scalar path
};

TEST_CASE("dropout on CUDA draws the CPU twin's masks bit for bit", "[cuda][dropout]") {
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  const float inf = std::numeric_limits<float>::infinity();
  const int kCalls = 3;
  const DropoutOffsets offsets[] = {{0, 0}, {1, 1}, {0, 1}, {1, 0}};
  for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(1000003)})
    for (float p : {0.f, 0.25f, 0.5f})
      for (const DropoutOffsets& off : offsets) {
        INFO("n=" << n << " p=" << p << " offsets x,y/mask " << off.xy << "/" << off.mask);
        const uint64_t seed = 0x5EEDull + n;
        uint64_t cpu_counter[2] = {5, 0};
        DeviceBuffer<uint64_t> d_counter(gpu, counter_at(5));
        DeviceBuffer<float> d_x(gpu, n + off.xy + 1), d_y(gpu, n + off.xy + 1);
        DeviceBuffer<float> d_dy(gpu, n + off.xy + 1), d_dx(gpu, n + off.xy + 1);
        DeviceBuffer<uint8_t> d_mask(gpu, n + off.mask + 1);
        for (int call = 0; call < kCalls; ++call) {
          INFO("call " << call);
          std::vector<float> x = random_floats(n, -3.f, 3.f), dy = random_floats(n);
          if (n >= 7) {
            x[2] = kNaN;
            x[4] = inf;
            dy[6] = -inf;
          }
          std::vector<float> cpu_y(n), cpu_dx(n);
          std::vector<uint8_t> cpu_mask(n);
          kernels::dropout_forward(Exec{}, kernels::DropoutArgs<float>{.n = n, .p = p, .seed = seed,
                                                                       .counter = cpu_counter, .x = x.data(),
                                                                       .y = cpu_y.data(), .mask = cpu_mask.data()});
          kernels::dropout_backward(Exec{}, kernels::DropoutArgs<float>{.n = n, .p = p, .mask = cpu_mask.data(),
                                                                        .dy = dy.data(), .dx = cpu_dx.data()});

          d_x.upload(padded(x, off.xy, 0.f));
          d_y.upload(padded(poisoned(n), off.xy, 0.f));
          d_mask.upload(padded(std::vector<uint8_t>(n, 7), off.mask, uint8_t{9}));
          d_dy.upload(padded(dy, off.xy, 0.f));
          d_dx.upload(padded(poisoned(n), off.xy, 0.f));
          kernels::dropout_forward(gpu, kernels::DropoutArgs<float>{.n = n, .p = p, .seed = seed,
                                                                    .counter = d_counter.get(), .x = d_x.get() + off.xy,
                                                                    .y = d_y.get() + off.xy,
                                                                    .mask = d_mask.get() + off.mask});
          kernels::dropout_backward(gpu, kernels::DropoutArgs<float>{.n = n, .p = p, .mask = d_mask.get() + off.mask,
                                                                     .dy = d_dy.get() + off.xy,
                                                                     .dx = d_dx.get() + off.xy});

          const auto got_mask = d_mask.download();
          const auto got_y = d_y.download(), got_dx = d_dx.download();
          REQUIRE(same_bits(got_mask.data() + off.mask, cpu_mask.data(), n));
          REQUIRE(same_bits_or_both_nan(got_y.data() + off.xy, cpu_y.data(), n));
          REQUIRE(same_bits_or_both_nan(got_dx.data() + off.xy, cpu_dx.data(), n));
          REQUIRE(got_mask.back() == 9);  // nothing written past the end
          REQUIRE(got_y.back() == 0.f);
          REQUIRE(got_dx.back() == 0.f);
          if (off.mask) REQUIRE(got_mask.front() == 9);
        }
        REQUIRE(cpu_counter[0] == 5 + kCalls);
        REQUIRE(d_counter.download() == counter_at(5 + kCalls));
      }
}

TEST_CASE("dropout on CUDA runs in place and with n == 0 advances the counter", "[cuda][dropout]") {
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  const size_t n = 4099;
  const float p = 0.4f;
  const std::vector<float> x = random_floats(n), dy = random_floats(n);
  std::vector<float> cpu_y(n), cpu_dx(n);
  std::vector<uint8_t> cpu_mask(n);
  uint64_t cpu_counter[2] = {0, 0};
  kernels::dropout_forward(Exec{}, kernels::DropoutArgs<float>{.n = n, .p = p, .seed = 3, .counter = cpu_counter,
                                                               .x = x.data(), .y = cpu_y.data(),
                                                               .mask = cpu_mask.data()});
  kernels::dropout_backward(Exec{}, kernels::DropoutArgs<float>{.n = n, .p = p, .mask = cpu_mask.data(),
                                                                .dy = dy.data(), .dx = cpu_dx.data()});

  DeviceBuffer<float> d_xy(gpu, x), d_d(gpu, dy);
  DeviceBuffer<uint8_t> d_mask(gpu, n);
  DeviceBuffer<uint64_t> d_counter(gpu, counter_at(0));
  kernels::dropout_forward(gpu, kernels::DropoutArgs<float>{.n = n, .p = p, .seed = 3, .counter = d_counter.get(),
                                                            .x = d_xy.get(), .y = d_xy.get(), .mask = d_mask.get()});
  kernels::dropout_backward(gpu, kernels::DropoutArgs<float>{.n = n, .p = p, .mask = d_mask.get(), .dy = d_d.get(),
                                                             .dx = d_d.get()});
  REQUIRE(same_bits(d_xy.download().data(), cpu_y.data(), n));
  REQUIRE(same_bits(d_d.download().data(), cpu_dx.data(), n));
  kernels::dropout_forward(gpu, kernels::DropoutArgs<float>{.n = 0, .p = p, .seed = 3, .counter = d_counter.get()});
  REQUIRE(d_counter.download() == counter_at(2));
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
    kernels::adam_update(capture_exec, {.n = n, .params = d_p.get(), .grads = d_g.get(), .m = d_m.get(), .v = d_v.get(),
                                        .hyper = h, .step = d_step.get()});
    kernels::dropout_forward(capture_exec, kernels::DropoutArgs<float>{.n = n, .p = p, .seed = 11,
                                                                       .counter = d_draws.get(), .x = d_x.get(),
                                                                       .y = d_y.get(), .mask = d_mask.get()});
  });
  REQUIRE(graph.node_count() == 2);

  uint64_t cpu_step[2] = {0, 0}, cpu_draws[2] = {0, 0};
  std::vector<float> cpu_y(n);
  std::vector<uint8_t> cpu_mask(n), previous_mask;
  for (int replay = 1; replay <= 4; ++replay) {
    INFO("replay " << replay);
    graph.launch(capture_exec);
    kernels::adam_update(Exec{}, {.n = n, .params = params.data(), .grads = grads.data(), .m = m.data(), .v = v.data(),
                                  .hyper = h, .step = cpu_step});
    kernels::dropout_forward(Exec{}, kernels::DropoutArgs<float>{.n = n, .p = p, .seed = 11, .counter = cpu_draws,
                                                                 .x = x.data(), .y = cpu_y.data(),
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

// ---- max pooling -----------------------------------------------------------------------------------------

enum class PoolInput { uniform, ties, nan };

std::vector<float> pool_input(size_t n, PoolInput kind) {
  std::vector<float> x = random_floats(n, -2.f, 2.f);
  if (kind == PoolInput::ties)
    for (auto& v : x) v = std::floor(v);  // four values: ties in most windows
  if (kind == PoolInput::nan)
    for (size_t i = 0; i < n; i += 11) x[i] = kNaN;  // a NaN in many windows, sometimes two
  return x;
}

TEST_CASE("maxpool2d on CUDA is bit-identical to the CPU twin", "[cuda][maxpool]") {
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  const kernels::Pool2dShape shapes[] = {{3, 5, 7, 9, 2, 2},     {3, 5, 7, 9, 3, 2},     {3, 5, 7, 9, 3, 3},
                                         {2, 3, 9, 7, 3, 1},     {1, 1, 1, 1, 1, 1},     {2, 2, 2, 5, 3, 2},
                                         {64, 32, 28, 28, 2, 2}, {64, 64, 14, 14, 2, 2}, {64, 32, 28, 28, 3, 2}};
  for (const kernels::Pool2dShape& s : shapes)
    for (PoolInput kind : {PoolInput::uniform, PoolInput::ties, PoolInput::nan}) {
      INFO("N=" << s.n << " C=" << s.c << " H=" << s.h << " W=" << s.w << " window " << s.window << " stride "
                << s.stride << " input " << int(kind));
      const size_t in = size_t(s.n) * s.c * s.h * s.w, out = size_t(s.n) * s.c * s.p() * s.q();
      const std::vector<float> x = pool_input(in, kind), dy = random_floats(out);
      std::vector<float> cpu_y(out), cpu_dx(in);
      std::vector<int32_t> cpu_arg(out);
      kernels::maxpool2d_forward(Exec{}, kernels::MaxPool2dArgs<float>{.shape = s, .x = x.data(), .y = cpu_y.data(),
                                                                       .argmax = cpu_arg.data()});
      kernels::maxpool2d_backward(Exec{}, kernels::MaxPool2dArgs<float>{.shape = s, .argmax = cpu_arg.data(),
                                                                        .dy = dy.data(), .dx = cpu_dx.data()});

      DeviceBuffer<float> d_x(gpu, x), d_dy(gpu, padded(dy, 0, 0.f));
      DeviceBuffer<float> d_y(gpu, padded(poisoned(out), 0, 0.f)), d_dx(gpu, padded(poisoned(in), 0, 0.f));
      DeviceBuffer<int32_t> d_arg(gpu, padded(std::vector<int32_t>(out, -7), 0, int32_t{-9}));
      kernels::maxpool2d_forward(gpu, kernels::MaxPool2dArgs<float>{.shape = s, .x = d_x.get(), .y = d_y.get(),
                                                                    .argmax = d_arg.get()});
      kernels::maxpool2d_backward(gpu, kernels::MaxPool2dArgs<float>{.shape = s, .argmax = d_arg.get(),
                                                                     .dy = d_dy.get(), .dx = d_dx.get()});

      const auto got_y = d_y.download(), got_dx = d_dx.download();
      const auto got_arg = d_arg.download();
      REQUIRE(same_bits(got_arg.data(), cpu_arg.data(), out));
      REQUIRE(same_bits(got_y.data(), cpu_y.data(), out));
      REQUIRE(same_bits(got_dx.data(), cpu_dx.data(), in));
      REQUIRE(got_arg.back() == -9);  // nothing written past the end
      REQUIRE(got_y.back() == 0.f);
      REQUIRE(got_dx.back() == 0.f);
    }
}

}  // namespace
}  // namespace nt::test
