// CPU tests of the BatchNorm family (kernels/batchnorm.h), fp32 and f64.
//   - forward_train, running statistics, forward_eval and backward against a plain double-precision
//     reference written from the definitions (relu on/off, affine on/off, NCHW and NHWC, odd shapes,
//     BatchNorm1d's hw = 1, a single sample with hw > 1);
//   - the f64 backward against central finite differences of the f64 forward;
//   - a large mean (precision of the variance), a constant channel (variance exactly 0);
//   - NCHW and NHWC give the same bits; the thread count does not change any bit;
//   - count == 1 throws in training; empty batches and zero channels write nothing.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/batchnorm.h"
#include "kernels/cpu/thread_pool.h"
#include "support/sync_batchnorm_check.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::BatchNormHyper;
using kernels::BatchNormShape;
using kernels::Exec;
using kernels::Layout;

size_t index_of(const BatchNormShape& s, int64_t n, int64_t c, int64_t i) {
  return static_cast<size_t>(s.layout == Layout::nchw ? (n * s.c + c) * s.hw + i : (n * s.hw + i) * s.c + c);
}

std::string describe(const BatchNormShape& s) {
  return cat("n=", s.n, " c=", s.c, " hw=", s.hw, s.layout == Layout::nchw ? " nchw" : " nhwc");
}

// (n, c, hw) in `from`'s layout -> the other layout.
template <class T>
std::vector<T> relayout(const std::vector<T>& v, const BatchNormShape& from) {
  BatchNormShape to = from;
  to.layout = from.layout == Layout::nchw ? Layout::nhwc : Layout::nchw;
  std::vector<T> out(v.size());
  for (int64_t n = 0; n < from.n; ++n)
    for (int64_t c = 0; c < from.c; ++c)
      for (int64_t i = 0; i < from.hw; ++i) out[index_of(to, n, c, i)] = v[index_of(from, n, c, i)];
  return out;
}

template <class T>
std::vector<T> random_values(size_t n, double lo, double hi) {
  auto f = random_floats(n, static_cast<float>(lo), static_cast<float>(hi));
  return std::vector<T>(f.begin(), f.end());
}

// ---- the double-precision reference, from the definitions -----------------------------------------

struct RefForward {
  std::vector<double> y, mean, invstd, running_mean, running_var;
};

template <class T>
RefForward ref_train(const BatchNormShape& s, const BatchNormHyper& h, const std::vector<T>& x,
                     const std::vector<T>& gamma, const std::vector<T>& beta, const std::vector<T>& rm,
                     const std::vector<T>& rv) {
  RefForward r;
  r.y.resize(x.size());
  const double count = double(s.n * s.hw);
  for (int64_t c = 0; c < s.c; ++c) {
    double sum = 0;
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.hw; ++i) sum += x[index_of(s, n, c, i)];
    const double mean = sum / count;
    double sq = 0;
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.hw; ++i) sq += (x[index_of(s, n, c, i)] - mean) * (x[index_of(s, n, c, i)] - mean);
    const double var = sq / count, invstd = 1 / std::sqrt(var + h.eps);
    const double g = gamma.empty() ? 1.0 : double(gamma[c]), b = beta.empty() ? 0.0 : double(beta[c]);
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.hw; ++i) {
        const size_t k = index_of(s, n, c, i);
        const double v = g * (x[k] - mean) * invstd + b;
        r.y[k] = h.relu ? std::max(v, 0.0) : v;
      }
    r.mean.push_back(mean);
    r.invstd.push_back(invstd);
    r.running_mean.push_back((1 - h.momentum) * double(rm[c]) + h.momentum * mean);
    r.running_var.push_back((1 - h.momentum) * double(rv[c]) + h.momentum * var * count / (count - 1));
  }
  return r;
}

