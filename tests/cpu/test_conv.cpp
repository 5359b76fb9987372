// CPU tests of the conv2d family (kernels/conv.h): the three passes in f32 and f64 against a direct
// convolution written from the definition in double, over strides 1-3, paddings 0-2, 1x1 / 3x3 / 5x5 and
// non-square kernels, odd sizes and rows longer than the CPU's column chunk; with and without bias; zero
// sizes; and bit-identical results on one thread and on a pool.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/conv.h"
#include "kernels/cpu/thread_pool.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Conv2dArgs;
using kernels::Conv2dShape;
using kernels::Exec;

// ---- the reference: the definition, in double -------------------------------------------------------------

struct Reference {
  std::vector<double> y, dx, dw, dbias;
};

// y from the gather form; dx and dw from the scatter form (every (n,k,p,q,c,r,s) product added to its
// place), so that the reference shares no index algebra with the op's loops.
Reference reference(const Conv2dShape& s, const std::vector<float>& x, const std::vector<float>& w,
                    const std::vector<float>* bias, const std::vector<float>& dy) {
  const int P = s.p(), Q = s.q();
  Reference ref;
  ref.y.assign(s.y_size(), 0.0);
  ref.dx.assign(s.x_size(), 0.0);
  ref.dw.assign(s.w_size(), 0.0);
  ref.dbias.assign(size_t(s.k), 0.0);
  auto X = [&](int n, int c, int h, int ww) { return size_t(((n * s.c + c) * s.h + h) * s.w + ww); };
  auto W = [&](int k, int c, int r, int t) { return size_t(((k * s.c + c) * s.r + r) * s.s + t); };
  auto Y = [&](int n, int k, int p, int q) { return size_t(((n * s.k + k) * P + p) * Q + q); };
  for (int n = 0; n < s.n; ++n)
    for (int k = 0; k < s.k; ++k)
      for (int p = 0; p < P; ++p)
        for (int q = 0; q < Q; ++q) {
          double acc = bias ? double((*bias)[k]) : 0.0;
          const double g = dy[Y(n, k, p, q)];
          ref.dbias[k] += g;
          for (int c = 0; c < s.c; ++c)
            for (int r = 0; r < s.r; ++r)
              for (int t = 0; t < s.s; ++t) {
                const int h = p * s.stride - s.pad + r, ww = q * s.stride - s.pad + t;
                if (h < 0 || h >= s.h || ww < 0 || ww >= s.w) continue;
                acc += double(x[X(n, c, h, ww)]) * double(w[W(k, c, r, t)]);
                ref.dx[X(n, c, h, ww)] += g * double(w[W(k, c, r, t)]);
                ref.dw[W(k, c, r, t)] += g * double(x[X(n, c, h, ww)]);
              }
          ref.y[Y(n, k, p, q)] = acc;
        }
  return ref;
}

// f64 results against the reference: the op sums the same products in double in another order.
void require_close_f64(const std::vector<double>& got, const std::vector<double>& want, int terms) {
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  const double allowed = 1e-300 + 8.0 * std::sqrt(double(std::max(terms, 1))) * std::ldexp(1.0, -52) * scale;
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i] << ", allowed " << allowed);
    REQUIRE(std::abs(got[i] - want[i]) <= allowed);  // NaN fails
  }
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// Runs the three passes in f32 and f64 and checks each against the reference.
void check_shape(const Exec& exec, const Conv2dShape& s, bool with_bias) {
  INFO("n=" << s.n << " c=" << s.c << " h=" << s.h << " w=" << s.w << " k=" << s.k << " r=" << s.r << " s=" << s.s
            << " stride=" << s.stride << " pad=" << s.pad << " bias=" << with_bias);
  const auto x = random_floats(s.x_size()), w = random_floats(s.w_size()), bias = random_floats(size_t(s.k));
  const auto dy = random_floats(s.y_size());
  const Reference ref = reference(s, x, w, with_bias ? &bias : nullptr, dy);
  const int k_fwd = s.c * s.r * s.s, k_data = s.k * s.r * s.s, k_weight = s.n * s.p() * s.q();

  auto y = poisoned(s.y_size()), dx = poisoned(s.x_size()), dw = poisoned(s.w_size()), db = poisoned(size_t(s.k));
  const Conv2dArgs<float> f32{.shape = s,
                              .x = x.data(),
                              .w = w.data(),
                              .bias = with_bias ? bias.data() : nullptr,
                              .y = y.data(),
                              .dy = dy.data(),
                              .dx = dx.data(),
                              .dw = dw.data(),
                              .dbias = with_bias ? db.data() : nullptr};
  kernels::conv2d_forward(exec, f32);
  kernels::conv2d_backward_data(exec, f32);
  kernels::conv2d_backward_weight(exec, f32);
  NT_REQUIRE_CLOSE(y, ref.y, fp32_dot(k_fwd));
  NT_REQUIRE_CLOSE(dx, ref.dx, fp32_dot(k_data));
  NT_REQUIRE_CLOSE(dw, ref.dw, fp32_dot(k_weight));
  if (with_bias) NT_REQUIRE_CLOSE(db, ref.dbias, fp32_dot(k_weight));

  const auto xd = to_double(x), wd = to_double(w), bd = to_double(bias), dyd = to_double(dy);
  const double nan = std::nan("");
  std::vector<double> y64(s.y_size(), nan), dx64(s.x_size(), nan), dw64(s.w_size(), nan), db64(size_t(s.k), nan);
  const Conv2dArgs<double> f64{.shape = s,
                               .x = xd.data(),
                               .w = wd.data(),
                               .bias = with_bias ? bd.data() : nullptr,
                               .y = y64.data(),
                               .dy = dyd.data(),
                               .dx = dx64.data(),
                               .dw = dw64.data(),
                               .dbias = with_bias ? db64.data() : nullptr};
  kernels::conv2d_forward(exec, f64);
  kernels::conv2d_backward_data(exec, f64);
  kernels::conv2d_backward_weight(exec, f64);
  require_close_f64(y64, ref.y, k_fwd);
  require_close_f64(dx64, ref.dx, k_data);
  require_close_f64(dw64, ref.dw, k_weight);
  if (with_bias) require_close_f64(db64, ref.dbias, k_weight);
}

