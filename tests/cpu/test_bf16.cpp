// round_to_bf16 (kernels/bf16.h), the CPU twin of the GPU's cvt.rn.bf16.f32 that the BF16 convolution operands go
// through: ties to even, carries into the exponent, overflow to infinity, NaN kept NaN. And the CPU ops' twin of the
// tensor cores' formats (kernels/operand.h): under Exec::math TF32 or BF16, a convolution or a GEMM gives the bits of
// the fp32 op on rounded operands, with the bias gradients of each mode.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/conv.h"
#include "kernels/gemm.h"
#include "kernels/operand.h"
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

TEST_CASE("the CPU convolution under TF32 or BF16 is the fp32 one on rounded operands", "[cpu][bf16][conv]") {
  using kernels::Math;
  const kernels::Conv2dShape s{3, 5, 9, 7, 6, 3, 3, 1, 1};
  const auto x = random_floats(s.x_size()), w = random_floats(s.w_size()), dy = random_floats(s.y_size());
  for (const Math math : {Math::tf32, Math::bf16}) {
    INFO(math_name(math));
    struct Out {
      std::vector<float> y, dx, dw, db;
    };
    auto run = [&](const kernels::Exec& exec, const std::vector<float>& xs, const std::vector<float>& ws,
                   const std::vector<float>& dys) {
      Out o{poisoned(s.y_size()), poisoned(s.x_size()), poisoned(s.w_size()), poisoned(size_t(s.k))};
      const kernels::Conv2dArgs<float> a{.shape = s,
                                         .x = xs.data(),
                                         .w = ws.data(),
                                         .y = o.y.data(),
                                         .dy = dys.data(),
                                         .dx = o.dx.data(),
                                         .dw = o.dw.data(),
                                         .dbias = o.db.data()};
      kernels::conv2d_forward(exec, a);
      kernels::conv2d_backward(exec, a);
      return o;
    };
    kernels::Exec twin;
    twin.math = math;
    const Out got = run(twin, x, w, dy);
    const Out want = run(kernels::Exec{}, kernels::rounded_operands(x, math), kernels::rounded_operands(w, math),
                         kernels::rounded_operands(dy, math));
    CHECK(same_bits(got.y, want.y));
    CHECK(same_bits(got.dx, want.dx));
    CHECK(same_bits(got.dw, want.dw));
    // dbias: the rounded dy under BF16, dy itself under TF32 (kernels/operand.h)
    const Out plain = run(kernels::Exec{}, x, w, dy);
    CHECK(same_bits(got.db, math == Math::bf16 ? want.db : plain.db));
    CHECK_FALSE(same_bits(got.y, plain.y));  // the rounding shows
  }
}

TEST_CASE("the CPU GEMM under BF16 is the fp32 one on rounded operands, and under TF32 stays fp32",
          "[cpu][bf16][gemm]") {
  using kernels::Math;
  const int M = 7, N = 13, K = 37;
  const auto a = random_floats(size_t(K) * M), b = random_floats(size_t(N) * K), bias = random_floats(size_t(N));
  auto run = [&](Math math, const std::vector<float>& as, const std::vector<float>& bs) {
    std::vector<float> c = poisoned(size_t(M) * N), sums = poisoned(size_t(M));
    kernels::GemmDesc d;  // op(A) = Aᵀ, op(B) = Bᵀ: both stored transposed, as a weight gradient's are
    d.M = M, d.N = N, d.K = K, d.trans_a = true, d.trans_b = true;
    d.A = as.data(), d.lda = M, d.B = bs.data(), d.ldb = K, d.C = c.data(), d.ldc = N;
    d.epilogue = kernels::Epilogue::bias_relu, d.bias = bias.data(), d.a_row_sums = sums.data();
    kernels::Exec exec;
    exec.math = math;
    kernels::gemm(exec, d);
    c.insert(c.end(), sums.begin(), sums.end());
    return c;
  };
  const auto rounded =
      run(Math::fp32, kernels::rounded_operands(a, Math::bf16), kernels::rounded_operands(b, Math::bf16));
  CHECK(same_bits(run(Math::bf16, a, b), rounded));
  CHECK(same_bits(run(Math::tf32, a, b), run(Math::fp32, a, b)));  // TF32 is the convolutions' only
  CHECK_FALSE(same_bits(rounded, run(Math::fp32, a, b)));
}

}  // namespace
}  // namespace nt::test