template <class T>
std::vector<double> ref_eval(const BatchNormShape& s, const BatchNormHyper& h, const std::vector<T>& x,
                             const std::vector<T>& gamma, const std::vector<T>& beta, const std::vector<T>& rm,
                             const std::vector<T>& rv) {
  std::vector<double> y(x.size());
  for (int64_t c = 0; c < s.c; ++c)
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.hw; ++i) {
        const size_t k = index_of(s, n, c, i);
        const double g = gamma.empty() ? 1.0 : double(gamma[c]), b = beta.empty() ? 0.0 : double(beta[c]);
        const double v = g * (x[k] - double(rm[c])) / std::sqrt(double(rv[c]) + h.eps) + b;
        y[k] = h.relu ? std::max(v, 0.0) : v;
      }
  return y;
}

struct RefBackward {
  std::vector<double> dx, dgamma, dbeta;
};

// dx = gamma·invstd/count · (count·dy' - Σdy' - xhat·Σdy'·xhat), the header's formula; y_mask is the
// forward output whose sign gates dy when relu.
template <class T>
RefBackward ref_backward(const BatchNormShape& s, const BatchNormHyper& h, const std::vector<T>& x,
                         const std::vector<T>& y_mask, const std::vector<T>& dy, const std::vector<T>& gamma,
                         const std::vector<double>& mean, const std::vector<double>& invstd) {
  RefBackward r;
  r.dx.resize(x.size());
  const double count = double(s.n * s.hw);
  for (int64_t c = 0; c < s.c; ++c) {
    auto grad = [&](size_t k) { return h.relu && !(y_mask[k] > 0) ? 0.0 : double(dy[k]); };
    double sdy = 0, sdyxhat = 0;
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.hw; ++i) {
        const size_t k = index_of(s, n, c, i);
        sdy += grad(k);
        sdyxhat += grad(k) * (x[k] - mean[c]) * invstd[c];
      }
    const double g = gamma.empty() ? 1.0 : double(gamma[c]);
    for (int64_t n = 0; n < s.n; ++n)
      for (int64_t i = 0; i < s.hw; ++i) {
        const size_t k = index_of(s, n, c, i);
        const double xhat = (x[k] - mean[c]) * invstd[c];
        r.dx[k] = g * invstd[c] / count * (count * grad(k) - sdy - xhat * sdyxhat);
      }
    r.dgamma.push_back(sdyxhat);
    r.dbeta.push_back(sdy);
  }
  return r;
}

// ---- running the ops -------------------------------------------------------------------------------

template <class T>
struct Inputs {
  std::vector<T> x, gamma, beta, rm, rv, dy;  // gamma, beta empty: affine = false
};

template <class T>
Inputs<T> make_inputs(const BatchNormShape& s, bool affine, double lo = -1, double hi = 1) {
  const size_t count = static_cast<size_t>(s.n * s.c * s.hw), C = static_cast<size_t>(s.c);
  Inputs<T> in;
  in.x = random_values<T>(count, lo, hi);
  if (affine) in.gamma = random_values<T>(C, 0.5, 1.5), in.beta = random_values<T>(C, -0.5, 0.5);
  in.rm = random_values<T>(C, -0.2, 0.2);
  in.rv = random_values<T>(C, 0.5, 1.5);
  in.dy = random_values<T>(count, -1, 1);
  return in;
}

template <class T>
const T* ptr_or_null(const std::vector<T>& v) {
  return v.empty() ? nullptr : v.data();
}

template <class T>
T poison() {
  return std::numeric_limits<T>::quiet_NaN();
}

template <class T>
struct Outputs {
  std::vector<T> y, save_mean, save_invstd, rm, rv, y_eval, dx, dgamma, dbeta;
  int64_t batches = 0;
};

