// CPU tests of the CNN's small op families: Adam/AdamW, dropout, max pooling.
// Adam against a double-precision evaluation of the formulas of kernels/optim.h, step by step (t = 1..5,
// and t read from the step counter); dropout against its definition (mask statistics, exact scaling,
// fresh draws, reproducibility); max pooling against a naive loop (forward) and a naive scatter
// (backward). Every parallel op is also run on a pool and must give the same bits as the serial run.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/dropout.h"
#include "kernels/optim.h"
#include "kernels/pool.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- Adam / AdamW ------------------------------------------------------------------------------------

// One step of the formulas of kernels/optim.h in double, from the op's fp32 state before the step. The
// fp32 constants the op derives (1 - beta1, 1 - beta2, the AdamW decay) are exact in double here.
struct AdamReference {
  std::vector<double> p, m, v;
  std::vector<double> allowed_p, allowed_m, allowed_v;  // per-element error bounds of the fp32 op
};

AdamReference adam_reference(const std::vector<float>& p, const std::vector<float>& g, const std::vector<float>& m,
                             const std::vector<float>& v, const kernels::AdamHyper& h, uint64_t t) {
  const size_t n = p.size();
  AdamReference r;
  r.p.resize(n), r.m.resize(n), r.v.resize(n);
  r.allowed_p.resize(n), r.allowed_m.resize(n), r.allowed_v.resize(n);
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay;
  const double bc1 = 1 - std::pow(b1, double(t)), bc2 = 1 - std::pow(b2, double(t));
  const double step_size = lr / bc1;
  for (size_t i = 0; i < n; ++i) {
    double pi = p[i], gi = g[i];
    if (wd != 0 && h.decoupled) pi *= 1 - lr * wd;
    if (wd != 0 && !h.decoupled) gi += wd * pi;
    const double mi = b1 * m[i] + (1 - b1) * gi;
    const double vi = b2 * v[i] + (1 - b2) * gi * gi;
    const double denom = std::sqrt(vi) / std::sqrt(bc2) + eps;
    r.p[i] = pi - step_size * mi / denom;
    r.m[i] = mi;
    r.v[i] = vi;
    // Rounding budget of the fp32 op, each term a few ulp of the quantity it rounds:
    //  m: the lerp rounds g - m and the FMA (and g itself under coupled decay): eps of |g| + |m| + |m_new|;
    //  v: two products and the FMA, all terms >= 0: 2 eps of |v_new|;
    //  p: the decay product and the final FMA, eps of |p| + |p_new|; the step s·m/denom carries the
    //     error of m (amplified by s/denom) and ~6 roundings of its own (s, sqrt, two divisions, + eps).
    const double m_scale = std::abs(gi) + std::abs(m[i]) + std::abs(mi);
    r.allowed_m[i] = 2 * kEps * m_scale;
    r.allowed_v[i] = 4 * kEps * vi + 2 * kEps * (1 - b2) * gi * gi;
    r.allowed_p[i] = 2 * kEps * (std::abs(p[i]) + std::abs(r.p[i])) + 8 * kEps * step_size * m_scale / denom;
  }
  return r;
}

// |got - want| <= allowed element by element; NaN never passes.
void require_within(const std::vector<float>& got, const std::vector<double>& want,
                    const std::vector<double>& allowed, const char* what) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(double(got[i]) - want[i]) <= allowed[i])) {
      INFO(what << "[" << i << "]: got " << got[i] << ", want " << want[i] << ", allowed " << allowed[i]
                << " [a few fp32 roundings of the operands, see adam_reference]");
      REQUIRE(false);
    }
  }
}

// Zero ranges inside and at the end of the block: the arena's alignment padding (p = g = m = v = 0).
std::vector<size_t> padding_indices(size_t n) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < n; ++i)
    if ((n > 20 && i % 97 >= 90) || (n > 8 && i + 3 >= n)) idx.push_back(i);
  return idx;
}

