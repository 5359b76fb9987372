// CUDA tests of the fused convolution stem (kernels/conv_batchnorm_pool.h: conv_batchnorm_pool_forward_train,
// forward_eval, backward): against the CPU ops it fuses, for bit-reproducibility (also beside a gradient-only
// kernel), and that training refuses a single value per channel.
//
// Tolerances: the CPU twin is built from the stem's parts: conv2d_forward gives the BatchNorm's input (with TF32 or
// BF16, of rounded x and w: the products are exact, kernels/operand.h), run_cpu_pool the pooled BatchNorm on it, and
// conv2d_backward_weight the dw of its dx (rounded too with TF32 or BF16). Tolerances are the pooled BatchNorm test's
// (test_batchnorm_cuda.cpp; y's in support/batchnorm_checks.h) with the convolution's own error added: the GPU
// and CPU sum the C·R·S products in different orders (fp32_dot of the taps, times max |conv|), which moves the
// statistics and y by that much times the scale; dw is a sum over the count of dconv·x, checked as dgamma's sums
// are; with TF32 (BF16) the CPU rounds each dconv (as the direct weight-gradient kernel does) and the GPU's
// moment formula never forms dconv, a relative difference of at most 2^-11 (2^-8) per term with random sign:
// 2^-10·sqrt(count) (2^-7·sqrt(count)) of the terms' bound is allowed for that.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/batchnorm.h"
#include "kernels/conv.h"
#include "kernels/conv_batchnorm_pool.h"
#include "kernels/operand.h"
#include "kernels/optim.h"
#include "support/batchnorm_checks.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

struct StemCase {
  int n, c, h, w, k, kernel, stride, pad, window;
  float offset = 0;  // added to x: a mean far from 0 (the GPU's moments are shifted sums)
};

