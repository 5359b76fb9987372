// CPU tests of dropout (kernels/dropout.h) against its definition: the mask statistics (within 4 standard
// deviations of 1 - p), exact scaling (one fp32 division: bit for bit), the backward through the mask, fresh draws
// every call, the same ones for the same (seed, counter), f64 drawing the f32 masks. The pooled run, and in place,
// must give the same bits as the serial one.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/dropout.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

// ---- dropout --------------------------------------------------------------------------------------------

float keep_probability(float p) { return 1.f - p; }

TEST_CASE("dropout keeps each element with probability 1 - p", "[cpu][dropout]") {
  const size_t n = 1000000;
  const std::vector<float> x = random_floats(n);
  for (float p : {0.1f, 0.25f, 0.5f, 0.9f}) {
    INFO("p=" << p);
    std::vector<float> y = poisoned(n);
    std::vector<uint8_t> mask(n, 7);
    uint64_t counter[2] = {0, 0};
    kernels::dropout_forward(
        Exec{},
        kernels::DropoutArgs<float>{
            .n = n, .p = p, .seed = 1234, .counter = counter, .x = x.data(), .y = y.data(), .mask = mask.data()});
    size_t kept = 0;
    for (uint8_t b : mask) {
      REQUIRE(b <= 1);
      kept += b;
    }
    const double q = 1.0 - p, sigma = std::sqrt(q * (1 - q) / double(n));
    INFO("kept fraction " << double(kept) / n << ", want " << q << " +- 4 sigma = " << 4 * sigma);
    REQUIRE(std::abs(double(kept) / n - q) <= 4 * sigma);
    // No structure along i: the first and second halves keep the same fraction (4 sigma of a half).
    size_t kept_first = 0;
    for (size_t i = 0; i < n / 2; ++i) kept_first += mask[i];
    REQUIRE(std::abs(double(kept_first) / (n / 2) - double(kept - kept_first) / (n - n / 2)) <=
            4 * std::sqrt(2 * q * (1 - q) / double(n / 2)));
  }
}

TEST_CASE("dropout scales exactly, follows its hash, and the backward uses the mask", "[cpu][dropout]") {
  CpuExecs execs;
  const float inf = std::numeric_limits<float>::infinity();
  for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(200003)})
    for (float p : {0.f, 0.2f, 0.5f, 0.75f}) {
      INFO("n=" << n << " p=" << p);
      std::vector<float> x = random_floats(n, -3.f, 3.f), dy = random_floats(n);
      if (n >= 7) {
        x[3] = inf;
        x[5] = kNaN;
      }
      const float keep_p = keep_probability(p);
      uint64_t counter[2] = {41, 0};
      std::vector<float> y = poisoned(n), dx = poisoned(n);
      std::vector<uint8_t> mask(n, 7);
      kernels::dropout_forward(
          execs.serial,
          kernels::DropoutArgs<float>{
              .n = n, .p = p, .seed = 99, .counter = counter, .x = x.data(), .y = y.data(), .mask = mask.data()});
      REQUIRE(counter[0] == 42);
      REQUIRE(counter[1] == 0);
      kernels::dropout_backward(
          execs.serial,
          kernels::DropoutArgs<float>{.n = n, .p = p, .mask = mask.data(), .dy = dy.data(), .dx = dx.data()});
      // The first element that breaks the definition, or n.
      size_t bad = n;
      for (size_t i = 0; i < n && bad == n; ++i) {
        const bool keep = kernels::dropout_uniform(99, 41, i) >= p;
        const float want_y = keep ? x[i] / keep_p : x[i] * 0.f;  // one division; 0 * inf and NaN stay NaN
        const float want_dx = keep ? dy[i] / keep_p : dy[i] * 0.f;
        const bool ok = mask[i] == (keep ? 1 : 0) && std::memcmp(&y[i], &want_y, sizeof(float)) == 0 &&
                        std::memcmp(&dx[i], &want_dx, sizeof(float)) == 0 &&
                        (p != 0.f || std::memcmp(&y[i], &x[i], sizeof(float)) == 0) &&  // p = 0: identity
                        (keep || y[i] == 0.f || std::isnan(x[i]) || std::isinf(x[i]));
        if (!ok) bad = i;
      }
      INFO("first element off the definition: " << bad);
      REQUIRE(bad == n);
      if (p == 0.f) REQUIRE(std::all_of(mask.begin(), mask.end(), [](uint8_t b) { return b == 1; }));

      // On the pool: the same bits; in place (y over x, dx over dy) too.
      uint64_t counter2[2] = {41, 0};
      std::vector<float> y2 = x, dx2 = dy;
      std::vector<uint8_t> mask2(n, 7);
      kernels::dropout_forward(
          execs.pooled,
          kernels::DropoutArgs<float>{
              .n = n, .p = p, .seed = 99, .counter = counter2, .x = y2.data(), .y = y2.data(), .mask = mask2.data()});
      kernels::dropout_backward(
          execs.pooled,
          kernels::DropoutArgs<float>{.n = n, .p = p, .mask = mask2.data(), .dy = dx2.data(), .dx = dx2.data()});
      REQUIRE(counter2[0] == 42);
      REQUIRE(mask2 == mask);
      REQUIRE(same_bits(y2, y));
      REQUIRE(same_bits(dx2, dx));
    }
}