TEST_CASE("adam_update and AdamW follow the PyTorch formulas step by step", "[cpu][adam]") {
  CpuExecs execs;
  struct Case {
    kernels::AdamHyper h;
    const char* name;
  };
  const Case cases[] = {
      {{1e-3f, 0.9f, 0.999f, 1e-8f, 0.f, false}, "Adam"},
      {{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, false}, "Adam wd 0.01"},
      {{1e-3f, 0.9f, 0.999f, 1e-8f, 0.f, true}, "AdamW wd 0"},
      {{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true}, "AdamW wd 0.01"},
      {{0.05f, 0.3f, 0.99f, 1e-6f, 0.1f, true}, "AdamW large lr, beta1 < 0.5 (the other lerp branch)"},
      {{0.02f, 0.8f, 0.9f, 1e-3f, 0.05f, false}, "Adam large eps"},
  };
  for (const Case& k : cases)
    for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(200003)}) {
      INFO(k.name << ", n=" << n);
      std::vector<float> p = random_floats(n), m(n, 0.f), v(n, 0.f);
      const auto pad = padding_indices(n);
      for (size_t i : pad) p[i] = 0.f;
      uint64_t step[2] = {0, 0};
      uint64_t step_pooled[2] = {0, 0};
      std::vector<float> p2 = p, m2 = m, v2 = v;  // the same run on the pool
      for (uint64_t t = 1; t <= 5; ++t) {
        INFO("t=" << t);
        std::vector<float> g = random_floats(n, -2.f, 2.f);
        if (t == 3 && n > 1) g[0] = 0.f;  // an element whose gradient vanishes for a step
        for (size_t i : pad) g[i] = 0.f;
        const AdamReference ref = adam_reference(p, g, m, v, k.h, t);
        kernels::adam_update(execs.serial, {.n = n, .params = p.data(), .grads = g.data(), .m = m.data(), .v = v.data(),
                                            .hyper = k.h, .step = step});
        kernels::adam_update(execs.pooled, {.n = n, .params = p2.data(), .grads = g.data(), .m = m2.data(),
                                            .v = v2.data(), .hyper = k.h, .step = step_pooled});
        REQUIRE(step[0] == t);  // the counter advances once per call and holds the steps taken
        REQUIRE(step[1] == 0);
        require_within(m, ref.m, ref.allowed_m, "m");
        require_within(v, ref.v, ref.allowed_v, "v");
        require_within(p, ref.p, ref.allowed_p, "p");
        REQUIRE(same_bits(p, p2));  // thread-count independent
        REQUIRE(same_bits(m, m2));
        REQUIRE(same_bits(v, v2));
        for (size_t i : pad) {  // padding stays +0, bit for bit
          REQUIRE(std::signbit(p[i]) == false);
          REQUIRE(p[i] == 0.f);
          REQUIRE(m[i] == 0.f);
          REQUIRE(v[i] == 0.f);
        }
      }
    }
}

TEST_CASE("adam_update takes t from the counter's value", "[cpu][adam]") {
  // A counter at 99 means step t = 100: the bias corrections of t = 100, not of t = 1.
  const kernels::AdamHyper h{};
  const size_t n = 33;
  std::vector<float> p = random_floats(n), g = random_floats(n), m = random_floats(n, -0.1f, 0.1f),
                     v = random_floats(n, 0.f, 0.01f);
  const AdamReference ref = adam_reference(p, g, m, v, h, 100);
  uint64_t step[2] = {99, 0};
  kernels::adam_update(Exec{}, {.n = n, .params = p.data(), .grads = g.data(), .m = m.data(), .v = v.data(), .hyper = h,
                                .step = step});
  REQUIRE(step[0] == 100);
  require_within(p, ref.p, ref.allowed_p, "p");

  // The first step moves every parameter by lr (m_hat / sqrt(v_hat) = sign(g) when v was 0).
  std::vector<float> q = random_floats(n), z(n, 0.f), w(n, 0.f), g1 = random_floats(n, 0.5f, 1.f);
  const std::vector<float> q0 = q;
  uint64_t fresh[2] = {0, 0};
  kernels::adam_update(Exec{}, {.n = n, .params = q.data(), .grads = g1.data(), .m = z.data(), .v = w.data(),
                                .hyper = h, .step = fresh});
  for (size_t i = 0; i < n; ++i) REQUIRE(std::abs((q0[i] - q[i]) - h.lr) <= 1e-3 * h.lr);
}

TEST_CASE("adam_update with n == 0 still advances the step counter", "[cpu][adam]") {
  uint64_t step[2] = {4, 0};
  kernels::adam_update(Exec{}, {.n = 0, .hyper = kernels::AdamHyper{}, .step = step});
  REQUIRE(step[0] == 5);
  REQUIRE(step[1] == 0);
}