// forward_train (running stats updated from the inputs' values), forward_eval with the updated running
// statistics, backward; every output poisoned first.
template <class T>
Outputs<T> run_all(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const Inputs<T>& in) {
  const size_t count = in.x.size(), C = static_cast<size_t>(s.c);
  Outputs<T> o;
  o.y.assign(count, poison<T>());
  o.y_eval.assign(count, poison<T>());
  o.dx.assign(count, poison<T>());
  o.save_mean.assign(C, poison<T>());
  o.save_invstd.assign(C, poison<T>());
  o.dgamma.assign(C, poison<T>());
  o.dbeta.assign(C, poison<T>());
  o.rm = in.rm;
  o.rv = in.rv;
  o.batches = 41;
  REQUIRE(kernels::batchnorm_workspace_floats(kernels::Backend::cpu, s) == 0);
  const bool affine = !in.gamma.empty();
  kernels::BatchNormArgs<T> a{.shape = s,
                              .hyper = h,
                              .x = in.x.data(),
                              .gamma = ptr_or_null(in.gamma),
                              .beta = ptr_or_null(in.beta),
                              .y = o.y.data(),
                              .save_mean = o.save_mean.data(),
                              .save_invstd = o.save_invstd.data(),
                              .running_mean = o.rm.data(),
                              .running_var = o.rv.data(),
                              .num_batches_tracked = &o.batches,
                              .dy = in.dy.data(),
                              .dx = o.dx.data(),
                              .dgamma = affine ? o.dgamma.data() : nullptr,
                              .dbeta = affine ? o.dbeta.data() : nullptr};
  kernels::batchnorm_forward_train(exec, a);
  a.y = o.y_eval.data();  // evaluation with the running statistics the training forward just updated
  kernels::batchnorm_forward_eval(exec, a);
  a.y = h.relu ? o.y.data() : nullptr;  // the backward reads the training forward's output through the ReLU
  kernels::batchnorm_backward(exec, a);
  if (!affine) o.dgamma.clear(), o.dbeta.clear();
  return o;
}

template <class T>
std::vector<float> as_float(const std::vector<T>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// Compares an f32 or f64 result with the reference; f64 results are checked in double by scaling the
// tolerance (compare() takes fp32 `got`, so f64 values are compared through their difference).
template <class T>
void require_close(const std::vector<T>& got, const std::vector<double>& want, const Tolerance& tol) {
  if constexpr (std::is_same_v<T, float>) {
    NT_REQUIRE_CLOSE(got, want, tol);
  } else {
    REQUIRE(got.size() == want.size());
    double scale = 0;
    for (double w : want) scale = std::max(scale, std::abs(w));
    const double allowed = tol.abs_tol + tol.rel_tol * scale;
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("element " << i << ": got " << got[i] << ", want " << want[i] << ", allowed " << allowed << " ["
                      << tol.reason << "]");
      REQUIRE(std::abs(got[i] - want[i]) <= allowed);
    }
  }
}

// The CPU op computes in double and rounds once: fp32 outputs are within an ulp or two of the reference
// (scaled by the output's magnitude). Its backward uses save_mean/save_invstd rounded to fp32, which
// moves xhat by ~eps relative; dx = k1·(dy' - mean(dy') - xhat·mean(dy'·xhat)) cancels (exactly, for a
// count of 2), so its error is measured against k1·max|dy| (`unit`), not against dx itself, and the sums
// dgamma, dbeta against Σ|dy'·xhat| <= count·max|dy|·max|xhat|. f64: only the summation order differs.
template <class T>
Tolerance forward_tol() {
  if constexpr (std::is_same_v<T, float>) return {0, 4 * kEps, "fp32: computed in double, rounded once"};
  return {0, 1e-12, "f64: summation order only"};
}
template <class T>
Tolerance backward_tol(double unit) {
  if constexpr (std::is_same_v<T, float>)
    return {32 * kEps * unit, 32 * kEps, "fp32: statistics rounded to fp32 before the backward, then double"};
  return {1e-12 * unit, 1e-11, "f64: summation order only"};
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double e : v) m = std::max(m, std::abs(e));
  return m;
}