void check_stem(const Exec& cuda, const StemCase& k, bool relu, bool affine, kernels::Math math) {
  const kernels::Conv2dShape cs{k.n, k.c, k.h, k.w, k.k, k.kernel, k.kernel, k.stride, k.pad};
  const kernels::ConvBatchNormPoolShape stem{cs, k.window};
  const BatchNormShape s = stem.batchnorm();
  const kernels::BatchNormPool pool = stem.pool();
  INFO("n=" << k.n << " c=" << k.c << " " << k.h << "x" << k.w << " k=" << k.k << " " << k.kernel << "x" << k.kernel
            << " stride " << k.stride << " pad " << k.pad << " window " << k.window << (relu ? " relu" : "")
            << (affine ? "" : " no affine") << " " << math_name(math) << " x offset " << k.offset);
  const float bound = 1.f / std::sqrt(float(stem.taps()));  // nn.Conv2d's init range
  const auto x = random_floats(cs.x_size(), k.offset - 1, k.offset + 1), w = random_floats(cs.w_size(), -bound, bound);
  const auto xm = kernels::rounded_operands(x, math), wm = kernels::rounded_operands(w, math);
  BatchNormHyper h;
  h.relu = relu;

  // The CPU twin, from its parts.
  Inputs in = make_inputs(s, affine);
  in.x.assign(cs.y_size(), 0.f);
  kernels::conv2d_forward(Exec{},
                          kernels::Conv2dArgs<float>{.shape = cs, .x = xm.data(), .w = wm.data(), .y = in.x.data()});
  const size_t pooled = static_cast<size_t>(s.n * s.c) * pool.p() * pool.q();
  const auto dy = random_floats(pooled);
  const PoolResults cpu = run_cpu_pool(s, pool, h, in, dy);
  std::vector<float> dw_cpu(cs.w_size());
  const auto dconv = kernels::rounded_operands(cpu.r.dx, math);
  kernels::conv2d_backward_weight(
      Exec{}, kernels::Conv2dArgs<float>{.shape = cs, .x = xm.data(), .dy = dconv.data(), .dw = dw_cpu.data()});

  // The GPU, every output poisoned; the backward from the CPU's argmax, pooled y and statistics.
  Exec gpu = cuda;
  gpu.math = math;
  const size_t C = static_cast<size_t>(s.c);
  DeviceBuffer<float> image(gpu, x), filters(gpu, w), dy_dev(gpu, dy);
  DeviceBuffer<float> y(gpu, poisoned(pooled + 1)), y_eval(gpu, poisoned(pooled + 1)), y_cpu(gpu, cpu.r.y);
  DeviceBuffer<int32_t> argmax(gpu, std::vector<int32_t>(pooled + 1, -7)),
      argmax_eval(gpu, std::vector<int32_t>(pooled + 1, -7));
  DeviceBuffer<int32_t> argmax_cpu(gpu, cpu.argmax);
  DeviceBuffer<float> gamma(gpu, affine ? in.gamma : std::vector<float>(1)),
      beta(gpu, affine ? in.beta : std::vector<float>(1));
  DeviceBuffer<float> mean(gpu, poisoned(C)), invstd(gpu, poisoned(C)), rm(gpu, in.rm), rv(gpu, in.rv);
  DeviceBuffer<float> mean_cpu(gpu, cpu.r.mean), invstd_cpu(gpu, cpu.r.invstd), rm_cpu(gpu, cpu.r.rm),
      rv_cpu(gpu, cpu.r.rv);
  DeviceBuffer<float> dw(gpu, poisoned(cs.w_size() + 1)), dgamma(gpu, poisoned(C)), dbeta(gpu, poisoned(C));
  DeviceBuffer<int64_t> batches(gpu, std::vector<int64_t>{5});
  const size_t ws_floats = std::max<size_t>(kernels::conv_batchnorm_pool_workspace_floats(Backend::cuda, stem), 1);
  DeviceBuffer<float> ws(gpu, poisoned(ws_floats));

  const kernels::ConvBatchNormPoolArgs<float> t{.shape = stem,
                                                .hyper = h,
                                                .x = image.get(),
                                                .w = filters.get(),
                                                .gamma = affine ? gamma.get() : nullptr,
                                                .beta = affine ? beta.get() : nullptr,
                                                .y = y.get(),
                                                .argmax = argmax.get(),
                                                .save_mean = mean.get(),
                                                .save_invstd = invstd.get(),
                                                .running_mean = rm.get(),
                                                .running_var = rv.get(),
                                                .num_batches_tracked = batches.get(),
                                                .workspace = ws.get()};
  kernels::conv_batchnorm_pool_forward_train(gpu, t);
  auto e = t;
  e.y = y_eval.get(), e.argmax = argmax_eval.get(), e.running_mean = rm_cpu.get(), e.running_var = rv_cpu.get();
  kernels::conv_batchnorm_pool_forward_eval(gpu, e);
  auto b = t;
  b.y = relu ? y_cpu.get() : nullptr, b.argmax = argmax_cpu.get(), b.save_mean = mean_cpu.get();
  b.save_invstd = invstd_cpu.get(), b.dy = dy_dev.get(), b.dw = dw.get();  // the forward's workspace: its moments
  b.dgamma = affine ? dgamma.get() : nullptr, b.dbeta = affine ? dbeta.get() : nullptr;
  kernels::conv_batchnorm_pool_backward(gpu, b);

  PoolResults g;
  auto y_all = y.download(), y_eval_all = y_eval.download(), dw_all = dw.download();
  REQUIRE(std::isnan(y_all.back()));  // nothing written past the end
  REQUIRE(std::isnan(y_eval_all.back()));
  REQUIRE(std::isnan(dw_all.back()));
  y_all.pop_back(), y_eval_all.pop_back(), dw_all.pop_back();
  g.r.y = y_all, g.r.y_eval = y_eval_all;
  g.r.mean = mean.download(), g.r.invstd = invstd.download(), g.r.rm = rm.download(), g.r.rv = rv.download();
  g.r.batches = batches.download()[0];
  g.argmax = argmax.download(), g.argmax_eval = argmax_eval.download();
  REQUIRE(g.argmax.back() == -7);
  REQUIRE(g.argmax_eval.back() == -7);
  g.argmax.pop_back(), g.argmax_eval.pop_back();

  // The convolution's own error, in units of its output.
  const double conv_err = fp32_dot(stem.taps()).rel_tol * max_abs(in.x);
  const double x_unit = max_abs(in.x), scale = output_scale(s, in, cpu.r);
  NT_REQUIRE_CLOSE(g.r.mean, cpu.r.mean,
                   (Tolerance{16 * kEps * x_unit + conv_err, 16 * kEps, "mean: fp32 sums, + conv"}));
  NT_REQUIRE_CLOSE(g.r.invstd, cpu.r.invstd, (Tolerance{0, 2e-5 + 4 * conv_err / x_unit, "invstd: fp32 M2, + conv"}));
  NT_REQUIRE_CLOSE(g.r.rm, cpu.r.rm,
                   (Tolerance{16 * kEps * x_unit + conv_err, 16 * kEps, "running_mean: as the mean"}));
  NT_REQUIRE_CLOSE(g.r.rv, cpu.r.rv, (Tolerance{0, 2e-5 + 4 * conv_err / x_unit, "running_var: as invstd"}));
  REQUIRE(g.r.batches == 6);
  Tolerance y_tol = train_y_tolerance(scale, x_unit), eval_tol = eval_y_tolerance(scale, x_unit);
  y_tol.abs_tol += 2 * scale * conv_err, eval_tol.abs_tol += scale * conv_err;
  NT_REQUIRE_CLOSE(g.r.y, cpu.r.y, y_tol);
  NT_REQUIRE_CLOSE(g.r.y_eval, cpu.r.y_eval, eval_tol);
  check_choices(s, pool, h, in, cpu, g, y_tol, eval_tol);

  const double count = double(s.n * s.hw), dconv_unit = max_abs(cpu.r.dx), xs = max_abs(x);
  const double rounding_flips = math == kernels::Math::tf32   ? std::ldexp(1.0, -10)
                                : math == kernels::Math::bf16 ? std::ldexp(1.0, -7)
                                                              : 0.0;
  const Tolerance dw_tol{
      64 * std::sqrt(count) * kEps * dconv_unit * xs + rounding_flips * std::sqrt(count) * dconv_unit * xs,
      8 * std::sqrt(count) * kEps, "dw: fp32 sums of count dconv*x terms (+ TF32 or BF16 rounding flips)"};
  NT_REQUIRE_CLOSE(dw_all, dw_cpu, dw_tol);
  if (affine) {
    double xhat = 1;
    for (size_t i = 0; i < in.x.size(); ++i) {
      const size_t c = (i / static_cast<size_t>(s.hw)) % C;
      xhat = std::max(xhat, std::abs(double(in.x[i] - cpu.r.mean[c]) * cpu.r.invstd[c]));
    }
    const double dy_unit = max_abs(dy);
    const Tolerance sums{64 * std::sqrt(count) * kEps * dy_unit * xhat + conv_err * scale * std::sqrt(count) * dy_unit,
                         8 * std::sqrt(count) * kEps, "dgamma/dbeta: fp32 sums of count terms, + conv"};
    NT_REQUIRE_CLOSE(dgamma.download(), cpu.r.dgamma, sums);
    NT_REQUIRE_CLOSE(dbeta.download(), cpu.r.dbeta, sums);
  }
}