const std::vector<Conv2dShape>& shapes() {
  static const std::vector<Conv2dShape> all = {
      Conv2dShape{3, 5, 7, 9, 6, 3, 3, 1, 1},  // odd sizes, 3x3 same padding
      Conv2dShape{3, 5, 7, 9, 6, 3, 3, 1, 0},  // valid
      Conv2dShape{3, 5, 7, 9, 6, 3, 3, 1, 2},  // pad larger than needed
      Conv2dShape{3, 5, 7, 9, 6, 3, 3, 2, 0},  // stride 2
      Conv2dShape{3, 5, 7, 9, 6, 3, 3, 2, 1},    Conv2dShape{3, 5, 8, 9, 6, 3, 3, 2, 2},
      Conv2dShape{2, 5, 7, 9, 6, 5, 5, 1, 2},                                             // 5x5
      Conv2dShape{2, 5, 9, 11, 6, 5, 5, 2, 1},   Conv2dShape{3, 5, 7, 9, 6, 1, 1, 1, 0},  // 1x1
      Conv2dShape{3, 5, 7, 9, 6, 1, 1, 2, 0},                                             // 1x1 stride 2 (skips pixels)
      Conv2dShape{2, 3, 6, 7, 4, 2, 3, 3, 1},                                             // non-square kernel, stride 3
      Conv2dShape{1, 2, 3, 150, 3, 3, 3, 1, 1},  // rows longer than the CPU's 64-column chunk
      Conv2dShape{2, 3, 2, 2, 5, 3, 3, 1, 2},    // image smaller than the kernel, padded
      Conv2dShape{2, 1, 28, 28, 8, 3, 3, 1, 1},  // the cnn's first conv (fewer channels)
      Conv2dShape{2, 9, 14, 14, 10, 3, 3, 1, 1},
  };
  return all;
}

TEST_CASE("conv2d matches the direct definition in f32 and f64", "[cpu][conv]") {
  Exec exec;
  for (const auto& s : shapes()) {
    check_shape(exec, s, false);
    check_shape(exec, s, true);
  }
}

TEST_CASE("conv2d runs on a pool with results identical to one thread", "[cpu][conv]") {
  kernels::ThreadPool pool(2);
  Exec serial, pooled;
  pooled.pool = &pool;
  for (const auto& s : {Conv2dShape{3, 5, 7, 9, 6, 3, 3, 1, 1}, Conv2dShape{2, 32, 14, 14, 64, 3, 3, 1, 1},
                        Conv2dShape{4, 1, 28, 28, 32, 3, 3, 1, 1}, Conv2dShape{3, 6, 9, 7, 5, 5, 5, 2, 2}}) {
    INFO("c=" << s.c << " k=" << s.k);
    const auto x = random_floats(s.x_size()), w = random_floats(s.w_size()), bias = random_floats(size_t(s.k));
    const auto dy = random_floats(s.y_size());
    std::vector<float> y[2], dx[2], dw[2], db[2];
    const Exec* execs[2] = {&serial, &pooled};
    for (int i = 0; i < 2; ++i) {
      y[i] = poisoned(s.y_size()), dx[i] = poisoned(s.x_size()), dw[i] = poisoned(s.w_size()),
      db[i] = poisoned(size_t(s.k));
      const Conv2dArgs<float> args{.shape = s,
                                   .x = x.data(),
                                   .w = w.data(),
                                   .bias = bias.data(),
                                   .y = y[i].data(),
                                   .dy = dy.data(),
                                   .dx = dx[i].data(),
                                   .dw = dw[i].data(),
                                   .dbias = db[i].data()};
      kernels::conv2d_forward(*execs[i], args);
      kernels::conv2d_backward_data(*execs[i], args);
      kernels::conv2d_backward_weight(*execs[i], args);
    }
    CHECK(same_bits(y[0], y[1]));
    CHECK(same_bits(dx[0], dx[1]));
    CHECK(same_bits(dw[0], dw[1]));
    CHECK(same_bits(db[0], db[1]));
    CHECK(std::none_of(y[1].begin(), y[1].end(), [](float v) { return std::isnan(v); }));
  }
}