template <class T>
void check_against_reference(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, bool affine) {
  INFO(describe(s) << (h.relu ? " relu" : "") << (affine ? " affine" : " no affine")
                   << (std::is_same_v<T, float> ? " f32" : " f64"));
  const Inputs<T> in = make_inputs<T>(s, affine);
  const Outputs<T> o = run_all(exec, s, h, in);
  const RefForward ref = ref_train(s, h, in.x, in.gamma, in.beta, in.rm, in.rv);
  require_close(o.y, ref.y, forward_tol<T>());
  require_close(o.save_mean, ref.mean, forward_tol<T>());
  require_close(o.save_invstd, ref.invstd, forward_tol<T>());
  require_close(o.rm, ref.running_mean, forward_tol<T>());
  require_close(o.rv, ref.running_var, forward_tol<T>());
  REQUIRE(o.batches == 42);
  require_close(o.y_eval, ref_eval(s, h, in.x, in.gamma, in.beta, o.rm, o.rv), forward_tol<T>());
  const RefBackward rb = ref_backward(s, h, in.x, o.y, in.dy, in.gamma, ref.mean, ref.invstd);
  const std::vector<double> dy(in.dy.begin(), in.dy.end());
  double k1 = 0, xhat = 0;
  for (int64_t c = 0; c < s.c; ++c) k1 = std::max(k1, (affine ? std::abs(double(in.gamma[c])) : 1.0) * ref.invstd[c]);
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t c = 0; c < s.c; ++c)
      for (int64_t i = 0; i < s.hw; ++i)
        xhat = std::max(xhat, std::abs((double(in.x[index_of(s, n, c, i)]) - ref.mean[c]) * ref.invstd[c]));
  require_close(o.dx, rb.dx, backward_tol<T>(k1 * max_abs(dy)));
  if (affine) {
    const double sums = double(s.n * s.hw) * max_abs(dy) * std::max(xhat, 1.0);
    require_close(o.dgamma, rb.dgamma, backward_tol<T>(sums));
    require_close(o.dbeta, rb.dbeta, backward_tol<T>(sums));
  }
}

const BatchNormShape kShapes[] = {
    {3, 5, 49, Layout::nchw},                            // the odd shape
    {4, 8, 16, Layout::nchw},                            // hw % 4 == 0, C % 4 == 0 (the GPU's vector paths)
    {7, 6, 1, Layout::nchw},                             // BatchNorm1d
    {64, 10, 1, Layout::nchw}, {2, 3, 1, Layout::nchw},  // count 2: the smallest that trains
    {1, 4, 9, Layout::nchw},                             // one sample, statistics over hw
    {5, 33, 7, Layout::nchw},                            // more channels than an NHWC task's group
};

TEST_CASE("batchnorm matches a double-precision reference", "[cpu][batchnorm]") {
  CpuExecs execs;
  for (BatchNormShape s : kShapes)
    for (Layout layout : {Layout::nchw, Layout::nhwc})
      for (bool relu : {false, true})
        for (bool affine : {true, false}) {
          s.layout = layout;
          BatchNormHyper h;
          h.relu = relu;
          h.momentum = 0.25;  // not the default, so that a swapped (1-m) shows
          check_against_reference<float>(execs.serial, s, h, affine);
          check_against_reference<float>(execs.pooled, s, h, affine);
          check_against_reference<double>(execs.pooled, s, h, affine);
        }
}

TEST_CASE("batchnorm f64 backward matches finite differences of the forward", "[cpu][batchnorm][grad]") {
  for (Layout layout : {Layout::nchw, Layout::nhwc})
    for (bool relu : {false, true}) {
      const BatchNormShape s{3, 2, 5, layout};
      BatchNormHyper h;
      h.relu = relu;
      INFO(describe(s) << (relu ? " relu" : ""));
      Inputs<double> in = make_inputs<double>(s, true);
      const std::vector<double> w = random_values<double>(in.x.size(), -1, 1);  // loss = Σ w·y, so dy = w
      const size_t count = in.x.size(), C = static_cast<size_t>(s.c);
      std::vector<double> y(count), mean(C), invstd(C);
      auto loss = [&](const Inputs<double>& v) {
        std::vector<double> yy(count), m(C), is(C);
        kernels::batchnorm_forward_train(Exec{}, kernels::BatchNormArgs<double>{.shape = s,
                                                                                .hyper = h,
                                                                                .x = v.x.data(),
                                                                                .gamma = v.gamma.data(),
                                                                                .beta = v.beta.data(),
                                                                                .y = yy.data(),
                                                                                .save_mean = m.data(),
                                                                                .save_invstd = is.data()});
        double l = 0;
        for (size_t k = 0; k < count; ++k) l += w[k] * yy[k];
        return l;
      };
      std::vector<double> dx(count), dgamma(C), dbeta(C);
      kernels::BatchNormArgs<double> a{.shape = s,
                                       .hyper = h,
                                       .x = in.x.data(),
                                       .gamma = in.gamma.data(),
                                       .beta = in.beta.data(),
                                       .y = y.data(),
                                       .save_mean = mean.data(),
                                       .save_invstd = invstd.data(),
                                       .dy = w.data(),
                                       .dx = dx.data(),
                                       .dgamma = dgamma.data(),
                                       .dbeta = dbeta.data()};
      kernels::batchnorm_forward_train(Exec{}, a);
      if (!relu) a.y = nullptr;
      kernels::batchnorm_backward(Exec{}, a);
      const double step = 1e-6;
      // Central differences: O(step²) truncation, ~1e-16/step rounding; the values are O(1).
      auto numeric = [&](std::vector<double>& param, size_t k) {
        const double keep = param[k];
        param[k] = keep + step;
        const double up = loss(in);
        param[k] = keep - step;
        const double down = loss(in);
        param[k] = keep;
        return (up - down) / (2 * step);
      };
      for (size_t k = 0; k < count; ++k) {
        INFO("dx[" << k << "]");
        REQUIRE(std::abs(dx[k] - numeric(in.x, k)) <= 1e-6);
      }
      for (size_t c = 0; c < C; ++c) {
        INFO("channel " << c);
        REQUIRE(std::abs(dgamma[c] - numeric(in.gamma, c)) <= 1e-6);
        REQUIRE(std::abs(dbeta[c] - numeric(in.beta, c)) <= 1e-6);
      }
    }
}