TEST_CASE("the fused conv + batchnorm + max-pool stem on CUDA matches the CPU ops it fuses", "[cuda][batchnorm]") {
  // Odd planes and channel counts, 27 taps (the guarded tap path) with window 3, 5x5 stride 2, stride 2 without
  // padding (18 taps), 7 planes that a window of 2 does not cover, x around 40 (padding zeros far from the data),
  // and the cnn's first layer; fp32, TF32 and BF16.
  CudaExec cuda;
  const StemCase cases[] = {{3, 1, 9, 7, 5, 3, 1, 1, 2},    {2, 3, 8, 9, 4, 3, 1, 1, 3},
                            {2, 1, 11, 10, 3, 5, 2, 2, 2},  {4, 2, 7, 7, 6, 3, 2, 0, 2},
                            {5, 1, 7, 7, 3, 3, 1, 1, 2},    {16, 1, 12, 12, 8, 3, 1, 1, 2, 40.f},
                            {64, 1, 28, 28, 32, 3, 1, 1, 2}};
  for (const StemCase& k : cases)
    for (bool relu : {false, true})
      for (bool affine : {true, false})
        for (kernels::Math math : math_modes()) check_stem(cuda.exec, k, relu, affine, math);
}

TEST_CASE(
    "the fused stem on CUDA is bit-reproducible, also beside a gradient-only kernel and with its moments run ahead, "
    "and refuses a single value per channel",
    "[cuda][batchnorm]") {
  CudaExec cuda;
  const kernels::ConvBatchNormPoolShape stem{kernels::Conv2dShape{16, 1, 28, 28, 32, 3, 3, 1, 1}, 2};
  const auto x = random_floats(stem.conv.x_size()), w = random_floats(stem.conv.w_size(), -0.3f, 0.3f);
  const size_t pooled = stem.conv.y_size() / 4, C = 32;
  const auto dy = random_floats(pooled);
  BatchNormHyper h;
  h.relu = true;
  // The layer after the stem in the cnn: its backward ends with dW's split-K reduction, which the stem's backward
  // reduce may run beside (ConvBatchNormPoolArgs::overlaps_previous).
  const kernels::Conv2dShape next{16, 32, 14, 14, 64, 3, 3, 1, 1};
  DeviceBuffer<float> next_x(cuda.exec, random_floats(next.x_size())), next_dy(cuda.exec, random_floats(next.y_size()));
  DeviceBuffer<float> next_w(cuda.exec, random_floats(next.w_size())), next_dw(cuda.exec, poisoned(next.w_size()));
  DeviceBuffer<float> next_dx(cuda.exec, poisoned(next.x_size()));
  DeviceBuffer<float> next_ws(cuda.exec, poisoned(kernels::conv2d_workspace_floats(Backend::cuda, next)));
  // ahead: the moments first (conv_batchnorm_pool_moments), then an update that writes w (an SGD step of lr 1 from
  // zeros onto w: 0 - 1·(-w) is w exactly), as a trainer's prepared batch meets the step's update; the training
  // forward with moments_ready must wait for it before it reads w.
  const std::vector<float> minus_w = [&] {
    std::vector<float> m(w.size());
    std::transform(w.begin(), w.end(), m.begin(), [](float v) { return -v; });
    return m;
  }();
  DeviceBuffer<float> minus_wd(cuda.exec, minus_w);
  auto run = [&](bool beside, bool ahead = false) {
    DeviceBuffer<float> xd(cuda.exec, x), wd(cuda.exec, ahead ? std::vector<float>(w.size(), 0.f) : w),
        dyd(cuda.exec, dy), y(cuda.exec, poisoned(pooled));
    DeviceBuffer<int32_t> argmax(cuda.exec, std::vector<int32_t>(pooled, -7));
    DeviceBuffer<float> mean(cuda.exec, poisoned(C)), invstd(cuda.exec, poisoned(C)), dw(cuda.exec, poisoned(288));
    DeviceBuffer<float> dgamma(cuda.exec, poisoned(C)), dbeta(cuda.exec, poisoned(C));
    DeviceBuffer<float> ws(cuda.exec, poisoned(kernels::conv_batchnorm_pool_workspace_floats(Backend::cuda, stem)));
    const kernels::ConvBatchNormPoolArgs<float> t{.shape = stem,
                                                  .hyper = h,
                                                  .x = xd.get(),
                                                  .w = wd.get(),
                                                  .y = y.get(),
                                                  .argmax = argmax.get(),
                                                  .save_mean = mean.get(),
                                                  .save_invstd = invstd.get(),
                                                  .dy = dyd.get(),
                                                  .dw = dw.get(),
                                                  .dgamma = dgamma.get(),
                                                  .dbeta = dbeta.get(),
                                                  .workspace = ws.get(),
                                                  .overlaps_previous = beside,
                                                  .moments_ready = ahead};
    if (ahead) {
      kernels::conv_batchnorm_pool_moments(cuda.exec, t);
      kernels::sgd_update(
          cuda.exec,
          kernels::SgdArgs{
              .n = w.size(), .params = wd.get(), .grads = minus_wd.get(), .hyper = kernels::SgdHyper{.lr = 1.f}});
    }
    kernels::conv_batchnorm_pool_forward_train(cuda.exec, t);
    if (beside) {
      REQUIRE(kernels::conv2d_backward(cuda.exec, kernels::Conv2dArgs<float>{.shape = next,
                                                                             .x = next_x.get(),
                                                                             .w = next_w.get(),
                                                                             .dy = next_dy.get(),
                                                                             .dx = next_dx.get(),
                                                                             .dw = next_dw.get(),
                                                                             .workspace = next_ws.get()}));
    }
    kernels::conv_batchnorm_pool_backward(cuda.exec, t);
    std::vector<float> out = y.download();
    for (const auto& part : {dw.download(), dgamma.download(), dbeta.download(), mean.download()})
      out.insert(out.end(), part.begin(), part.end());
    return out;
  };
  const auto first = run(false);
  CHECK(same_bits(first, run(false)));
  CHECK(same_bits(first, run(true)));
  CHECK(same_bits(first, run(false, /*ahead=*/true)));
  CHECK(same_bits(first, run(true, /*ahead=*/true)));

  // As PyTorch: training needs more than one value per channel.
  const kernels::ConvBatchNormPoolShape single{kernels::Conv2dShape{1, 1, 2, 2, 3, 2, 2, 1, 0}, 1};
  DeviceBuffer<float> xd(cuda.exec, random_floats(4)), wd(cuda.exec, random_floats(12)), y(cuda.exec, poisoned(3));
  DeviceBuffer<int32_t> argmax(cuda.exec, std::vector<int32_t>(3, -7));
  DeviceBuffer<float> mean(cuda.exec, poisoned(3)), invstd(cuda.exec, poisoned(3)), ws(cuda.exec, poisoned(64));
  const kernels::ConvBatchNormPoolArgs<float> t{.shape = single,
                                                .hyper = h,
                                                .x = xd.get(),
                                                .w = wd.get(),
                                                .y = y.get(),
                                                .argmax = argmax.get(),
                                                .save_mean = mean.get(),
                                                .save_invstd = invstd.get(),
                                                .workspace = ws.get()};
  REQUIRE_THROWS_AS(kernels::conv_batchnorm_pool_forward_train(cuda.exec, t), Error);
}