TEST_CASE("conv2d with empty sums writes zeros (or the bias) and empty outputs touch nothing", "[cpu][conv]") {
  Exec exec;
  SECTION("no output pixels: dx = 0, dw = 0, dbias = 0, y untouched") {
    const auto s = Conv2dShape{2, 3, 2, 2, 4, 3, 3, 1, 0};  // P = Q = 0
    REQUIRE(s.p() == 0);
    const auto x = random_floats(s.x_size()), w = random_floats(s.w_size());
    auto dx = poisoned(s.x_size()), dw = poisoned(s.w_size()), db = poisoned(4);
    const Conv2dArgs<float> args{
        .shape = s, .x = x.data(), .w = w.data(), .dx = dx.data(), .dw = dw.data(), .dbias = db.data()};
    kernels::conv2d_forward(exec, args);
    kernels::conv2d_backward_data(exec, args);
    kernels::conv2d_backward_weight(exec, args);
    CHECK(std::all_of(dx.begin(), dx.end(), [](float v) { return v == 0.f; }));
    CHECK(std::all_of(dw.begin(), dw.end(), [](float v) { return v == 0.f; }));
    CHECK(std::all_of(db.begin(), db.end(), [](float v) { return v == 0.f; }));
  }
  SECTION("no input channels: y = bias, dbias still summed") {
    const auto s = Conv2dShape{2, 0, 4, 4, 3, 3, 3, 1, 1};
    const auto bias = random_floats(3), dy = random_floats(s.y_size());
    auto y = poisoned(s.y_size()), db = poisoned(3);
    const Conv2dArgs<float> args{.shape = s, .bias = bias.data(), .y = y.data(), .dy = dy.data(), .dbias = db.data()};
    kernels::conv2d_forward(exec, args);
    kernels::conv2d_backward_weight(exec, args);
    for (size_t i = 0; i < y.size(); ++i) REQUIRE(y[i] == bias[(i / 16) % 3]);
    for (int k = 0; k < 3; ++k) {
      double want = 0;
      for (int n = 0; n < 2; ++n)
        for (int i = 0; i < 16; ++i) want += dy[size_t((n * 3 + k) * 16 + i)];
      REQUIRE(std::abs(db[size_t(k)] - want) <= 1e-5);
    }
  }
  SECTION("batch 0 leaves everything untouched") {
    const auto s = Conv2dShape{0, 3, 5, 5, 4, 3, 3, 1, 1};
    auto dw = poisoned(s.w_size());
    std::vector<float> w = random_floats(s.w_size());
    const Conv2dArgs<float> args{.shape = s, .w = w.data(), .dw = dw.data()};
    kernels::conv2d_forward(exec, args);
    kernels::conv2d_backward_data(exec, args);
    kernels::conv2d_backward_weight(exec, args);
    CHECK(std::all_of(dw.begin(), dw.end(), [](float v) { return v == 0.f; }));  // an empty sum is 0
  }
  CHECK(kernels::conv2d_workspace_floats(kernels::Backend::cpu, Conv2dShape{64, 32, 14, 14, 64, 3, 3, 1, 1}) == 0);
}

TEST_CASE("conv2d on the CPU has no staged filters: its forward reads w itself", "[cpu][conv]") {
  // kernels/conv.h, Conv2dFilterStage: the writer of a staged input stages the convolution's filters only where the
  // GPU's channels-last forward reads them so; on the CPU there is no such place, in any math mode.
  const Conv2dShape s{64, 32, 14, 14, 64, 3, 3, 1, 1};
  std::vector<float> w = random_floats(s.w_size());
  for (const kernels::Math math : {kernels::Math::fp32, kernels::Math::tf32, kernels::Math::bf16}) {
    const kernels::Conv2dFilterStage stage =
        kernels::conv2d_filter_stage(kernels::Backend::cpu, s, math, w.data(), nullptr);
    CHECK(stage.filters == nullptr);
  }
}

}  // namespace
}  // namespace nt::test