TEST_CASE("batchnorm keeps the variance's precision under a large mean", "[cpu][batchnorm]") {
  // x = 1000 + U(-1, 1): a single-pass Σx² - (Σx)²/n in fp32 would lose every digit of the variance.
  const BatchNormShape s{16, 3, 64, Layout::nhwc};
  BatchNormHyper h;
  const Inputs<float> in = make_inputs<float>(s, true, 999, 1001);
  const Outputs<float> o = run_all(Exec{}, s, h, in);
  const RefForward ref = ref_train(s, h, in.x, in.gamma, in.beta, in.rm, in.rv);
  NT_REQUIRE_CLOSE(o.save_invstd, ref.invstd, forward_tol<float>());
  NT_REQUIRE_CLOSE(o.rv, ref.running_var, forward_tol<float>());
  NT_REQUIRE_CLOSE(o.y, ref.y, forward_tol<float>());
}

TEST_CASE("batchnorm of a constant channel has variance exactly 0", "[cpu][batchnorm]") {
  const BatchNormShape s{4, 2, 9, Layout::nchw};
  BatchNormHyper h;
  std::vector<float> x(72, 3.25f), gamma = {2.f, 0.5f}, beta = {0.75f, -1.5f}, y(72), mean(2), invstd(2);
  std::vector<float> rm = {0.f, 0.f}, rv = {1.f, 1.f};
  kernels::batchnorm_forward_train(Exec{}, kernels::BatchNormArgs<float>{.shape = s,
                                                                         .hyper = h,
                                                                         .x = x.data(),
                                                                         .gamma = gamma.data(),
                                                                         .beta = beta.data(),
                                                                         .y = y.data(),
                                                                         .save_mean = mean.data(),
                                                                         .save_invstd = invstd.data(),
                                                                         .running_mean = rm.data(),
                                                                         .running_var = rv.data()});
  REQUIRE(mean[0] == 3.25f);
  REQUIRE(invstd[0] == static_cast<float>(1 / std::sqrt(1e-5)));
  REQUIRE(rv[0] == 0.9f);  // (1 - 0.1)·1 + 0.1·0
  for (int64_t k = 0; k < 72; ++k) REQUIRE(y[k] == beta[k / 9 % 2]);
}

