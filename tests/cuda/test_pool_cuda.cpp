// CUDA tests of max pooling (kernels/pool.h) against the CPU twin: y, argmax and dx bit for bit (selects, and
// fixed-order sums from +0), on uniform inputs, ties and NaN (support/test_support.h, pool_input), outputs poisoned
// beforehand (NaN, or an impossible index) with a pad element after each, so that an unwritten element or a write
// past the end fails.
#include <cstdint>
#include <vector>

#include "kernels/pool.h"
#include "kernels/runtime.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

// ---- max pooling -----------------------------------------------------------------------------------------

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
      kernels::maxpool2d_forward(Exec{}, kernels::MaxPool2dArgs<float>{
                                             .shape = s, .x = x.data(), .y = cpu_y.data(), .argmax = cpu_arg.data()});
      kernels::maxpool2d_backward(
          Exec{},
          kernels::MaxPool2dArgs<float>{.shape = s, .argmax = cpu_arg.data(), .dy = dy.data(), .dx = cpu_dx.data()});

      DeviceBuffer<float> d_x(gpu, x), d_dy(gpu, padded(dy, 0, 0.f));
      DeviceBuffer<float> d_y(gpu, padded(poisoned(out), 0, 0.f)), d_dx(gpu, padded(poisoned(in), 0, 0.f));
      DeviceBuffer<int32_t> d_arg(gpu, padded(std::vector<int32_t>(out, -7), 0, int32_t{-9}));
      kernels::maxpool2d_forward(
          gpu, kernels::MaxPool2dArgs<float>{.shape = s, .x = d_x.get(), .y = d_y.get(), .argmax = d_arg.get()});
      kernels::maxpool2d_backward(
          gpu, kernels::MaxPool2dArgs<float>{.shape = s, .argmax = d_arg.get(), .dy = d_dy.get(), .dx = d_dx.get()});

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
