// CUDA tests of dropout (kernels/dropout.h) against the CPU twin, on fresh random inputs, outputs poisoned
// beforehand (NaN, or an impossible mask byte) and pad elements around each range, so that an unwritten element or
// a write outside the range fails: masks, y and dx bit for bit (integer hash, the same two fp32 products; NaN
// payloads aside, see same_bits_or_both_nan); the draw counter exact, advanced by the last block of each launch
// (kernels/cuda/grid_counter.cuh). Its replays in a captured graph are checked in test_optim_cuda.cpp, beside Adam's.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/dropout.h"
#include "kernels/runtime.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

// ---- dropout --------------------------------------------------------------------------------------------

// Same bits, except that any NaN equals any NaN: a NaN made by arithmetic (NaN / (1 - p), inf * 0) is the
// canonical 0x7fffffff on the GPU and x86's default NaN (or the input's payload) on the CPU.
bool same_bits_or_both_nan(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!(std::isnan(a[i]) && std::isnan(b[i])) && std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  return true;
}

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
          kernels::dropout_forward(Exec{}, kernels::DropoutArgs<float>{.n = n,
                                                                       .p = p,
                                                                       .seed = seed,
                                                                       .counter = cpu_counter,
                                                                       .x = x.data(),
                                                                       .y = cpu_y.data(),
                                                                       .mask = cpu_mask.data()});
          kernels::dropout_backward(Exec{},
                                    kernels::DropoutArgs<float>{
                                        .n = n, .p = p, .mask = cpu_mask.data(), .dy = dy.data(), .dx = cpu_dx.data()});

          d_x.upload(padded(x, off.xy, 0.f));
          d_y.upload(padded(poisoned(n), off.xy, 0.f));
          d_mask.upload(padded(std::vector<uint8_t>(n, 7), off.mask, uint8_t{9}));
          d_dy.upload(padded(dy, off.xy, 0.f));
          d_dx.upload(padded(poisoned(n), off.xy, 0.f));
          kernels::dropout_forward(gpu, kernels::DropoutArgs<float>{.n = n,
                                                                    .p = p,
                                                                    .seed = seed,
                                                                    .counter = d_counter.get(),
                                                                    .x = d_x.get() + off.xy,
                                                                    .y = d_y.get() + off.xy,
                                                                    .mask = d_mask.get() + off.mask});
          kernels::dropout_backward(gpu, kernels::DropoutArgs<float>{.n = n,
                                                                     .p = p,
                                                                     .mask = d_mask.get() + off.mask,
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
  kernels::dropout_forward(Exec{}, kernels::DropoutArgs<float>{.n = n,
                                                               .p = p,
                                                               .seed = 3,
                                                               .counter = cpu_counter,
                                                               .x = x.data(),
                                                               .y = cpu_y.data(),
                                                               .mask = cpu_mask.data()});
  kernels::dropout_backward(Exec{}, kernels::DropoutArgs<float>{
                                        .n = n, .p = p, .mask = cpu_mask.data(), .dy = dy.data(), .dx = cpu_dx.data()});

  DeviceBuffer<float> d_xy(gpu, x), d_d(gpu, dy);
  DeviceBuffer<uint8_t> d_mask(gpu, n);
  DeviceBuffer<uint64_t> d_counter(gpu, counter_at(0));
  kernels::dropout_forward(gpu, kernels::DropoutArgs<float>{.n = n,
                                                            .p = p,
                                                            .seed = 3,
                                                            .counter = d_counter.get(),
                                                            .x = d_xy.get(),
                                                            .y = d_xy.get(),
                                                            .mask = d_mask.get()});
  kernels::dropout_backward(
      gpu, kernels::DropoutArgs<float>{.n = n, .p = p, .mask = d_mask.get(), .dy = d_d.get(), .dx = d_d.get()});
  REQUIRE(same_bits(d_xy.download().data(), cpu_y.data(), n));
  REQUIRE(same_bits(d_d.download().data(), cpu_dx.data(), n));
  kernels::dropout_forward(gpu, kernels::DropoutArgs<float>{.n = 0, .p = p, .seed = 3, .counter = d_counter.get()});
  REQUIRE(d_counter.download() == counter_at(2));
}

}  // namespace
}  // namespace nt::test
