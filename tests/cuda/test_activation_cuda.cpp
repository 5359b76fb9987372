// CUDA tests of ReLU (kernels/activation.h) against the CPU twin, bit for bit (same fp32 operations), outputs
// poisoned (NaN) beforehand so that an element the kernel forgot to write fails: odd sizes and pointers offset by
// one element (the vectorized and the scalar paths), in place, NaN, signed zeros and infinities.
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/activation.h"
#include "kernels/runtime.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

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
      kernels::relu_backward(Exec{},
                             kernels::ReluArgs<float>{.n = n, .y = cpu_y.data(), .dy = dy.data(), .dx = cpu_dx.data()});

      // Out of place; dx stays aligned while y and dy may not be, so the paths mix.
      DeviceBuffer<float> d_x(gpu, padded(x, offset, 0.f));
      DeviceBuffer<float> d_y(gpu, padded(poisoned(n), offset, 0.f));
      DeviceBuffer<float> d_dy(gpu, padded(dy, offset, 0.f));
      DeviceBuffer<float> d_dx(gpu, padded(poisoned(n), 0, 0.f));
      kernels::relu_forward(gpu, kernels::ReluArgs<float>{.n = n, .x = d_x.get() + offset, .y = d_y.get() + offset});
      const auto got_y = d_y.download();
      REQUIRE(same_bits(got_y.data() + offset, cpu_y.data(), n));
      REQUIRE(got_y.back() == 0.f);  // nothing written past the end
      kernels::relu_backward(
          gpu, kernels::ReluArgs<float>{.n = n, .y = d_y.get() + offset, .dy = d_dy.get() + offset, .dx = d_dx.get()});
      const auto got_dx = d_dx.download();
      REQUIRE(same_bits(got_dx.data(), cpu_dx.data(), n));
      REQUIRE(got_dx.back() == 0.f);

      // In place: y over x, then dx over dy.
      kernels::relu_forward(gpu, kernels::ReluArgs<float>{.n = n, .x = d_x.get() + offset, .y = d_x.get() + offset});
      REQUIRE(same_bits(d_x.download().data() + offset, cpu_y.data(), n));
      kernels::relu_backward(
          gpu, kernels::ReluArgs<float>{
                   .n = n, .y = d_x.get() + offset, .dy = d_dy.get() + offset, .dx = d_dy.get() + offset});
      REQUIRE(same_bits(d_dy.download().data() + offset, cpu_dx.data(), n));
    }
}

}  // namespace
}  // namespace nt::test