TEST_CASE("batchnorm NCHW and NHWC give the same bits", "[cpu][batchnorm]") {
  CpuExecs execs;
  for (BatchNormShape s : {BatchNormShape{3, 5, 49}, BatchNormShape{8, 20, 6}, BatchNormShape{9, 4, 1}})
    for (bool relu : {false, true}) {
      INFO(describe(s) << (relu ? " relu" : ""));
      BatchNormHyper h;
      h.relu = relu;
      const Inputs<float> in = make_inputs<float>(s, true);
      const Outputs<float> a = run_all(execs.pooled, s, h, in);
      BatchNormShape t = s;
      t.layout = Layout::nhwc;
      Inputs<float> tin = in;
      tin.x = relayout(in.x, s);
      tin.dy = relayout(in.dy, s);
      const Outputs<float> b = run_all(execs.pooled, t, h, tin);
      REQUIRE(same_bits(relayout(b.y, t), a.y));
      REQUIRE(same_bits(relayout(b.y_eval, t), a.y_eval));
      REQUIRE(same_bits(relayout(b.dx, t), a.dx));
      REQUIRE(same_bits(b.save_mean, a.save_mean));
      REQUIRE(same_bits(b.save_invstd, a.save_invstd));
      REQUIRE(same_bits(b.rm, a.rm));
      REQUIRE(same_bits(b.rv, a.rv));
      REQUIRE(same_bits(b.dgamma, a.dgamma));
      REQUIRE(same_bits(b.dbeta, a.dbeta));
    }
}

TEST_CASE("batchnorm results do not depend on the thread count", "[cpu][batchnorm]") {
  kernels::ThreadPool two{2}, five{5};
  Exec on_two{}, on_five{};
  on_two.pool = &two;
  on_five.pool = &five;
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    const BatchNormShape s{6, 37, 50, layout};
    INFO(describe(s));
    BatchNormHyper h;
    h.relu = true;
    const Inputs<float> in = make_inputs<float>(s, true);
    const Outputs<float> a = run_all(Exec{}, s, h, in), b = run_all(on_two, s, h, in), c = run_all(on_five, s, h, in);
    for (const Outputs<float>* o : {&b, &c}) {
      REQUIRE(same_bits(o->y, a.y));
      REQUIRE(same_bits(o->y_eval, a.y_eval));
      REQUIRE(same_bits(o->dx, a.dx));
      REQUIRE(same_bits(o->dgamma, a.dgamma));
      REQUIRE(same_bits(o->dbeta, a.dbeta));
      REQUIRE(same_bits(o->rv, a.rv));
    }
  }
}

TEST_CASE("batchnorm training needs more than one value per channel", "[cpu][batchnorm]") {
  std::vector<float> x(4, 1.f), y(4), m(4), is(4);
  std::vector<double> xd(4, 1.0), yd(4), md(4), isd(4);
  const BatchNormShape bn1d{1, 4, 1, Layout::nchw};
  REQUIRE_THROWS_AS(
      kernels::batchnorm_forward_train(
          Exec{},
          kernels::BatchNormArgs<float>{
              .shape = bn1d, .x = x.data(), .y = y.data(), .save_mean = m.data(), .save_invstd = is.data()}),
      Error);
  REQUIRE_THROWS_AS(
      kernels::batchnorm_forward_train(Exec{}, kernels::BatchNormArgs<double>{.shape = {1, 4, 1, Layout::nhwc},
                                                                              .x = xd.data(),
                                                                              .y = yd.data(),
                                                                              .save_mean = md.data(),
                                                                              .save_invstd = isd.data()}),
      Error);
  // Evaluation of a single sample is fine.
  std::vector<float> rm(4, 0.f), rv(4, 1.f);
  kernels::batchnorm_forward_eval(
      Exec{}, kernels::BatchNormArgs<float>{
                  .shape = bn1d, .x = x.data(), .y = y.data(), .running_mean = rm.data(), .running_var = rv.data()});
  REQUIRE(std::abs(y[0] - 1 / std::sqrt(1 + 1e-5)) < 1e-6);
}

