// CPU tests of ReLU (kernels/activation.h): relu_forward and relu_backward, out of place and in place, on one
// thread and on a pool, against the exact fp32 formula bit for bit (the op is specified to the bit); NaN stays
// NaN in the forward pass and infinite gradients are masked.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/activation.h"
#include "kernels/cpu/thread_pool.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

// ---- ReLU -------------------------------------------------------------------------------------------------

TEST_CASE("relu_forward and relu_backward, out of place and in place", "[cpu][relu]") {
  CpuExecs execs;
  const size_t sizes[] = {1, 7, 1000, 300001};  // the last spans several parallel chunks
  for (size_t n : sizes)
    for (const Exec* exec : {&execs.serial, &execs.pooled}) {
      INFO("n=" << n);
      std::vector<float> x = random_floats(n, -1, 1);
      x[0] = 0.f;  // the boundary: relu(0) = 0 and its mask is 0
      std::vector<float> dy = random_floats(n, -1, 1);
      std::vector<float> y_want(n), dx_want(n);
      for (size_t i = 0; i < n; ++i) {
        y_want[i] = x[i] > 0.f ? x[i] : 0.f;
        dx_want[i] = x[i] > 0.f ? dy[i] : 0.f;
      }

      std::vector<float> y = poisoned(n);
      kernels::relu_forward(*exec, kernels::ReluArgs<float>{.n = n, .x = x.data(), .y = y.data()});
      REQUIRE(same_bits(y, y_want));
      std::vector<float> dx = poisoned(n);
      kernels::relu_backward(*exec, kernels::ReluArgs<float>{.n = n, .y = y.data(), .dy = dy.data(), .dx = dx.data()});
      REQUIRE(same_bits(dx, dx_want));

      std::vector<float> inplace = x;
      kernels::relu_forward(*exec, kernels::ReluArgs<float>{.n = n, .x = inplace.data(), .y = inplace.data()});
      REQUIRE(same_bits(inplace, y_want));
      std::vector<float> grad = dy;
      kernels::relu_backward(*exec,
                             kernels::ReluArgs<float>{.n = n, .y = y.data(), .dy = grad.data(), .dx = grad.data()});
      REQUIRE(same_bits(grad, dx_want));
    }
}

TEST_CASE("relu keeps NaN in the forward pass and masks infinite gradients", "[cpu][relu]") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {kNaN, -inf, inf, -2.f, 3.f};
  std::vector<float> y = poisoned(x.size());
  kernels::relu_forward(Exec{}, kernels::ReluArgs<float>{.n = x.size(), .x = x.data(), .y = y.data()});
  REQUIRE(std::isnan(y[0]));
  REQUIRE(y[1] == 0.f);
  REQUIRE(y[2] == inf);
  REQUIRE(y[3] == 0.f);
  REQUIRE(y[4] == 3.f);

  std::vector<float> yb = {0.f, -1.f, 2.f};
  std::vector<float> dy = {inf, -inf, 5.f};
  std::vector<float> dx = poisoned(3);
  kernels::relu_backward(Exec{}, kernels::ReluArgs<float>{.n = 3, .y = yb.data(), .dy = dy.data(), .dx = dx.data()});
  REQUIRE(dx == std::vector<float>{0.f, 0.f, 5.f});
}

}  // namespace
}  // namespace nt::test
