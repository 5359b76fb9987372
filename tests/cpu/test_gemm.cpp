// CPU GEMM (kernels/gemm.h) against a naive double-precision reference: shapes from 1x1x1 to
// 1000x784x320, all four transpose combinations, every epilogue, padded leading dimensions, row sums,
// K == 0, empty outputs; plus bit-reproducibility across thread counts and the exact zeros of relu_mask.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/gemm.h"
#include "test_support.h"

namespace {

using nt::kernels::Epilogue;
using nt::kernels::Exec;
using nt::kernels::GemmDesc;
using nt::kernels::ThreadPool;
using nt::test::random_floats;

constexpr Epilogue kEpilogues[] = {Epilogue::none, Epilogue::bias, Epilogue::bias_relu, Epilogue::relu_mask};

// fp32_dot(K) judges errors against the largest expected value; an output of a few elements can cancel
// to near 0, so the scale is floored at the RMS of a K-term dot of U(-1,1) inputs, sqrt(K·1/3·1/3).
nt::test::Tolerance gemm_tolerance(int K) {
  auto tol = nt::test::fp32_dot(K);
  tol.abs_tol = tol.rel_tol * std::sqrt(K / 9.0);
  tol.reason = "fp32 dot of length K: 8*sqrt(K)*eps of max(result scale, RMS of a random K-term dot)";
  return tol;
}

// Stores the logical (rows, cols) matrix row-major with leading dimension ld, transposed when asked;
// the padding is NaN, so a kernel that reads it produces NaN.
std::vector<float> store_matrix(const std::vector<float>& logical, int rows, int cols, bool transpose, int ld) {
  const int stored_rows = transpose ? cols : rows;
  std::vector<float> out(static_cast<size_t>(std::max(stored_rows, 1)) * ld, nt::test::kPoison);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      out[transpose ? size_t(c) * ld + r : size_t(r) * ld + c] = logical[size_t(r) * cols + c];
  return out;
}

// op(A)·op(B) in double from the logical matrices a (M,K) and b (K,N).
std::vector<double> reference_product(const std::vector<float>& a, const std::vector<float>& b, int M, int N, int K) {
  std::vector<double> c(size_t(M) * N, 0.0);
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k) {
      const double amk = a[size_t(m) * K + k];
      for (int n = 0; n < N; ++n) c[size_t(m) * N + n] += amk * double(b[size_t(k) * N + n]);
    }
  return c;
}

double reference_epilogue(Epilogue e, double v, float bias, float mask) {
  switch (e) {
    case Epilogue::none:
      return v;
    case Epilogue::bias:
      return v + bias;
    case Epilogue::bias_relu:
      return std::max(v + bias, 0.0);
    case Epilogue::relu_mask:
      return mask > 0.f ? v : 0.0;
  }
  return v;
}

// One GEMM call's buffers and descriptor, built from logical op(A) (M,K) and op(B) (K,N).
struct GemmCase {
  std::vector<float> A, B, C, bias, mask, sums;
  GemmDesc d;

  GemmCase(const std::vector<float>& a, const std::vector<float>& b, int M, int N, int K, bool trans_a, bool trans_b,
           int pad_a, int pad_b, int pad_c, Epilogue e, bool row_sums) {
    d.M = M, d.N = N, d.K = K, d.trans_a = trans_a, d.trans_b = trans_b, d.epilogue = e;
    d.lda = (trans_a ? M : K) + pad_a;
    d.ldb = (trans_b ? K : N) + pad_b;
    d.ldc = N + pad_c;
    A = store_matrix(a, M, K, trans_a, d.lda);
    B = store_matrix(b, K, N, trans_b, d.ldb);
    C = nt::test::poisoned(size_t(std::max(M, 1)) * d.ldc);
    bias = random_floats(N);
    mask = random_floats(size_t(std::max(M, 1)) * d.ldc);  // about half <= 0
    sums = nt::test::poisoned(M);
    d.A = A.data(), d.B = B.data(), d.C = C.data(), d.bias = bias.data(), d.mask = mask.data();
    d.a_row_sums = row_sums ? sums.data() : nullptr;
  }

  std::vector<float> output() const {  // the (M, N) part of C
    std::vector<float> out(size_t(d.M) * d.N);
    for (int m = 0; m < d.M; ++m)
      for (int n = 0; n < d.N; ++n) out[size_t(m) * d.N + n] = C[size_t(m) * d.ldc + n];
    return out;
  }
  bool padding_untouched() const {  // columns N..ldc of C are never written
    for (int m = 0; m < d.M; ++m)
      for (int n = d.N; n < d.ldc; ++n)
        if (!std::isnan(C[size_t(m) * d.ldc + n])) return false;
    return true;
  }
};

