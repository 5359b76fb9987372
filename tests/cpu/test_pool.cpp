// CPU tests of max pooling (kernels/pool.h) against a naive loop (forward: the first strict maximum of the window,
// its last NaN if it holds one, as PyTorch) and a naive scatter (backward: the same additions in the same order),
// bit for bit in fp32, and the same bits on a pool; f64 takes the same choices, its dx within 16 eps of the fp32
// scatter (at most 9 fp32 sums of |dy| <= 1). Uniform inputs, ties and NaN (support/test_support.h, pool_input).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/pool.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

// ---- max pooling -----------------------------------------------------------------------------------------

struct PoolReference {
  std::vector<double> y;
  std::vector<int32_t> argmax;
};

// The definition, written plainly: the first strict maximum of the row-major window, unless the window
// holds NaN, in which case its last NaN (PyTorch replaces the running maximum by every NaN it meets).
PoolReference pool_reference(const kernels::Pool2dShape& s, const std::vector<float>& x) {
  const int P = s.p(), Q = s.q();
  PoolReference r;
  for (int plane = 0; plane < s.n * s.c; ++plane)
    for (int i = 0; i < P; ++i)
      for (int j = 0; j < Q; ++j) {
        int best = -1, last_nan = -1;
        for (int a = 0; a < s.window; ++a)
          for (int b = 0; b < s.window; ++b) {
            const int idx = (i * s.stride + a) * s.w + (j * s.stride + b);
            const float v = x[size_t(plane) * s.h * s.w + idx];
            if (std::isnan(v))
              last_nan = idx;
            else if (best < 0 || v > x[size_t(plane) * s.h * s.w + best])
              best = idx;
          }
        const int arg = last_nan >= 0 ? last_nan : best;
        r.argmax.push_back(arg);
        r.y.push_back(x[size_t(plane) * s.h * s.w + arg]);
      }
  return r;
}

// The backward as PyTorch's CPU kernel writes it: zero dx, then scatter dy into dx at each argmax, in
// the order of the output elements.
std::vector<float> pool_backward_reference(const kernels::Pool2dShape& s, const std::vector<float>& dy,
                                           const std::vector<int32_t>& argmax) {
  std::vector<float> dx(size_t(s.n) * s.c * s.h * s.w, 0.f);
  const size_t PQ = size_t(s.p()) * s.q();
  for (size_t plane = 0; plane < size_t(s.n) * s.c; ++plane)
    for (size_t o = 0; o < PQ; ++o) dx[plane * s.h * s.w + argmax[plane * PQ + o]] += dy[plane * PQ + o];
  return dx;
}

TEST_CASE("maxpool2d matches the naive loops", "[cpu][maxpool]") {
  CpuExecs execs;
  struct Case {
    int n, c, h, w, window, stride;
  };
  const Case cases[] = {{2, 3, 8, 8, 2, 2}, {3, 5, 7, 9, 2, 2},   {3, 5, 7, 9, 3, 2}, {3, 5, 7, 9, 3, 3},
                        {2, 2, 9, 7, 3, 1}, {1, 1, 5, 5, 2, 3},   {1, 1, 1, 1, 1, 1}, {4, 8, 28, 28, 2, 2},
                        {1, 2, 2, 5, 3, 2}, {64, 4, 14, 14, 2, 2}};
  for (const Case& k : cases)
    for (PoolInput kind : {PoolInput::uniform, PoolInput::ties, PoolInput::nan}) {
      const kernels::Pool2dShape s{k.n, k.c, k.h, k.w, k.window, k.stride};
      INFO("N=" << k.n << " C=" << k.c << " H=" << k.h << " W=" << k.w << " window " << k.window << " stride "
                << k.stride << " input " << int(kind));
      const size_t in = size_t(k.n) * k.c * k.h * k.w, out = size_t(k.n) * k.c * s.p() * s.q();
      const std::vector<float> x = pool_input(in, kind), dy = random_floats(out);
      const PoolReference ref = pool_reference(s, x);

      std::vector<float> y = poisoned(out), dx = poisoned(in);
      std::vector<int32_t> argmax(out, -7);
      kernels::maxpool2d_forward(execs.serial, kernels::MaxPool2dArgs<float>{
                                                   .shape = s, .x = x.data(), .y = y.data(), .argmax = argmax.data()});
      REQUIRE(argmax == ref.argmax);
      for (size_t o = 0; o < out; ++o) {
        if (std::isnan(ref.y[o]))
          REQUIRE(std::isnan(y[o]));
        else
          REQUIRE(y[o] == ref.y[o]);
      }
      kernels::maxpool2d_backward(
          execs.serial,
          kernels::MaxPool2dArgs<float>{.shape = s, .argmax = argmax.data(), .dy = dy.data(), .dx = dx.data()});
      REQUIRE(same_bits(dx, pool_backward_reference(s, dy, argmax)));  // same additions, same order

      std::vector<float> y2 = poisoned(out), dx2 = poisoned(in);
      std::vector<int32_t> argmax2(out, -7);
      kernels::maxpool2d_forward(
          execs.pooled,
          kernels::MaxPool2dArgs<float>{.shape = s, .x = x.data(), .y = y2.data(), .argmax = argmax2.data()});
      kernels::maxpool2d_backward(
          execs.pooled,
          kernels::MaxPool2dArgs<float>{.shape = s, .argmax = argmax2.data(), .dy = dy.data(), .dx = dx2.data()});
      REQUIRE(same_bits(y2, y));
      REQUIRE(argmax2 == argmax);
      REQUIRE(same_bits(dx2, dx));

      // f64: the same choices, values exact.
      const std::vector<double> xd(x.begin(), x.end()), dyd(dy.begin(), dy.end());
      std::vector<double> yd(out), dxd(in);
      std::vector<int32_t> argmaxd(out, -7);
      kernels::maxpool2d_forward(
          execs.serial,
          kernels::MaxPool2dArgs<double>{.shape = s, .x = xd.data(), .y = yd.data(), .argmax = argmaxd.data()});
      kernels::maxpool2d_backward(
          execs.serial,
          kernels::MaxPool2dArgs<double>{.shape = s, .argmax = argmaxd.data(), .dy = dyd.data(), .dx = dxd.data()});
      REQUIRE(argmaxd == argmax);
      const auto dx_ref = pool_backward_reference(s, dy, argmax);
      for (size_t e = 0; e < in; ++e)
        REQUIRE(std::abs(dxd[e] - double(dx_ref[e])) <= 16 * kEps);  // <= 9 fp32 sums of |dy| <= 1
    }
}

