// CPU tests of the optimizers (kernels/optim.h) against references in double precision; every update also runs on
// a pool and must give the same bits as the serial run.
//   sgd_update: PyTorch's SGD (dampening 0, no Nesterov) over a few steps: 16 eps per step of the largest value (a
//   few fp32 roundings per step, accumulated over the steps); without momentum the velocity is never touched.
//   adam_update (Adam/AdamW): the formulas of kernels/optim.h evaluated in double step by step (t = 1..5, and t read
//   from the step counter), each element within the rounding budget of the fp32 op (adam_reference gives it term
//   by term); the step counter exact; the arena's zero padding stays +0.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/optim.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

// ---- SGD ---------------------------------------------------------------------------------------------

// PyTorch's SGD (dampening 0, no Nesterov) in double, over `steps` steps with fresh gradients each.
void sgd_reference(std::vector<double>& p, std::vector<double>& v, const std::vector<std::vector<float>>& grads,
                   const kernels::SgdHyper& h) {
  for (const auto& grad : grads)
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad[i] + double(h.weight_decay) * p[i];
      v[i] = double(h.momentum) * v[i] + g;
      p[i] -= double(h.lr) * (h.momentum != 0.f ? v[i] : g);
    }
}

TEST_CASE("sgd_update matches PyTorch's SGD in double", "[cpu][optim]") {
  CpuExecs execs;
  const int kSteps = 4;
  const kernels::SgdHyper hypers[] = {
      {0.1f, 0.f, 0.f}, {0.05f, 0.9f, 0.f}, {0.05f, 0.9f, 5e-4f}, {0.01f, 0.f, 1e-2f}, {0.5f, 0.5f, 0.1f}};
  const size_t sizes[] = {1, 7, 1023, 250890};  // 250890: the MLP's parameter count, several parallel chunks
  for (const auto& h : hypers)
    for (size_t n : sizes)
      for (const Exec* exec : {&execs.serial, &execs.pooled}) {
        INFO("n=" << n << " lr=" << h.lr << " momentum=" << h.momentum << " wd=" << h.weight_decay);
        std::vector<float> p = random_floats(n, -1, 1);
        std::vector<double> p_ref(p.begin(), p.end()), v_ref(n, 0.0);
        std::vector<std::vector<float>> grads;
        for (int s = 0; s < kSteps; ++s) grads.push_back(random_floats(n, -1, 1));
        sgd_reference(p_ref, v_ref, grads, h);

        const bool momentum = h.momentum != 0.f;
        std::vector<float> v(momentum ? n : 0, 0.f);  // velocity starts at 0; absent without momentum
        for (const auto& g : grads)
          kernels::sgd_update(
              *exec,
              {.n = n, .params = p.data(), .grads = g.data(), .velocity = momentum ? v.data() : nullptr, .hyper = h});

        // Each step rounds g, v and p a few times (relative eps of values of order 1) and the errors add
        // over the steps; 16 eps per step of the largest value bounds them without hiding a wrong formula.
        Tolerance tol{0, 16.0 * kSteps * kEps, "SGD: a few fp32 roundings per step, accumulated over the steps"};
        NT_REQUIRE_CLOSE(p, p_ref, tol);
        if (momentum) NT_REQUIRE_CLOSE(v, v_ref, tol);
      }
}

TEST_CASE("sgd_update without momentum never touches velocity", "[cpu][optim]") {
  const size_t n = 100;
  auto p = random_floats(n), g = random_floats(n);
  std::vector<float> v = random_floats(n), v_before = v;
  kernels::sgd_update(Exec{}, {.n = n,
                               .params = p.data(),
                               .grads = g.data(),
                               .velocity = v.data(),
                               .hyper = {.lr = 0.1f, .momentum = 0.f, .weight_decay = 1e-3f}});
  REQUIRE(same_bits(v, v_before));
}

TEST_CASE("sgd_update is the same on one thread and on a pool", "[cpu][optim]") {
  CpuExecs execs;
  const size_t n = 250890;
  auto p1 = random_floats(n), g = random_floats(n), v1 = random_floats(n);
  auto p2 = p1, v2 = v1;
  kernels::SgdHyper h{0.05f, 0.9f, 5e-4f};
  kernels::sgd_update(execs.serial,
                      {.n = n, .params = p1.data(), .grads = g.data(), .velocity = v1.data(), .hyper = h});
  kernels::sgd_update(execs.pooled,
                      {.n = n, .params = p2.data(), .grads = g.data(), .velocity = v2.data(), .hyper = h});
  REQUIRE(same_bits(p1, p2));
  REQUIRE(same_bits(v1, v2));
}

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
void require_within(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& allowed,
                    const char* what) {
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
        kernels::adam_update(
            execs.serial,
            {.n = n, .params = p.data(), .grads = g.data(), .m = m.data(), .v = v.data(), .hyper = k.h, .step = step});
        kernels::adam_update(execs.pooled, {.n = n,
                                            .params = p2.data(),
                                            .grads = g.data(),
                                            .m = m2.data(),
                                            .v = v2.data(),
                                            .hyper = k.h,
                                            .step = step_pooled});
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
  kernels::adam_update(
      Exec{}, {.n = n, .params = p.data(), .grads = g.data(), .m = m.data(), .v = v.data(), .hyper = h, .step = step});
  REQUIRE(step[0] == 100);
  require_within(p, ref.p, ref.allowed_p, "p");

  // The first step moves every parameter by lr (m_hat / sqrt(v_hat) = sign(g) when v was 0).
  std::vector<float> q = random_floats(n), z(n, 0.f), w(n, 0.f), g1 = random_floats(n, 0.5f, 1.f);
  const std::vector<float> q0 = q;
  uint64_t fresh[2] = {0, 0};
  kernels::adam_update(
      Exec{},
      {.n = n, .params = q.data(), .grads = g1.data(), .m = z.data(), .v = w.data(), .hyper = h, .step = fresh});
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

}  // namespace
}  // namespace nt::test