TEST_CASE("adam_step_scalars agree with pow in double", "[cpu][adam]") {
  for (float beta1 : {0.9f, 0.5f, 0.99f})
    for (uint64_t t : {uint64_t(1), uint64_t(2), uint64_t(5), uint64_t(1000), uint64_t(123457)}) {
      const auto s = kernels::adam_step_scalars(1e-3f, beta1, 0.999f, t);
      const double step_size = 1e-3f / (1 - std::pow(double(beta1), double(t)));
      const double bc2_ref = std::sqrt(1 - std::pow(double(0.999f), double(t)));
      INFO("beta1=" << beta1 << " t=" << t);
      REQUIRE(std::abs(s.step_size - step_size) <= kEps * step_size);
      REQUIRE(std::abs(s.bc2_sqrt - bc2_ref) <= kEps * bc2_ref);
    }
}

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
    kernels::dropout_forward(Exec{}, kernels::DropoutArgs<float>{.n = n, .p = p, .seed = 1234, .counter = counter,
                                                                 .x = x.data(), .y = y.data(), .mask = mask.data()});
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
      kernels::dropout_forward(execs.serial, kernels::DropoutArgs<float>{.n = n, .p = p, .seed = 99, .counter = counter,
                                                                         .x = x.data(), .y = y.data(),
                                                                         .mask = mask.data()});
      REQUIRE(counter[0] == 42);
      REQUIRE(counter[1] == 0);
      kernels::dropout_backward(execs.serial, kernels::DropoutArgs<float>{.n = n, .p = p, .mask = mask.data(),
                                                                          .dy = dy.data(), .dx = dx.data()});
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
      kernels::dropout_forward(execs.pooled, kernels::DropoutArgs<float>{.n = n, .p = p, .seed = 99,
                                                                         .counter = counter2, .x = y2.data(),
                                                                         .y = y2.data(), .mask = mask2.data()});
      kernels::dropout_backward(execs.pooled, kernels::DropoutArgs<float>{.n = n, .p = p, .mask = mask2.data(),
                                                                          .dy = dx2.data(), .dx = dx2.data()});
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
    kernels::dropout_forward(Exec{}, kernels::DropoutArgs<float>{.n = n, .p = p, .seed = seed, .counter = counter,
                                                                 .x = x.data(), .y = y.data(), .mask = mask.data()});
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
  kernels::dropout_forward(Exec{}, kernels::DropoutArgs<float>{.n = n, .p = 0.f, .seed = 7, .counter = counter,
                                                               .x = x.data(), .y = y.data(), .mask = mask.data()});
  kernels::dropout_forward(Exec{}, kernels::DropoutArgs<float>{.n = 0, .p = p, .seed = 7, .counter = counter,
                                                               .x = x.data(), .y = y.data(), .mask = mask.data()});
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
  kernels::dropout_forward(Exec{}, kernels::DropoutArgs<float>{.n = n, .p = p, .seed = 5, .counter = cf, .x = xf.data(),
                                                               .y = yf.data(), .mask = mf.data()});
  kernels::dropout_forward(Exec{}, kernels::DropoutArgs<double>{.n = n, .p = p, .seed = 5, .counter = cd, .x = x.data(),
                                                                .y = y.data(), .mask = md.data()});
  REQUIRE(md == mf);
  REQUIRE(cd[0] == 4);
  kernels::dropout_backward(Exec{}, kernels::DropoutArgs<double>{.n = n, .p = p, .mask = md.data(), .dy = dy.data(),
                                                                 .dx = dx.data()});
  const double keep_p = 1.0 - double(p);
  for (size_t i = 0; i < n; ++i) {
    REQUIRE(y[i] == (md[i] ? x[i] / keep_p : 0.0));
    REQUIRE(dx[i] == (md[i] ? 1.0 / keep_p : 0.0));
  }
}

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
            if (std::isnan(v)) last_nan = idx;
            else if (best < 0 || v > x[size_t(plane) * s.h * s.w + best]) best = idx;
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

enum class PoolInput { uniform, ties, nan };

std::vector<float> pool_input(size_t n, PoolInput kind) {
  std::vector<float> x = random_floats(n, -2.f, 2.f);
  if (kind == PoolInput::ties)
    for (auto& v : x) v = std::floor(v);  // four values: ties in most windows
  if (kind == PoolInput::nan)
    for (size_t i = 0; i < n; i += 11) x[i] = kNaN;  // a NaN in many windows, sometimes two
  return x;
}

