// CUDA tests of the non-finite count (kernels/nonfinite.h) against the CPU twin: an integer count, exact whatever
// the order, added to the count already there; NaN and both infinities count, the largest finite float and
// denormals do not. (The CPU op's own test is in tests/cpu/test_divergence.cpp.)
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/nonfinite.h"
#include "kernels/runtime.h"
#include "support/test_support.h"

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