TEST_CASE("the fused stem on CUDA writes its output staged in TF32 or BF16 for the next convolution: y's bits, rounded",
          "[cuda][batchnorm][bf16]") {
  // ConvBatchNormPoolArgs::y_staged: the forwards write y channels-last in the math's element (BF16 bits, or fp32
  // rounded to TF32) instead of y, or beside it where y is set too, and the backward's ReLU reads y where it is set,
  // else the staged copy. Against the same op with y alone: the staged values are y's, rounded, exactly, y is left as
  // it was (or, written beside, y's bits), the other outputs (argmax, statistics) and the backward's (dw, dgamma,
  // dbeta) the same bits. The cnn's stem, an odd plane of 8 channels, and 25 taps (a channel a thread:
  // no vector stores); in TF32 and BF16.
  CudaExec cuda;
  const StemCase cases[] = {
      {64, 1, 28, 28, 32, 3, 1, 1, 2}, {5, 1, 9, 7, 8, 3, 1, 1, 2}, {3, 1, 12, 12, 16, 5, 1, 2, 2}};
  for (const StemCase& k : cases)
    for (const kernels::Math math : {kernels::Math::tf32, kernels::Math::bf16}) {
      if (!cuda_device().has_tf32()) continue;
      Exec gpu = cuda.exec;
      gpu.math = math;
      const kernels::ConvBatchNormPoolShape stem{
          kernels::Conv2dShape{k.n, k.c, k.h, k.w, k.k, k.kernel, k.kernel, k.stride, k.pad}, k.window};
      INFO("n=" << k.n << " " << k.h << "x" << k.w << " k=" << k.k << " " << k.kernel << "x" << k.kernel << " "
                << math_name(math));
      const int64_t planes = int64_t(stem.pool().p()) * stem.pool().q();
      const size_t pooled = size_t(k.n) * k.k * planes, C = size_t(k.k);
      const auto x = random_floats(stem.conv.x_size()), w = random_floats(stem.conv.w_size(), -0.3f, 0.3f);
      const auto dy = random_floats(pooled), gamma = random_floats(C, 0.5f, 1.5f), beta = random_floats(C);
      BatchNormHyper h;
      h.relu = true;
      // Everything each run writes: y (or the staged bits, as floats), argmax, statistics, eval's y, the gradients;
      // with_y: y too (the staged runs), whose bits go to y_bits.
      std::vector<std::vector<float>> y_bits;
      auto run = [&](bool staged, bool with_y) {
        DeviceBuffer<float> xd(gpu, x), wd(gpu, w), dyd(gpu, dy), gd(gpu, gamma), bd(gpu, beta);
        DeviceBuffer<float> y(gpu, poisoned(pooled)), y_eval(gpu, poisoned(pooled));
        const size_t words = staged_words(math, pooled);
        DeviceBuffer<uint32_t> y_staged(gpu, std::vector<uint32_t>(words + 4, kStagedPoison)),
            y_eval_staged(gpu, std::vector<uint32_t>(words + 4, kStagedPoison));
        DeviceBuffer<int32_t> argmax(gpu, std::vector<int32_t>(pooled, -7)), argmax_eval(gpu, argmax.download());
        DeviceBuffer<float> mean(gpu, poisoned(C)), invstd(gpu, poisoned(C)), rm(gpu, std::vector<float>(C, 0.f)),
            rv(gpu, std::vector<float>(C, 1.f));
        DeviceBuffer<float> dw(gpu, poisoned(stem.conv.w_size())), dgamma(gpu, poisoned(C)), dbeta(gpu, poisoned(C));
        DeviceBuffer<float> ws(gpu, poisoned(kernels::conv_batchnorm_pool_workspace_floats(Backend::cuda, stem)));
        kernels::ConvBatchNormPoolArgs<float> t{.shape = stem,
                                                .hyper = h,
                                                .x = xd.get(),
                                                .w = wd.get(),
                                                .gamma = gd.get(),
                                                .beta = bd.get(),
                                                .y = with_y ? y.get() : nullptr,
                                                .argmax = argmax.get(),
                                                .save_mean = mean.get(),
                                                .save_invstd = invstd.get(),
                                                .running_mean = rm.get(),
                                                .running_var = rv.get(),
                                                .dy = dyd.get(),
                                                .dw = dw.get(),
                                                .dgamma = dgamma.get(),
                                                .dbeta = dbeta.get(),
                                                .workspace = ws.get(),
                                                .y_staged = staged ? y_staged.get() : nullptr};
        kernels::conv_batchnorm_pool_forward_train(gpu, t);
        kernels::conv_batchnorm_pool_backward(gpu, t);
        auto e = t;
        e.y = with_y ? y_eval.get() : nullptr, e.argmax = argmax_eval.get();
        e.y_staged = staged ? y_eval_staged.get() : nullptr;
        kernels::conv_batchnorm_pool_forward_eval(gpu, e);
        std::vector<std::vector<float>> out;
        if (staged) {
          auto bits = y_staged.download(), eval_bits = y_eval_staged.download();
          for (const auto* b : {&bits, &eval_bits})
            CHECK(std::all_of(b->begin() + long(words), b->end(), [](uint32_t v) { return v == kStagedPoison; }));
          bits.resize(words), eval_bits.resize(words);
          out.push_back(unstaged_copy(math, bits, k.n, k.k, planes));
          out.push_back(unstaged_copy(math, eval_bits, k.n, k.k, planes));
          const auto written = y.download();  // y itself only where it is set
          if (with_y)
            y_bits.push_back(written);
          else
            CHECK(std::all_of(written.begin(), written.end(), [](float v) { return std::isnan(v); }));
        } else {
          y_bits.push_back(y.download());
          out.push_back(kernels::rounded_operands(y.download(), math));  // what a staged y holds
          out.push_back(kernels::rounded_operands(y_eval.download(), math));
          CHECK(staged_copy(math, y.download(), k.n, k.k, planes) ==
                staged_copy(math, out[0], k.n, k.k, planes));  // rounding twice changes nothing
        }
        for (const auto& v : {argmax.download(), argmax_eval.download()}) out.emplace_back(v.begin(), v.end());
        for (auto* b : {&mean, &invstd, &rm, &rv, &dw, &dgamma, &dbeta}) out.push_back(b->download());
        return out;
      };
      const auto from_y = run(false, true);
      for (const bool with_y : {false, true}) {
        INFO("staged" << (with_y ? ", y beside it" : " alone"));
        const auto from_staged = run(true, with_y);
        for (size_t i = 0; i < from_y.size(); ++i) {
          INFO("output " << i
                         << " (y, eval y, argmax, eval argmax, mean, invstd, running mean, var, dw, dgamma, dbeta)");
          CHECK(same_bits(from_staged[i], from_y[i]));
        }
      }
      REQUIRE(y_bits.size() == 2);
      CHECK(same_bits(y_bits[1], y_bits[0]));  // y written beside the staged copy: the same bits as alone
    }
}