TEST_CASE("maxpool2d matches the naive loops", "[cpu][maxpool]") {
  CpuExecs execs;
  struct Case {
    int n, c, h, w, window, stride;
  };
  const Case cases[] = {{2, 3, 8, 8, 2, 2}, {3, 5, 7, 9, 2, 2},  {3, 5, 7, 9, 3, 2}, {3, 5, 7, 9, 3, 3},
                        {2, 2, 9, 7, 3, 1}, {1, 1, 5, 5, 2, 3},  {1, 1, 1, 1, 1, 1}, {4, 8, 28, 28, 2, 2},
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
      kernels::maxpool2d_forward(execs.serial, kernels::MaxPool2dArgs<float>{.shape = s, .x = x.data(), .y = y.data(),
                                                                             .argmax = argmax.data()});
      REQUIRE(argmax == ref.argmax);
      for (size_t o = 0; o < out; ++o) {
        if (std::isnan(ref.y[o]))
          REQUIRE(std::isnan(y[o]));
        else
          REQUIRE(y[o] == ref.y[o]);
      }
      kernels::maxpool2d_backward(execs.serial, kernels::MaxPool2dArgs<float>{.shape = s, .argmax = argmax.data(),
                                                                              .dy = dy.data(), .dx = dx.data()});
      REQUIRE(same_bits(dx, pool_backward_reference(s, dy, argmax)));  // same additions, same order

      std::vector<float> y2 = poisoned(out), dx2 = poisoned(in);
      std::vector<int32_t> argmax2(out, -7);
      kernels::maxpool2d_forward(execs.pooled, kernels::MaxPool2dArgs<float>{.shape = s, .x = x.data(), .y = y2.data(),
                                                                             .argmax = argmax2.data()});
      kernels::maxpool2d_backward(execs.pooled, kernels::MaxPool2dArgs<float>{.shape = s, .argmax = argmax2.data(),
                                                                              .dy = dy.data(), .dx = dx2.data()});
      REQUIRE(same_bits(y2, y));
      REQUIRE(argmax2 == argmax);
      REQUIRE(same_bits(dx2, dx));

      // f64: the same choices, values exact.
      const std::vector<double> xd(x.begin(), x.end()), dyd(dy.begin(), dy.end());
      std::vector<double> yd(out), dxd(in);
      std::vector<int32_t> argmaxd(out, -7);
      kernels::maxpool2d_forward(execs.serial, kernels::MaxPool2dArgs<double>{.shape = s, .x = xd.data(),
                                                                              .y = yd.data(),
                                                                              .argmax = argmaxd.data()});
      kernels::maxpool2d_backward(execs.serial, kernels::MaxPool2dArgs<double>{.shape = s, .argmax = argmaxd.data(),
                                                                               .dy = dyd.data(), .dx = dxd.data()});
      REQUIRE(argmaxd == argmax);
      const auto dx_ref = pool_backward_reference(s, dy, argmax);
      for (size_t e = 0; e < in; ++e) REQUIRE(std::abs(dxd[e] - double(dx_ref[e])) <= 16 * kEps);  // <= 9 fp32 sums of |dy| <= 1
    }
}

TEST_CASE("maxpool2d ties pick the first maximum and NaN propagates, as PyTorch", "[cpu][maxpool]") {
  const kernels::Pool2dShape s{1, 1, 4, 4, 2, 2};
  // Window (0,0): all equal -> index 0. Window (0,1): max 3 at (0,3) and (1,2) -> (0,3) = 3.
  // Window (1,0): a NaN at (3,1) -> chosen. Window (1,1): -inf everywhere -> index (2,2) = 10, y = -inf.
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1, 1, 2, 3,  //
                                1, 1, 3, 0,  //
                                5, 9, -inf, -inf,  //
                                0, kNaN, -inf, -inf};
  std::vector<float> y = poisoned(4);
  std::vector<int32_t> argmax(4, -7);
  kernels::maxpool2d_forward(Exec{}, kernels::MaxPool2dArgs<float>{.shape = s, .x = x.data(), .y = y.data(),
                                                                   .argmax = argmax.data()});
  REQUIRE(argmax == std::vector<int32_t>{0, 3, 13, 10});
  REQUIRE(y[0] == 1.f);
  REQUIRE(y[1] == 3.f);
  REQUIRE(std::isnan(y[2]));
  REQUIRE(y[3] == -inf);

  // Backward: each window's gradient lands on its choice; every other element gets exactly 0.
  const std::vector<float> dy = {0.5f, -2.f, 4.f, 8.f};
  std::vector<float> dx = poisoned(16);
  kernels::maxpool2d_backward(Exec{}, kernels::MaxPool2dArgs<float>{.shape = s, .argmax = argmax.data(),
                                                                    .dy = dy.data(), .dx = dx.data()});
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
  kernels::maxpool2d_forward(Exec{}, kernels::MaxPool2dArgs<float>{.shape = s, .x = x.data(), .y = y.data(),
                                                                   .argmax = argmax.data()});
  REQUIRE(std::all_of(argmax.begin(), argmax.end(), [](int32_t a) { return a == 12; }));
  std::vector<float> dy(9);
  for (int o = 0; o < 9; ++o) dy[o] = float(o + 1);
  std::vector<float> dx = poisoned(25);
  kernels::maxpool2d_backward(Exec{}, kernels::MaxPool2dArgs<float>{.shape = s, .argmax = argmax.data(),
                                                                    .dy = dy.data(), .dx = dx.data()});
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