TEST_CASE("dropout draws a fresh mask every call, the same one for the same seed and counter", "[cpu][dropout]") {
  const size_t n = 100000;
  const float p = 0.5f;
  const std::vector<float> x = random_floats(n);
  std::vector<float> y(n);
  auto draw = [&](uint64_t seed, uint64_t* counter) {
    std::vector<uint8_t> mask(n);
    kernels::dropout_forward(
        Exec{},
        kernels::DropoutArgs<float>{
            .n = n, .p = p, .seed = seed, .counter = counter, .x = x.data(), .y = y.data(), .mask = mask.data()});
    return mask;
  };
  auto agreement = [&](const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
    size_t same = 0;
    for (size_t i = 0; i < n; ++i) same += a[i] == b[i];
    return double(same) / n;
  };
  uint64_t counter[2] = {0, 0};
  const auto first = draw(7, counter), second = draw(7, counter), third = draw(7, counter);
  REQUIRE(counter[0] == 3);
  // Independent masks with p = 1/2 agree on half of the elements: 0.5 +- 4 sigma (sigma = 0.5/sqrt(n)).
  const double band = 4 * 0.5 / std::sqrt(double(n));
  REQUIRE(std::abs(agreement(first, second) - 0.5) <= band);
  REQUIRE(std::abs(agreement(second, third) - 0.5) <= band);

  uint64_t again[2] = {0, 0};  // same seed, counter reset: the same masks in the same order
  REQUIRE(draw(7, again) == first);
  REQUIRE(draw(7, again) == second);
  uint64_t jump[2] = {2, 0};
  REQUIRE(draw(7, jump) == third);
  uint64_t other_seed[2] = {0, 0};
  REQUIRE(std::abs(agreement(draw(8, other_seed), first) - 0.5) <= band);

  // p == 0 and n == 0 still advance the counter.
  std::vector<uint8_t> mask(n);
  kernels::dropout_forward(
      Exec{}, kernels::DropoutArgs<float>{
                  .n = n, .p = 0.f, .seed = 7, .counter = counter, .x = x.data(), .y = y.data(), .mask = mask.data()});
  kernels::dropout_forward(
      Exec{}, kernels::DropoutArgs<float>{
                  .n = 0, .p = p, .seed = 7, .counter = counter, .x = x.data(), .y = y.data(), .mask = mask.data()});
  REQUIRE(counter[0] == 5);
}

TEST_CASE("dropout in f64 draws the f32 masks and divides in double", "[cpu][dropout]") {
  const size_t n = 5000;
  const float p = 0.3f;
  const std::vector<float> xf = random_floats(n);
  const std::vector<double> x(xf.begin(), xf.end());
  std::vector<float> yf(n);
  std::vector<double> y(n), dy(n, 1.0), dx(n);
  std::vector<uint8_t> mf(n), md(n);
  uint64_t cf[2] = {3, 0}, cd[2] = {3, 0};
  kernels::dropout_forward(
      Exec{}, kernels::DropoutArgs<float>{
                  .n = n, .p = p, .seed = 5, .counter = cf, .x = xf.data(), .y = yf.data(), .mask = mf.data()});
  kernels::dropout_forward(
      Exec{}, kernels::DropoutArgs<double>{
                  .n = n, .p = p, .seed = 5, .counter = cd, .x = x.data(), .y = y.data(), .mask = md.data()});
  REQUIRE(md == mf);
  REQUIRE(cd[0] == 4);
  kernels::dropout_backward(
      Exec{}, kernels::DropoutArgs<double>{.n = n, .p = p, .mask = md.data(), .dy = dy.data(), .dx = dx.data()});
  const double keep_p = 1.0 - double(p);
  for (size_t i = 0; i < n; ++i) {
    REQUIRE(y[i] == (md[i] ? x[i] / keep_p : 0.0));
    REQUIRE(dx[i] == (md[i] ? 1.0 / keep_p : 0.0));
  }
}

}  // namespace
}  // namespace nt::test