Exec cpu_exec(ThreadPool* pool) {
  Exec exec;
  exec.pool = pool;
  return exec;
}

ThreadPool& two_threads() {
  static ThreadPool pool(2);
  return pool;
}

struct Shape {
  int M, N, K;
};

}  // namespace

TEST_CASE("gemm matches a double reference over shapes, transposes, epilogues, leading dims", "[cpu][gemm]") {
  // A sample of the shape cube: edges around the tile sizes (1, 7, 10, 33, 64, 65, 128), the MLP's
  // training shapes (forward, weight and input gradients) and sizes with several K-blocks.
  const Shape shapes[] = {
      {1, 1, 1},      {1, 1, 7},      {7, 1, 1},      {1, 7, 10},      {10, 7, 1},      {7, 10, 33},
      {33, 65, 7},    {64, 64, 64},   {65, 33, 128},  {128, 65, 33},   {1, 320, 784},   {784, 1, 10},
      {64, 320, 784}, {64, 160, 320}, {64, 10, 160},  {10, 160, 64},   {64, 160, 10},   {160, 320, 64},
      {64, 320, 160}, {320, 784, 64}, {33, 1000, 65}, {1000, 33, 160}, {257, 129, 513}, {1000, 784, 320},
  };
  const Exec exec = cpu_exec(&two_threads());
  for (const Shape& s : shapes) {
    DYNAMIC_SECTION("M=" << s.M << " N=" << s.N << " K=" << s.K) {
      const auto a = random_floats(size_t(s.M) * s.K), b = random_floats(size_t(s.K) * s.N);
      const auto product = reference_product(a, b, s.M, s.N, s.K);
      std::vector<double> want_sums(s.M, 0.0);
      for (int m = 0; m < s.M; ++m)
        for (int k = 0; k < s.K; ++k) want_sums[m] += a[size_t(m) * s.K + k];
      const auto tol = gemm_tolerance(s.K);

      for (int trans = 0; trans < 4; ++trans) {
        for (int e = 0; e < 4; ++e) {
          const bool trans_a = trans & 1, trans_b = trans & 2, row_sums = e % 2 == 0;
          const int pad_a = trans_a ? 0 : 5, pad_b = trans_b ? 3 : 0, pad_c = e % 2 ? 2 : 0;
          INFO("trans_a=" << trans_a << " trans_b=" << trans_b << " epilogue=" << e << " pads=" << pad_a << "," << pad_b
                          << "," << pad_c);
          GemmCase c(a, b, s.M, s.N, s.K, trans_a, trans_b, pad_a, pad_b, pad_c, kEpilogues[e], row_sums);
          nt::kernels::gemm(exec, c.d);

          std::vector<double> want(product.size());
          for (int m = 0; m < s.M; ++m)
            for (int n = 0; n < s.N; ++n)
              want[size_t(m) * s.N + n] = reference_epilogue(kEpilogues[e], product[size_t(m) * s.N + n], c.bias[n],
                                                             c.mask[size_t(m) * c.d.ldc + n]);
          NT_REQUIRE_CLOSE(c.output(), want, tol);
          REQUIRE(c.padding_untouched());
          if (row_sums) NT_REQUIRE_CLOSE(c.sums, want_sums, gemm_tolerance(s.K));
        }
      }
    }
  }
}

TEST_CASE("gemm with K == 0 writes epilogue(0) and zero row sums", "[cpu][gemm]") {
  const Exec exec = cpu_exec(&two_threads());
  const std::vector<float> none;
  const nt::test::Tolerance exact{0, 0, "no arithmetic but the epilogue's own: exact"};
  for (Epilogue e : kEpilogues) {
    for (int trans = 0; trans < 4; ++trans) {
      GemmCase c(none, none, 5, 7, 0, trans & 1, trans & 2, 0, 0, 3, e, true);
      c.d.A = nullptr, c.d.B = nullptr;  // nothing to read
      nt::kernels::gemm(exec, c.d);
      std::vector<double> want(5 * 7);
      for (int m = 0; m < 5; ++m)
        for (int n = 0; n < 7; ++n) want[m * 7 + n] = reference_epilogue(e, 0.0, c.bias[n], c.mask[m * c.d.ldc + n]);
      NT_REQUIRE_CLOSE(c.output(), want, exact);
      REQUIRE(c.padding_untouched());
      NT_REQUIRE_CLOSE(c.sums, std::vector<double>(5, 0.0), exact);
    }
  }
}