TEST_CASE("maxpool2d ties pick the first maximum and NaN propagates, as PyTorch", "[cpu][maxpool]") {
  const kernels::Pool2dShape s{1, 1, 4, 4, 2, 2};
  // Window (0,0): all equal -> index 0. Window (0,1): max 3 at (0,3) and (1,2) -> (0,3) = 3.
  // Window (1,0): a NaN at (3,1) -> chosen. Window (1,1): -inf everywhere -> index (2,2) = 10, y = -inf.
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1, 1,    2,    3,     //
                                1, 1,    3,    0,     //
                                5, 9,    -inf, -inf,  //
                                0, kNaN, -inf, -inf};
  std::vector<float> y = poisoned(4);
  std::vector<int32_t> argmax(4, -7);
  kernels::maxpool2d_forward(
      Exec{}, kernels::MaxPool2dArgs<float>{.shape = s, .x = x.data(), .y = y.data(), .argmax = argmax.data()});
  REQUIRE(argmax == std::vector<int32_t>{0, 3, 13, 10});
  REQUIRE(y[0] == 1.f);
  REQUIRE(y[1] == 3.f);
  REQUIRE(std::isnan(y[2]));
  REQUIRE(y[3] == -inf);

  // Backward: each window's gradient lands on its choice; every other element gets exactly 0.
  const std::vector<float> dy = {0.5f, -2.f, 4.f, 8.f};
  std::vector<float> dx = poisoned(16);
  kernels::maxpool2d_backward(
      Exec{}, kernels::MaxPool2dArgs<float>{.shape = s, .argmax = argmax.data(), .dy = dy.data(), .dx = dx.data()});
  for (int e = 0; e < 16; ++e) {
    const float want = e == 0 ? 0.5f : e == 3 ? -2.f : e == 13 ? 4.f : e == 10 ? 8.f : 0.f;
    REQUIRE(dx[e] == want);
  }
}

TEST_CASE("maxpool2d backward sums overlapping windows that chose the same element", "[cpu][maxpool]") {
  // window 3, stride 1 over a plane with one large element in the middle: every window chooses it.
  const kernels::Pool2dShape s{1, 1, 5, 5, 3, 1};
  std::vector<float> x(25, 0.f);
  x[12] = 10.f;
  std::vector<float> y(9);
  std::vector<int32_t> argmax(9);
  kernels::maxpool2d_forward(
      Exec{}, kernels::MaxPool2dArgs<float>{.shape = s, .x = x.data(), .y = y.data(), .argmax = argmax.data()});
  REQUIRE(std::all_of(argmax.begin(), argmax.end(), [](int32_t a) { return a == 12; }));
  std::vector<float> dy(9);
  for (int o = 0; o < 9; ++o) dy[o] = float(o + 1);
  std::vector<float> dx = poisoned(25);
  kernels::maxpool2d_backward(
      Exec{}, kernels::MaxPool2dArgs<float>{.shape = s, .argmax = argmax.data(), .dy = dy.data(), .dx = dx.data()});
  for (int e = 0; e < 25; ++e) REQUIRE(dx[e] == (e == 12 ? 45.f : 0.f));
}

TEST_CASE("maxpool2d with a window larger than the plane writes no output and a zero gradient", "[cpu][maxpool]") {
  const kernels::Pool2dShape s{2, 3, 1, 5, 2, 2};
  REQUIRE(s.p() == 0);
  std::vector<float> dx = poisoned(30);
  kernels::maxpool2d_backward(Exec{}, kernels::MaxPool2dArgs<float>{.shape = s, .dx = dx.data()});
  REQUIRE(std::all_of(dx.begin(), dx.end(), [](float v) { return v == 0.f; }));
  const kernels::Pool2dShape cnn{64, 32, 28, 28, 2, 2};
  REQUIRE(cnn.p() == 14);
  REQUIRE(cnn.q() == 14);
  REQUIRE(kernels::Pool2dShape{1, 1, 7, 9, 3, 2}.p() == 3);
  REQUIRE(kernels::Pool2dShape{1, 1, 7, 9, 3, 2}.q() == 4);
}

}  // namespace
}  // namespace nt::test
