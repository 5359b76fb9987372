#include "batchnorm_checks.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace nt::test {

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float e : v) m = std::max(m, std::abs(double(e)));
  return m;
}

Inputs make_inputs(const BatchNormShape& s, bool affine, float lo, float hi) {
  const size_t count = static_cast<size_t>(s.n * s.c * s.hw), C = static_cast<size_t>(s.c);
  Inputs in;
  in.x = random_floats(count, lo, hi);
  if (affine) in.gamma = random_floats(C, 0.5f, 1.5f), in.beta = random_floats(C, -0.5f, 0.5f);
  in.rm = random_floats(C, -0.2f, 0.2f);
  in.rv = random_floats(C, 0.5f, 1.5f);
  in.dy = random_floats(count, -1, 1);
  return in;
}

const float* ptr_or_null(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

PoolResults run_cpu_pool(const BatchNormShape& s, const kernels::BatchNormPool& pool, const BatchNormHyper& h,
                         const Inputs& in, const std::vector<float>& dy) {
  const size_t pooled = static_cast<size_t>(s.n * s.c) * pool.p() * pool.q(), C = static_cast<size_t>(s.c);
  PoolResults o;
  Results& r = o.r;
  r.y.resize(pooled), r.y_eval.resize(pooled), r.dx.resize(in.x.size());
  r.mean.resize(C), r.invstd.resize(C), r.dgamma.resize(C), r.dbeta.resize(C);
  r.rm = in.rm, r.rv = in.rv, r.batches = 5;
  o.argmax.resize(pooled), o.argmax_eval.resize(pooled);
  std::vector<float> ws(kernels::batchnorm_pool_workspace_floats(Backend::cpu, s, pool));
  const Exec cpu{};
  kernels::BatchNormArgs<float> a{.shape = s,
                                  .hyper = h,
                                  .pool = pool,
                                  .x = in.x.data(),
                                  .gamma = ptr_or_null(in.gamma),
                                  .beta = ptr_or_null(in.beta),
                                  .y = r.y.data(),
                                  .argmax = o.argmax.data(),
                                  .save_mean = r.mean.data(),
                                  .save_invstd = r.invstd.data(),
                                  .running_mean = r.rm.data(),
                                  .running_var = r.rv.data(),
                                  .num_batches_tracked = &r.batches,
                                  .dy = dy.data(),
                                  .dx = r.dx.data(),
                                  .dgamma = r.dgamma.data(),
                                  .dbeta = r.dbeta.data(),
                                  .workspace = ws.data()};
  kernels::batchnorm_pool_forward_train(cpu, a);
  kernels::BatchNormArgs<float> eval = a;
  eval.y = r.y_eval.data(), eval.argmax = o.argmax_eval.data();
  kernels::batchnorm_pool_forward_eval(cpu, eval);
  kernels::batchnorm_pool_backward(cpu, a);
  return o;
}

double output_scale(const BatchNormShape& s, const Inputs& in, const Results& cpu) {
  double scale = 0;
  for (int64_t c = 0; c < s.c; ++c)
    scale = std::max(scale, (in.gamma.empty() ? 1.0 : std::abs(double(in.gamma[c]))) * cpu.invstd[c]);
  return scale;
}
Tolerance train_y_tolerance(double scale, double x_unit) {
  return {scale * 16 * kEps * x_unit + 1e-6, 3e-5, "y: the mean's error times the scale, xhat times 2e-5"};
}
Tolerance eval_y_tolerance(double scale, double x_unit) {
  return {scale * 4 * kEps * x_unit + 1e-6, 16 * kEps, "eval: fp32 fma of given statistics"};
}

namespace {

// Every GPU argmax names an element of its window whose value in `full` (the CPU's full-resolution output)
// is the window's maximum within tol. Returns the number of windows where it does not.
int bad_choices(const BatchNormShape& s, const kernels::BatchNormPool& pool, const std::vector<float>& full,
                const std::vector<int32_t>& argmax, double tol) {
  const int P = pool.p(), Q = pool.q(), K = pool.window;
  int bad = 0;
  for (int64_t plane = 0; plane < s.n * s.c; ++plane)
    for (int i = 0; i < P; ++i)
      for (int j = 0; j < Q; ++j) {
        const float* fp = full.data() + plane * s.hw;
        float best = -INFINITY;
        for (int a = 0; a < K; ++a)
          for (int b = 0; b < K; ++b) best = std::max(best, fp[(i * K + a) * pool.w + j * K + b]);
        const int32_t at = argmax[static_cast<size_t>((plane * P + i) * Q + j)];
        const int h = at / pool.w, w = at % pool.w;
        const bool inside = at >= 0 && h / K == i && w / K == j && h < P * K && w < Q * K;
        bad += !inside || !(double(fp[at]) >= double(best) - tol);
      }
  return bad;
}

}  // namespace

void check_choices(const BatchNormShape& s, const kernels::BatchNormPool& pool, const BatchNormHyper& h,
                   const Inputs& in, const PoolResults& cpu, const PoolResults& gpu, const Tolerance& y_tol,
                   const Tolerance& eval_tol) {
  std::vector<float> full(in.x.size()), full_eval(in.x.size());
  Results unfused = cpu.r;
  unfused.rm = in.rm, unfused.rv = in.rv;
  int64_t batches = 5;
  kernels::BatchNormArgs<float> a{.shape = s,
                                  .hyper = h,
                                  .x = in.x.data(),
                                  .gamma = ptr_or_null(in.gamma),
                                  .beta = ptr_or_null(in.beta),
                                  .y = full.data(),
                                  .save_mean = unfused.mean.data(),
                                  .save_invstd = unfused.invstd.data(),
                                  .running_mean = unfused.rm.data(),
                                  .running_var = unfused.rv.data(),
                                  .num_batches_tracked = &batches};
  kernels::batchnorm_forward_train(Exec{}, a);
  std::vector<float> rm = cpu.r.rm, rv = cpu.r.rv;  // the pooled CPU twin's running statistics, for evaluation
  a.y = full_eval.data(), a.running_mean = rm.data(), a.running_var = rv.data();
  kernels::batchnorm_forward_eval(Exec{}, a);
  CHECK(bad_choices(s, pool, full, gpu.argmax, 2 * (y_tol.abs_tol + y_tol.rel_tol * max_abs(full))) == 0);
  CHECK(bad_choices(s, pool, full_eval, gpu.argmax_eval,
                    2 * (eval_tol.abs_tol + eval_tol.rel_tol * max_abs(full_eval))) == 0);
}

}  // namespace nt::test
