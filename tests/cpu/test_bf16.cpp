// round_to_bf16 (kernels/bf16.h), the CPU twin of the GPU's cvt.rn.bf16.f32 that the BF16 convolution operands go
// through: ties to even, carries into the exponent, overflow to infinity, NaN kept NaN.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/bf16.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

uint32_t bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

TEST_CASE("round_to_bf16 rounds to the nearest bf16, ties to even", "[cpu][bf16]") {
  using kernels::round_to_bf16;
  const float ulp = std::ldexp(1.f, -7);  // bf16's spacing in [1, 2): 7 mantissa bits
  CHECK(round_to_bf16(1.f) == 1.f);
  CHECK(round_to_bf16(1.f + ulp / 2) == 1.f);                               // a tie: to the even neighbour 1
  CHECK(round_to_bf16(1.f + 3 * ulp / 2) == 1.f + 2 * ulp);                 // a tie: to the even neighbour 1 + 2 ulp
  CHECK(round_to_bf16(1.f + ulp / 2 + std::ldexp(1.f, -20)) == 1.f + ulp);  // past the tie: up
  CHECK(round_to_bf16(-(1.f + ulp / 2)) == -1.f);                           // the sign does not matter
  CHECK(round_to_bf16(2.f - ulp / 4) == 2.f);                               // a carry into the exponent
  CHECK(std::isinf(round_to_bf16(std::numeric_limits<float>::max())));      // above bf16's largest: infinity
  CHECK(round_to_bf16(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  float low_payload_nan;  // a NaN whose payload lies in the dropped bits only: it must not become infinity
  const uint32_t u = 0x7f800001u;
  std::memcpy(&low_payload_nan, &u, sizeof u);
  CHECK(std::isnan(round_to_bf16(low_payload_nan)));
  CHECK(round_to_bf16(0.f) == 0.f);
  CHECK(std::signbit(round_to_bf16(-0.f)));
}

TEST_CASE("round_to_bf16 gives a bf16 value within half a spacing, the nearer of its two neighbours", "[cpu][bf16]") {
  for (const float v : random_floats(20000, -1e4f, 1e4f)) {
    const float r = kernels::round_to_bf16(v);
    REQUIRE((bits(r) & 0xffffu) == 0u);  // a bf16 value widened back to fp32
    // Its neighbours: v truncated to bf16, and the next bf16 away from zero.
    float down, up;
    const uint32_t t = bits(v) & 0xffff0000u, next = t + 0x10000u;
    std::memcpy(&down, &t, sizeof down);
    std::memcpy(&up, &next, sizeof up);
    const double to_down = std::fabs(double(v) - down), to_up = std::fabs(double(up) - v);
    REQUIRE((r == down || r == up));
    if (to_down != to_up) REQUIRE(r == (to_down < to_up ? down : up));
  }
}

}  // namespace
}  // namespace nt::test