TEST_CASE("batchnorm with an empty batch or no channels writes nothing", "[cpu][batchnorm]") {
  std::vector<float> out(3, kPoison), stats(3, kPoison);
  int64_t batches = 7;
  for (BatchNormShape s : {BatchNormShape{0, 3, 4}, BatchNormShape{5, 0, 4}, BatchNormShape{5, 3, 0}}) {
    kernels::BatchNormArgs<float> a{.shape = s,
                                    .y = out.data(),
                                    .save_mean = stats.data(),
                                    .save_invstd = stats.data(),
                                    .running_mean = stats.data(),
                                    .running_var = stats.data(),
                                    .num_batches_tracked = &batches};
    kernels::batchnorm_forward_train(Exec{}, a);
    kernels::batchnorm_forward_eval(Exec{}, kernels::BatchNormArgs<float>{.shape = s, .y = out.data()});
    kernels::batchnorm_backward(
        Exec{},
        kernels::BatchNormArgs<float>{.shape = s, .dx = out.data(), .dgamma = stats.data(), .dbeta = stats.data()});
  }
  REQUIRE(batches == 7);
  for (float v : out) REQUIRE(std::isnan(v));
  for (float v : stats) REQUIRE(std::isnan(v));
}

TEST_CASE("batchnorm backward without dx computes only the parameter gradients", "[cpu][batchnorm]") {
  const BatchNormShape s{5, 4, 12, Layout::nhwc};
  BatchNormHyper h;
  h.relu = true;
  const Inputs<float> in = make_inputs<float>(s, true);
  Outputs<float> full = run_all(Exec{}, s, h, in);  // not const: the args' save_* and y are written by forwards
  std::vector<float> dgamma(4, kPoison), dbeta(4, kPoison);
  kernels::batchnorm_backward(Exec{}, kernels::BatchNormArgs<float>{.shape = s,
                                                                    .hyper = h,
                                                                    .x = in.x.data(),
                                                                    .gamma = in.gamma.data(),
                                                                    .y = full.y.data(),
                                                                    .save_mean = full.save_mean.data(),
                                                                    .save_invstd = full.save_invstd.data(),
                                                                    .dy = in.dy.data(),
                                                                    .dgamma = dgamma.data(),
                                                                    .dbeta = dbeta.data()});
  REQUIRE(same_bits(dgamma, full.dgamma));
  REQUIRE(same_bits(dbeta, full.dbeta));
}

// Synchronized BatchNorm (kernels/batchnorm.h, group): two ranks played by one process (tests/support/
// sync_batchnorm_check.h); rank 0's results are those of one BatchNorm over both ranks' rows.
TEST_CASE("synchronized batchnorm on two ranks equals one batchnorm over both ranks' rows", "[cpu][batchnorm]") {
  using kernels::BatchNormPool;
  const CpuExecs cpu;
  for (const kernels::Exec* exec : {&cpu.serial, &cpu.pooled}) {
    check_synchronized_batchnorm(*exec, {5, 3, 63, Layout::nchw}, /*relu=*/false);
    check_synchronized_batchnorm(*exec, {6, 5, 9, Layout::nhwc}, /*relu=*/true);
    check_synchronized_batchnorm(*exec, {7, 13, 1, Layout::nchw}, /*relu=*/true);  // BatchNorm1d
    const BatchNormPool pool{9, 10, 2};
    check_synchronized_batchnorm(*exec, {3, 4, 90, Layout::nchw}, /*relu=*/true, &pool);
  }
}

TEST_CASE("interleave_rank_partials lays every rank's partials out as one rank's", "[cpu][batchnorm]") {
  const int ranks = 3, fields = 3, chunks = 2;
  const int64_t C = 5;
  std::vector<float> gathered(size_t(ranks * fields * C * chunks));
  for (size_t i = 0; i < gathered.size(); ++i) gathered[i] = float(i);
  std::vector<float> out(gathered.size(), kPoison);
  kernels::interleave_rank_partials(kernels::Exec{}, {.gathered = gathered.data(),
                                                      .out = out.data(),
                                                      .ranks = ranks,
                                                      .fields = fields,
                                                      .channels = C,
                                                      .chunks = chunks});
  for (int r = 0; r < ranks; ++r)
    for (int f = 0; f < fields; ++f)
      for (int64_t c = 0; c < C; ++c)
        for (int p = 0; p < chunks; ++p)
          REQUIRE(out[size_t((f * C + c) * ranks * chunks + r * chunks + p)] ==
                  gathered[size_t(((r * fields + f) * C + c) * chunks + p)]);
}

}  // namespace
}  // namespace nt::test