TEST_CASE(
    "the fused stem on CUDA stages the next convolution's filters beside its staged output, with the bits of the "
    "convolution's own stage",
    "[cuda][batchnorm][bf16]") {
  // ConvBatchNormPoolArgs::next_filters (kernels/conv.h, Conv2dFilterStage): the stem's forwards write conv2's filters
  // in their staged form into conv2's workspace, and conv2d_forward given filters_staged then launches no stage kernel.
  // Against conv2d_forward staging them itself into a second workspace: the staged filters' bytes and y, bit for bit,
  // after the training forward and after the evaluation forward; both workspaces poisoned first. The cnn's stem and
  // conv2, in TF32 and BF16. Nothing to stage in fp32, on the CPU, or for a shape the channels-last plan does not take.
  const kernels::Math math = GENERATE(kernels::Math::tf32, kernels::Math::bf16);
  INFO(math_name(math));
  if (!cuda_device().has_tf32()) {
    WARN("filters staged by the stem not checked: " << cuda_device().name << " runs " << cuda_device().code_path());
    return;
  }
  CudaExec cuda;
  Exec gpu = cuda.exec;
  gpu.math = math;
  const kernels::ConvBatchNormPoolShape stem{kernels::Conv2dShape{64, 1, 28, 28, 32, 3, 3, 1, 1}, 2};
  const kernels::Conv2dShape conv2{64, 32, 14, 14, 64, 3, 3, 1, 1};
  const size_t pooled = size_t(64) * 32 * 14 * 14, C = 32;
  DeviceBuffer<float> x(gpu, random_floats(stem.conv.x_size())), w(gpu, random_floats(stem.conv.w_size(), -0.3f, 0.3f));
  DeviceBuffer<float> w2(gpu, random_floats(conv2.w_size(), -0.2f, 0.2f));
  DeviceBuffer<float> gamma(gpu, random_floats(C, 0.5f, 1.5f)), beta(gpu, random_floats(C));
  DeviceBuffer<float> mean(gpu, poisoned(C)), invstd(gpu, poisoned(C)), rm(gpu, std::vector<float>(C, 0.f)),
      rv(gpu, std::vector<float>(C, 1.f));
  DeviceBuffer<int32_t> argmax(gpu, std::vector<int32_t>(pooled, -7));
  DeviceBuffer<uint32_t> y_staged(gpu, std::vector<uint32_t>(staged_words(math, pooled), kStagedPoison));
  DeviceBuffer<float> stem_ws(gpu, poisoned(kernels::conv_batchnorm_pool_workspace_floats(Backend::cuda, stem)));
  const size_t ws_floats = kernels::conv2d_workspace_floats(Backend::cuda, conv2);
  DeviceBuffer<float> ws(gpu, poisoned(ws_floats)), own_ws(gpu, poisoned(ws_floats));
  const kernels::Conv2dFilterStage next = kernels::conv2d_filter_stage(Backend::cuda, conv2, math, w2.get(), ws.get());
  REQUIRE(next.filters != nullptr);
  REQUIRE(next.w == w2.get());
  const size_t first = size_t(static_cast<const char*>(next.filters) - reinterpret_cast<const char*>(ws.get())) / 4;
  const size_t filter_floats = conv2.w_size() * (math == kernels::Math::bf16 ? 2 : 4) / 4;
  REQUIRE(first + filter_floats <= ws_floats);
  kernels::ConvBatchNormPoolArgs<float> t{.shape = stem,
                                          .x = x.get(),
                                          .w = w.get(),
                                          .gamma = gamma.get(),
                                          .beta = beta.get(),
                                          .argmax = argmax.get(),
                                          .save_mean = mean.get(),
                                          .save_invstd = invstd.get(),
                                          .running_mean = rm.get(),
                                          .running_var = rv.get(),
                                          .workspace = stem_ws.get(),
                                          .y_staged = y_staged.get(),
                                          .next_filters = next};
  t.hyper.relu = true;
  for (const bool train : {true, false}) {
    INFO((train ? "training forward" : "evaluation forward"));
    if (train)
      kernels::conv_batchnorm_pool_forward_train(gpu, t);
    else
      kernels::conv_batchnorm_pool_forward_eval(gpu, t);
    DeviceBuffer<float> y(gpu, poisoned(conv2.y_size())), own_y(gpu, poisoned(conv2.y_size()));
    kernels::Conv2dArgs<float> a{
        .shape = conv2, .w = w2.get(), .y = y.get(), .workspace = ws.get(), .x_staged = y_staged.get()};
    a.filters_staged = true;
    kernels::conv2d_forward(gpu, a);
    a.y = own_y.get(), a.workspace = own_ws.get(), a.filters_staged = false;
    kernels::conv2d_forward(gpu, a);
    const auto staged = ws.download(), own = own_ws.download();
    CHECK(same_bits(std::vector<float>(staged.begin() + long(first), staged.begin() + long(first + filter_floats)),
                    std::vector<float>(own.begin() + long(first), own.begin() + long(first + filter_floats))));
    CHECK(same_bits(y.download(), own_y.download()));
  }
  // Staged filters go beside a staged output only.
  auto no_output = t;
  no_output.y_staged = nullptr;
  DeviceBuffer<float> y(gpu, poisoned(pooled));
  no_output.y = y.get();
  CHECK_THROWS_WITH(kernels::conv_batchnorm_pool_forward_eval(gpu, no_output), Contains("staged"));
  CHECK(kernels::conv2d_filter_stage(Backend::cuda, conv2, kernels::Math::fp32, w2.get(), ws.get()).filters == nullptr);
  CHECK(kernels::conv2d_filter_stage(Backend::cpu, conv2, math, w2.get(), ws.get()).filters == nullptr);
  const kernels::Conv2dShape small{2, 32, 14, 14, 64, 3, 3, 1, 1};  // too few pixels for the channels-last tiles
  CHECK(kernels::conv2d_filter_stage(Backend::cuda, small, math, w2.get(), ws.get()).filters == nullptr);
}

}  // namespace
}  // namespace nt::test