TEST_CASE("gemm with M == 0 or N == 0 writes no output but still the row sums", "[cpu][gemm]") {
  const Exec exec = cpu_exec(&two_threads());
  const auto a = random_floats(4 * 6);
  GemmCase empty_m({}, random_floats(6 * 3), 0, 3, 6, false, false, 0, 0, 0, Epilogue::bias_relu, true);
  nt::kernels::gemm(exec, empty_m.d);
  REQUIRE(std::isnan(empty_m.C[0]));

  GemmCase empty_n(a, {}, 4, 0, 6, false, true, 0, 0, 2, Epilogue::bias, true);
  nt::kernels::gemm(exec, empty_n.d);
  REQUIRE(empty_n.padding_untouched());  // all of C is padding here
  std::vector<double> want_sums(4, 0.0);
  for (int m = 0; m < 4; ++m)
    for (int k = 0; k < 6; ++k) want_sums[m] += a[m * 6 + k];
  NT_REQUIRE_CLOSE(empty_n.sums, want_sums, gemm_tolerance(6));  // row sums do not depend on N
}

TEST_CASE("gemm results are bit-identical with 1 and 2 threads", "[cpu][gemm]") {
  // Odd sizes: partial tiles on both sides, several K-blocks, and a shape too narrow to split over N alone.
  const Shape shapes[] = {{67, 333, 517}, {97, 45, 300}, {1000, 10, 70}, {131, 785, 65}};
  ThreadPool one(1);
  for (const Shape& s : shapes) {
    for (int trans = 0; trans < 4; ++trans) {
      INFO("M=" << s.M << " N=" << s.N << " K=" << s.K << " trans=" << trans);
      const auto a = random_floats(size_t(s.M) * s.K), b = random_floats(size_t(s.K) * s.N);
      GemmCase serial(a, b, s.M, s.N, s.K, trans & 1, trans & 2, 1, 2, 3, Epilogue::bias_relu, true);
      GemmCase parallel(a, b, s.M, s.N, s.K, trans & 1, trans & 2, 1, 2, 3, Epilogue::bias_relu, true);
      parallel.bias = serial.bias;
      parallel.d.bias = parallel.bias.data();
      nt::kernels::gemm(cpu_exec(&one), serial.d);
      nt::kernels::gemm(cpu_exec(&two_threads()), parallel.d);
      const auto x = serial.output(), y = parallel.output();
      REQUIRE(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
      REQUIRE(std::memcmp(serial.sums.data(), parallel.sums.data(), s.M * sizeof(float)) == 0);
      REQUIRE(std::isnan(x[0]) == false);  // not two equal poisons
    }
  }
}

TEST_CASE("gemm relu_mask zeroes exactly where mask <= 0 and passes the product elsewhere", "[cpu][gemm]") {
  const Exec exec = cpu_exec(&two_threads());
  const int M = 33, N = 200, K = 300;
  // Mask values at the boundary: zeros of both signs, tiny and huge values of both signs.
  const float special[] = {0.f, -0.f, 1e-40f, -1e-40f, 1e-30f, -1e-30f, INFINITY, -INFINITY, 2.f, -2.f};
  for (bool trans_b : {false, true}) {  // this shape computes C tiles for one, Cᵀ tiles for the other
    INFO("trans_b=" << trans_b);
    const auto a = random_floats(size_t(M) * K), b = random_floats(size_t(K) * N);
    GemmCase plain(a, b, M, N, K, false, trans_b, 0, 0, 1, Epilogue::none, false);
    GemmCase masked(a, b, M, N, K, false, trans_b, 0, 0, 1, Epilogue::relu_mask, false);
    for (size_t i = 0; i < masked.mask.size(); ++i) masked.mask[i] = special[i % std::size(special)];
    nt::kernels::gemm(exec, plain.d);
    nt::kernels::gemm(exec, masked.d);

    int zeroed = 0, passed = 0;
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        const size_t i = size_t(m) * masked.d.ldc + n;  // both cases have the same ldc
        const float got = masked.C[i], mask = masked.mask[i], product = plain.C[i];
        INFO("m=" << m << " n=" << n << " mask=" << mask << " got=" << got << " product=" << product);
        if (mask > 0.f) {
          REQUIRE(std::memcmp(&got, &product, sizeof(float)) == 0);
          ++passed;
        } else {
          REQUIRE(got == 0.f);
          ++zeroed;
        }
      }
    REQUIRE(zeroed > M * N / 4);  // both branches well exercised
    REQUIRE(passed > M * N / 4);
    REQUIRE(masked.padding_untouched());
  }
}
