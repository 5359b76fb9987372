// Every op of every kernel family in one table, in the spirit of ggml's test-backend-ops: a row per op knows how
// to build one random case at odd sizes, poison its outputs, run it on a backend and return its outputs
// (support/op_outputs.h). For each row the test
//   1. runs it on the CPU (f32) and twice on CUDA, with Exec::programmatic_launch on (debug_sync off, so that
//      kernels really may launch while their predecessor runs) and then off; TF32 stays off (fp32 only);
//   2. requires the two CUDA runs to be the same bits: programmatic launch never changes a result;
//   3. requires CUDA against the CPU within the row's tolerance for each output, copied from the family's own
//      test (cited beside it), exact where that test is exact;
//   4. requires every output element written (no poison left; the CPU's neither) and no NaN unless the CPU has
//      one there.
// The family tests (tests/cuda/test_*_cuda.cpp) sweep shapes, alignments and edge values; this one holds every
// op to the same four rules in one place, on inputs both backends get bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/activation.h"
#include "kernels/batch.h"
#include "kernels/batchnorm.h"
#include "kernels/classifier_head.h"
#include "kernels/conv.h"
#include "kernels/conv_batchnorm_pool.h"
#include "kernels/dropout.h"
#include "kernels/gemm.h"
#include "kernels/nonfinite.h"
#include "kernels/optim.h"
#include "kernels/pool.h"
#include "kernels/runtime.h"
#include "kernels/softmax_xent.h"
#include "support/batchnorm_checks.h"
#include "support/op_outputs.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Backend;
using kernels::Exec;
template <class T>
using Buf = DeviceBuffer<T>;

constexpr int64_t kIntPoison = -7;  // what integer outputs (argmax, labels) hold before a run
constexpr int64_t kMaskPoison = 7;  // dropout's mask bytes (0/1 when written)

// ---- what a row is ----------------------------------------------------------------------------------------

// How one output of a row compares with the CPU's.
struct Expect {
  enum class How { exact, close, custom };
  std::string output;
  How how = How::exact;
  Tolerance tol{0, 0, ""};  // close; for exact, tol.reason says why it is exact
  std::function<void(const OutputArray& got, const OutputArray& want)> check;  // custom
};

Expect exact(std::string output, const char* why) { return {std::move(output), Expect::How::exact, {0, 0, why}, {}}; }
Expect close(std::string output, Tolerance tol) { return {std::move(output), Expect::How::close, tol, {}}; }
Expect custom(std::string output, const char* why, std::function<void(const OutputArray&, const OutputArray&)> check) {
  return {std::move(output), Expect::How::custom, {0, 0, why}, std::move(check)};
}

// One random case of a row: its inputs live in the lambdas' captures, so every run sees the same ones.
struct RowCase {
  std::function<Outputs(const Exec&)> run;                        // uploads, poisons, runs the op, downloads
  std::function<std::vector<Expect>(const Outputs& cpu)> expect;  // the tolerances, from the case and the CPU run
};

struct Row {
  std::string op;
  std::string shape;
  std::function<RowCase()> make;
  // "" when the GPU code path has what the row needs; else why the row checks something else, said as a WARN.
  std::function<std::string()> caveat = [] { return std::string(); };
};

// ---- helpers --------------------------------------------------------------------------------------------

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float e : v) m = std::max(m, std::abs(double(e)));
  return m;
}

template <class T>
std::shared_ptr<const T> keep(T value) {
  return std::make_shared<const T>(std::move(value));
}

std::vector<float> at_least_one(std::vector<float> v) {  // device buffers are never empty
  if (v.empty()) v.push_back(kPoison);
  return v;
}

const char* kBitsSmallOps = "bit for bit: same fp32 operations (test_activation_cuda.cpp, test_optim_cuda.cpp)";
const char* kBitsCnnSmallOps =
    "bit for bit: integer hash, selects, fixed-order sums (test_dropout_cuda.cpp, test_pool_cuda.cpp)";
const char* kIntegerCount = "an integer count: exact whatever the order (test_nonfinite_cuda.cpp)";

// ---- elementwise, dropout, pooling -----------------------------------------------------------------------

std::vector<Row> elementwise_rows() {
  std::vector<Row> rows;
  const size_t n = 1001;
  rows.push_back({"relu_forward", "n=1001", [n] {
                    auto values = random_floats(n);
                    values[1] = -0.f, values[2] = 0.f;
                    auto in = keep(values);
                    return RowCase{[in](const Exec& e) {
                                     Buf<float> x(e, *in), y(e, poisoned(in->size()));
                                     kernels::relu_forward(
                                         e, kernels::ReluArgs<float>{.n = in->size(), .x = x.get(), .y = y.get()});
                                     Outputs o;
                                     o.add("y", y.download());
                                     return o;
                                   },
                                   [](const Outputs&) { return std::vector<Expect>{exact("y", kBitsSmallOps)}; }};
                  }});
  rows.push_back({"relu_backward", "n=1001", [n] {
                    struct In {
                      std::vector<float> y, dy;
                    };
                    auto forward = random_floats(n);
                    for (float& v : forward) v = std::max(v, 0.f);  // a forward output: half of it 0
                    auto in = keep(In{forward, random_floats(n)});
                    return RowCase{[in](const Exec& e) {
                                     Buf<float> y(e, in->y), dy(e, in->dy), dx(e, poisoned(in->y.size()));
                                     kernels::relu_backward(
                                         e, kernels::ReluArgs<float>{
                                                .n = in->y.size(), .y = y.get(), .dy = dy.get(), .dx = dx.get()});
                                     Outputs o;
                                     o.add("dx", dx.download());
                                     return o;
                                   },
                                   [](const Outputs&) { return std::vector<Expect>{exact("dx", kBitsSmallOps)}; }};
                  }});
  rows.push_back({"dropout_forward", "n=1001 p=0.3 draw 5", [n] {
                    auto in = keep(random_floats(n, -3, 3));
                    return RowCase{[in](const Exec& e) {
                                     const size_t count = in->size();
                                     Buf<float> x(e, *in), y(e, poisoned(count));
                                     Buf<uint8_t> mask(e, std::vector<uint8_t>(count, uint8_t(kMaskPoison)));
                                     Buf<uint64_t> counter(e, std::vector<uint64_t>{5, 0});
                                     kernels::dropout_forward(e, kernels::DropoutArgs<float>{.n = count,
                                                                                             .p = 0.3f,
                                                                                             .seed = 0x5EED,
                                                                                             .counter = counter.get(),
                                                                                             .x = x.get(),
                                                                                             .y = y.get(),
                                                                                             .mask = mask.get()});
                                     Outputs o;
                                     o.add("y", y.download());
                                     o.add_ints("mask", mask.download(), kMaskPoison);
                                     o.add_ints("counter", counter.download());
                                     return o;
                                   },
                                   [](const Outputs&) {
                                     return std::vector<Expect>{exact("y", kBitsCnnSmallOps),
                                                                exact("mask", kBitsCnnSmallOps),
                                                                exact("counter", "the draw counter: exact")};
                                   }};
                  }});
  rows.push_back({"dropout_backward", "n=1001 p=0.3", [n] {
                    struct In {
                      std::vector<uint8_t> mask;
                      std::vector<float> dy;
                    };
                    std::vector<uint8_t> bytes(n);
                    for (auto& m : bytes) m = uint8_t(rng()() % 2);
                    auto in = keep(In{bytes, random_floats(n)});
                    return RowCase{
                        [in](const Exec& e) {
                          const size_t count = in->dy.size();
                          Buf<uint8_t> mask(e, in->mask);
                          Buf<float> dy(e, in->dy), dx(e, poisoned(count));
                          kernels::dropout_backward(
                              e, kernels::DropoutArgs<float>{
                                     .n = count, .p = 0.3f, .mask = mask.get(), .dy = dy.get(), .dx = dx.get()});
                          Outputs o;
                          o.add("dx", dx.download());
                          return o;
                        },
                        [](const Outputs&) { return std::vector<Expect>{exact("dx", kBitsCnnSmallOps)}; }};
                  }});

  const kernels::Pool2dShape ps{5, 3, 9, 7, 3, 2};  // overlapping windows; a row and a column outside them
  const size_t pin = size_t(ps.n) * ps.c * ps.h * ps.w, pout = size_t(ps.n) * ps.c * ps.p() * ps.q();
  rows.push_back(
      {"maxpool2d_forward", "N=5 C=3 9x7 window 3 stride 2", [ps, pin] {
         auto in = keep(random_floats(pin, -2, 2));
         return RowCase{
             [in, ps](const Exec& e) {
               const size_t out = size_t(ps.n) * ps.c * ps.p() * ps.q();
               Buf<float> x(e, *in), y(e, poisoned(out));
               Buf<int32_t> argmax(e, std::vector<int32_t>(out, int32_t(kIntPoison)));
               kernels::maxpool2d_forward(
                   e, kernels::MaxPool2dArgs<float>{.shape = ps, .x = x.get(), .y = y.get(), .argmax = argmax.get()});
               Outputs o;
               o.add("y", y.download());
               o.add_ints("argmax", argmax.download(), kIntPoison);
               return o;
             },
             [](const Outputs&) {
               return std::vector<Expect>{exact("y", kBitsCnnSmallOps), exact("argmax", kBitsCnnSmallOps)};
             }};
       }});
  rows.push_back(
      {"maxpool2d_backward", "N=5 C=3 9x7 window 3 stride 2", [ps, pin, pout] {
         struct In {
           std::vector<int32_t> argmax;
           std::vector<float> dy;
         };
         const auto x = random_floats(pin, -2, 2);
         std::vector<float> y(pout);
         std::vector<int32_t> chosen(pout);
         kernels::maxpool2d_forward(
             Exec{}, kernels::MaxPool2dArgs<float>{.shape = ps, .x = x.data(), .y = y.data(), .argmax = chosen.data()});
         auto in = keep(In{chosen, random_floats(pout)});
         return RowCase{[in, ps, pin](const Exec& e) {
                          Buf<int32_t> argmax(e, in->argmax);
                          Buf<float> dy(e, in->dy), dx(e, poisoned(pin));
                          kernels::maxpool2d_backward(
                              e, kernels::MaxPool2dArgs<float>{
                                     .shape = ps, .argmax = argmax.get(), .dy = dy.get(), .dx = dx.get()});
                          Outputs o;
                          o.add("dx", dx.download());
                          return o;
                        },
                        [](const Outputs&) { return std::vector<Expect>{exact("dx", kBitsCnnSmallOps)}; }};
       }});
  return rows;
}

// ---- optimizer updates ------------------------------------------------------------------------------------

std::vector<Row> optimizer_rows() {
  std::vector<Row> rows;
  const size_t n = 1001;
  rows.push_back({"sgd_update", "n=1001 lr 0.05 momentum 0.9 wd 5e-4", [n] {
                    struct In {
                      std::vector<float> p, g, v;
                    };
                    auto in = keep(In{random_floats(n), random_floats(n), random_floats(n)});
                    return RowCase{
                        [in](const Exec& e) {
                          const size_t count = in->p.size();
                          Buf<float> p(e, in->p), g(e, in->g), v(e, in->v);
                          kernels::sgd_update(e, {.n = count,
                                                  .params = p.get(),
                                                  .grads = g.get(),
                                                  .velocity = v.get(),
                                                  .hyper = {0.05f, 0.9f, 5e-4f}});
                          Outputs o;
                          o.add("params", p.download());
                          o.add("velocity", v.download());
                          return o;
                        },
                        [](const Outputs&) {
                          return std::vector<Expect>{exact("params", kBitsSmallOps), exact("velocity", kBitsSmallOps)};
                        }};
                  }});
  for (const bool decoupled : {false, true}) {
    rows.push_back({decoupled ? "adam_update (AdamW)" : "adam_update (Adam)", "n=1001 wd 0.01 step 3", [n, decoupled] {
                      struct In {
                        std::vector<float> p, g, m, v;
                      };
                      auto in = keep(In{random_floats(n), random_floats(n, -2, 2), random_floats(n, -0.1f, 0.1f),
                                        random_floats(n, 0.f, 0.01f)});
                      return RowCase{[in, decoupled](const Exec& e) {
                                       const size_t count = in->p.size();
                                       Buf<float> p(e, in->p), g(e, in->g), m(e, in->m), v(e, in->v);
                                       Buf<uint64_t> step(e, std::vector<uint64_t>{2, 0});  // this call: t = 3
                                       kernels::AdamHyper h;
                                       h.weight_decay = 0.01, h.decoupled = decoupled;
                                       kernels::adam_update(e, {.n = count,
                                                                .params = p.get(),
                                                                .grads = g.get(),
                                                                .m = m.get(),
                                                                .v = v.get(),
                                                                .hyper = h,
                                                                .step = step.get()});
                                       Outputs o;
                                       o.add("params", p.download());
                                       o.add("m", m.download());
                                       o.add("v", v.download());
                                       o.add_ints("step", step.download());
                                       return o;
                                     },
                                     [](const Outputs&) {
                                       return std::vector<Expect>{
                                           close("params", kAdamTolerance), close("m", kAdamTolerance),
                                           close("v", kAdamTolerance), exact("step", "the step counter: exact")};
                                     }};
                    }});
  }
  return rows;
}

// ---- batch gather, nonfinite count ---------------------------------------------------------------------------

struct GatherIn {
  int N, C, H, W, B, shift;
  bool flip;
  int64_t first;
  std::vector<uint8_t> images, labels;
  std::vector<int32_t> perm;
  uint64_t shift_key, flip_key;
};

GatherIn make_gather(int N, int C, int H, int W, int B, int64_t first, int shift, bool flip) {
  GatherIn g{N,
             C,
             H,
             W,
             B,
             shift,
             flip,
             first,
             std::vector<uint8_t>(size_t(N) * C * H * W),
             std::vector<uint8_t>(N),
             std::vector<int32_t>(N),
             kernels::counter_key(rng()(), 3),
             kernels::counter_key(rng()(), 3)};
  for (auto& px : g.images) px = uint8_t(rng()() % 256);
  for (auto& l : g.labels) l = uint8_t(rng()() % 10);
  std::iota(g.perm.begin(), g.perm.end(), 0);
  std::shuffle(g.perm.begin(), g.perm.end(), rng());
  return g;
}

Row gather_row(std::string op, std::string shape, int N, int C, int H, int W, int B, int64_t first, int shift,
               bool flip) {
  return {std::move(op), std::move(shape), [=] {
            auto in = keep(make_gather(N, C, H, W, B, first, shift, flip));
            return RowCase{[in](const Exec& e) {
                             const int D = in->C * in->H * in->W;
                             Buf<uint8_t> images(e, in->images), labels(e, in->labels);
                             Buf<int32_t> perm(e, in->perm);
                             Buf<uint64_t> keys(e, std::vector<uint64_t>{in->shift_key, in->flip_key});
                             Buf<float> x(e, poisoned(size_t(in->B) * D));
                             Buf<int32_t> y(e, std::vector<int32_t>(size_t(in->B), int32_t(kIntPoison)));
                             const float mean[3] = {0.49f, 0.48f, 0.45f}, std_dev[3] = {0.25f, 0.24f, 0.26f};
                             kernels::BatchSource src{.images = images.get(),
                                                      .labels = labels.get(),
                                                      .perm = perm.get(),
                                                      .D = D,
                                                      .mean = kernels::ChannelValues(mean, in->C),
                                                      .std = kernels::ChannelValues(std_dev, in->C)};
                             if (in->shift > 0 || in->flip) src.height = in->H, src.width = in->W;
                             src.shift = in->shift, src.shift_key = keys.get();
                             src.flip = in->flip, src.flip_key = keys.get() + 1;
                             kernels::gather_batch(
                                 e, {.src = src, .first = in->first, .B = in->B, .x = x.get(), .y = y.get()});
                             Outputs o;
                             o.add("x", x.download());
                             o.add_ints("y", y.download(), kIntPoison);
                             return o;
                           },
                           [](const Outputs&) {
                             const char* why =
                                 "bit for bit: ToTensor/Normalize in fp32, integer hashes shared by "
                                 "host and device (test_batch_cuda.cpp)";
                             return std::vector<Expect>{exact("x", why), exact("y", why)};
                           }};
          }};
}

Row nonfinite_row() {
  return {"count_nonfinite", "n=10007, 9 NaN/inf planted", [] {
            auto values = random_floats(10007);
            const float planted[] = {kPoison, INFINITY, -INFINITY};
            for (int i = 0; i < 9; ++i) values[rng()() % values.size()] = planted[i % 3];
            values[17] = std::numeric_limits<float>::max(), values[18] = std::numeric_limits<float>::denorm_min();
            auto in = keep(values);
            return RowCase{[in](const Exec& e) {
                             Buf<float> x(e, *in);
                             Buf<int64_t> count(e, std::vector<int64_t>{41});  // accumulated into
                             kernels::count_nonfinite(e,
                                                      {.x = x.get(), .n = int64_t(in->size()), .count = count.get()});
                             Outputs o;
                             o.add_ints("count", count.download());
                             return o;
                           },
                           [](const Outputs&) { return std::vector<Expect>{exact("count", kIntegerCount)}; }};
          }};
}

// ---- softmax cross-entropy ------------------------------------------------------------------------------------

// The tolerances are test_softmax_xent_cuda.cpp's: test::xent_loss_allowed and test::xent_grad_tolerance.

constexpr double kLossBefore = 0.5;  // the accumulators already hold an earlier batch
constexpr int64_t kCorrectBefore = 2;

namespace xent_case {
constexpr int B = 7, C = 10;
}

Row xent_row(bool with_gradient) {
  using namespace xent_case;
  return {with_gradient ? "softmax_xent" : "softmax_xent (evaluation: no gradient)", "B=7 C=10", [=] {
            struct In {
              std::vector<float> logits;
              std::vector<int32_t> labels;
            };
            auto in = keep(In{random_floats(size_t(B) * C, -3, 3), random_labels(B, C)});
            return RowCase{[in, with_gradient](const Exec& e) {
                             Buf<float> logits(e, in->logits), dlogits(e, poisoned(size_t(B) * C));
                             Buf<int32_t> labels(e, in->labels);
                             Buf<double> loss(e, std::vector<double>{kLossBefore});
                             Buf<int64_t> correct(e, std::vector<int64_t>{kCorrectBefore});
                             kernels::softmax_xent(
                                 e, kernels::SoftmaxXentArgs<float>{.B = B,
                                                                    .C = C,
                                                                    .logits = logits.get(),
                                                                    .labels = labels.get(),
                                                                    .dlogits = with_gradient ? dlogits.get() : nullptr,
                                                                    .loss_sum = loss.get(),
                                                                    .correct = correct.get()});
                             Outputs o;
                             if (with_gradient) o.add("dlogits", dlogits.download());
                             o.add("loss_sum", loss.download());
                             o.add_ints("correct", correct.download());
                             return o;
                           },
                           [with_gradient](const Outputs&) {
                             std::vector<Expect> x;
                             if (with_gradient) x.push_back(close("dlogits", xent_grad_tolerance(B, C)));
                             x.push_back(custom("loss_sum",
                                                "B*8*sqrt(C)*eps + 4*eps of the total: expf/logf differ "
                                                "(test_softmax_xent_cuda.cpp, xent_loss_allowed)",
                                                [](const OutputArray& got, const OutputArray& want) {
                                                  const double g = got.f64.at(0), w = want.f64.at(0);
                                                  INFO("loss: cuda " << g << ", cpu " << w);
                                                  REQUIRE(std::abs(g - w) <= xent_loss_allowed(B, C, w - kLossBefore));
                                                }));
                             x.push_back(exact("correct",
                                               "argmax with the lowest index on ties: exact "
                                               "(test_softmax_xent_cuda.cpp)"));
                             return x;
                           }};
          }};
}

// ---- GEMM --------------------------------------------------------------------------------------------------

const char* kGemmSource =
    "fp32_dot(K), as test_gemm_cuda.cpp (there against double; against the CPU's fp32 as "
    "test_conv_cuda.cpp)";

Tolerance gemm_tolerance(int K) {
  Tolerance t = fp32_dot(K);
  t.reason = kGemmSource;
  return t;
}

struct GemmCase {
  int M, N, K;
  bool trans_a, trans_b, row_sums, workspace;
  kernels::Epilogue epilogue;
};

Row gemm_row(std::string op, const GemmCase& g) {
  std::ostringstream shape;
  shape << "M=" << g.M << " N=" << g.N << " K=" << g.K << (g.trans_a ? " trans_a" : "") << (g.trans_b ? " trans_b" : "")
        << (g.row_sums ? " row sums" : "") << (g.workspace ? " workspace" : "");
  return {std::move(op), shape.str(), [g] {
            struct In {
              std::vector<float> A, B, bias, mask;
            };
            auto in = keep(In{random_floats(size_t(g.M) * g.K), random_floats(size_t(g.K) * g.N),
                              random_floats(size_t(g.N)), random_floats(size_t(g.M) * g.N)});
            return RowCase{[in, g](const Exec& e) {
                             Buf<float> A(e, in->A), B(e, in->B), bias(e, in->bias), mask(e, in->mask);
                             Buf<float> C(e, poisoned(size_t(g.M) * g.N)), sums(e, poisoned(size_t(g.M)));
                             const size_t ws =
                                 g.workspace ? kernels::gemm_workspace_floats(e.backend, g.M, g.N, g.K) : 0;
                             Buf<float> workspace(e, at_least_one(poisoned(ws)));
                             kernels::GemmDesc d;
                             d.M = g.M, d.N = g.N, d.K = g.K, d.trans_a = g.trans_a, d.trans_b = g.trans_b;
                             d.A = A.get(), d.lda = g.trans_a ? g.M : g.K;
                             d.B = B.get(), d.ldb = g.trans_b ? g.K : g.N;
                             d.C = C.get(), d.ldc = g.N;
                             d.epilogue = g.epilogue, d.bias = bias.get(), d.mask = mask.get();
                             d.a_row_sums = g.row_sums ? sums.get() : nullptr;
                             d.workspace = ws ? workspace.get() : nullptr;
                             kernels::gemm(e, d);
                             Outputs o;
                             o.add("C", C.download());
                             if (g.row_sums) o.add("a_row_sums", sums.download());
                             return o;
                           },
                           [g](const Outputs&) {
                             std::vector<Expect> x{close("C", gemm_tolerance(g.K))};
                             if (g.row_sums) x.push_back(close("a_row_sums", gemm_tolerance(g.K)));
                             return x;
                           }};
          }};
}

std::vector<Row> gemm_rows() {
  using kernels::Epilogue;
  return {
      gemm_row("gemm (none)", {7, 9, 33, false, false, false, false, Epilogue::none}),
      gemm_row("gemm (bias_relu, Linear forward)", {5, 13, 37, false, true, false, false, Epilogue::bias_relu}),
      gemm_row("gemm (bias)", {9, 7, 21, false, true, false, false, Epilogue::bias}),
      gemm_row("gemm (weight gradient, row sums)", {9, 11, 65, true, false, true, false, Epilogue::none}),
      gemm_row("gemm (relu_mask, input gradient)", {7, 12, 10, false, false, false, false, Epilogue::relu_mask}),
      gemm_row("gemm (long K, split through the workspace)", {3, 5, 4099, false, false, true, true, Epilogue::bias})};
}

// ---- classifier head -----------------------------------------------------------------------------------------
// test_classifier_head_cuda.cpp, check_head: every tolerance derived there from the fp32 rounding of each sum and
// its propagation through the softmax.

namespace head_case {
constexpr int B = 7, K = 33, C = 10;
}

Row head_row(bool backward) {
  using namespace head_case;
  return {backward ? "classifier_head (forward + backward, dx masked)" : "classifier_head (evaluation)",
          "B=7 K=33 C=10 bias",
          [=] {
            struct In {
              std::vector<float> x, weight, bias;
              std::vector<int32_t> labels;
            };
            const float w = 1.f / std::sqrt(float(K));
            auto in = keep(In{random_floats(size_t(B) * K), random_floats(size_t(C) * K, -w, w),
                              random_floats(size_t(C), -0.5f, 0.5f), random_labels(B, C)});
            return RowCase{
                [in, backward](const Exec& e) {
                  Buf<float> x(e, in->x), weight(e, in->weight), bias(e, in->bias);
                  Buf<int32_t> labels(e, in->labels);
                  Buf<float> logits(e, poisoned(size_t(B) * C)), dlogits(e, poisoned(size_t(B) * C));
                  Buf<float> dweight(e, poisoned(size_t(C) * K)), dbias(e, poisoned(size_t(C)));
                  Buf<float> dx(e, poisoned(size_t(B) * K));
                  Buf<double> loss(e, std::vector<double>{kLossBefore});
                  Buf<int64_t> correct(e, std::vector<int64_t>{kCorrectBefore});
                  kernels::ClassifierHeadArgs h;
                  h.B = B, h.K = K, h.C = C;
                  h.x = x.get(), h.weight = weight.get(), h.bias = bias.get(), h.labels = labels.get();
                  h.logits = logits.get(), h.loss_sum = loss.get(), h.correct = correct.get();
                  if (backward) {
                    h.dlogits = dlogits.get(), h.dweight = dweight.get(), h.dbias = dbias.get();
                    h.dx = dx.get(), h.mask_dx = true;
                  }
                  kernels::classifier_head(e, h);
                  Outputs o;
                  o.add("logits", logits.download());
                  o.add("loss_sum", loss.download());
                  o.add_ints("correct", correct.download());
                  if (backward) {
                    o.add("dlogits", dlogits.download());
                    o.add("dweight", dweight.download());
                    o.add("dbias", dbias.download());
                    o.add("dx", dx.download());
                  }
                  return o;
                },
                [in, backward](const Outputs& cpu) {
                  const auto& x = in->x;
                  const auto& weight = in->weight;
                  const auto& want_logits = cpu.floats("logits");
                  const double logit_terms = max_term_sum(
                      B, C, K, [&](int b, int k) { return x[size_t(b) * K + k]; },
                      [&](int j, int k) { return weight[size_t(j) * K + k]; });
                  const Tolerance logit_tol{fp32_dot(K).rel_tol * logit_terms, fp32_dot(K).rel_tol,
                                            "logits: 8*sqrt(K)*eps of the products' magnitude sum "
                                            "(test_classifier_head_cuda.cpp)"};
                  const double delta = logit_tol.abs_tol + logit_tol.rel_tol * max_abs(want_logits) + 4 * kEps;
                  std::vector<Expect> out{close("logits", logit_tol)};
                  out.push_back(custom("loss_sum",
                                       "B*(2*delta + 8*sqrt(C)*eps) + 4*eps of the total: the logits' error through "
                                       "the log-sum-exp (test_classifier_head_cuda.cpp)",
                                       [delta](const OutputArray& got, const OutputArray& want) {
                                         const double g = got.f64.at(0), wanted = want.f64.at(0);
                                         const double allowed = B * (2 * delta + 8 * std::sqrt(double(C)) * kEps) +
                                                                4 * kEps * std::abs(wanted);
                                         INFO("loss: cuda " << g << ", cpu " << wanted << ", allowed " << allowed);
                                         REQUIRE(std::abs(g - wanted) <= allowed);
                                       }));
                  const int64_t ties = near_ties(want_logits, B, C, 2 * delta);
                  out.push_back(custom("correct",
                                       "may differ only in rows whose top two logits are within 2*delta "
                                       "(test_classifier_head_cuda.cpp)",
                                       [ties](const OutputArray& got, const OutputArray& want) {
                                         INFO("correct: cuda " << got.ints.at(0) << ", cpu " << want.ints.at(0)
                                                               << ", near ties " << ties);
                                         REQUIRE(std::abs(got.ints.at(0) - want.ints.at(0)) <= ties);
                                       }));
                  if (!backward) return out;
                  const auto& dlogits = cpu.floats("dlogits");
                  const double dl_abs = (2 * delta + 2 * kEps) / B;
                  out.push_back(close("dlogits", {dl_abs, 8 * std::sqrt(double(C)) * kEps,
                                                  "dlogits: 2*delta/B from the logits, sqrt(C)*eps from the exp sum "
                                                  "(test_classifier_head_cuda.cpp)"}));
                  const double dw_terms = max_term_sum(
                      C, K, B, [&](int j, int b) { return dlogits[size_t(b) * C + j]; },
                      [&](int k, int b) { return x[size_t(b) * K + k]; });
                  out.push_back(
                      close("dweight", {B * dl_abs * max_abs(x) + fp32_dot(B).rel_tol * dw_terms, fp32_dot(B).rel_tol,
                                        "dW: B dlogit errors times max|x|, and a B-term fp32 sum "
                                        "(test_classifier_head_cuda.cpp)"}));
                  out.push_back(close("dbias", {B * dl_abs, fp32_dot(B).rel_tol,
                                                "db: B dlogit errors, and a B-term fp32 sum "
                                                "(test_classifier_head_cuda.cpp)"}));
                  const double dx_terms = max_term_sum(
                      B, K, C, [&](int b, int j) { return dlogits[size_t(b) * C + j]; },
                      [&](int k, int j) { return weight[size_t(j) * K + k]; });
                  out.push_back(
                      close("dx", {C * dl_abs * max_abs(weight) + fp32_dot(C).rel_tol * dx_terms, fp32_dot(C).rel_tol,
                                   "dx: C dlogit errors times max|W|, and a C-term fp32 sum "
                                   "(test_classifier_head_cuda.cpp)"}));
                  return out;
                }};
          },
          [] {
            if (cuda_device().has_clusters()) return std::string();
            return "classifier_head: the fused kernel needs thread-block clusters (sm_90 code); " + cuda_device().name +
                   " runs " + cuda_device().code_path() +
                   ", so the CUDA op takes its unfused fallback (gemm, softmax_xent, gemm, gemm), which this row "
                   "checks instead";
          }};
}

// ---- convolution -----------------------------------------------------------------------------------------------
// test_conv_cuda.cpp: fp32_dot(K of the pass's GEMM), both backends summing the same K products in fp32 in
// different fixed orders.

Tolerance conv_tolerance(int K, const char* pass) {
  Tolerance t = fp32_dot(K);
  t.reason = pass;
  return t;
}

enum class ConvPass { forward, backward_data, backward_weight, backward };

Row conv_row(ConvPass pass, const kernels::Conv2dShape& s, const std::string& shape) {
  const char* names[] = {"conv2d_forward (bias)", "conv2d_backward_data", "conv2d_backward_weight (dbias)",
                         "conv2d_backward (both passes, dbias)"};
  return {names[int(pass)], shape, [pass, s] {
            struct In {
              std::vector<float> x, w, bias, dy;
            };
            auto in = keep(In{random_floats(s.x_size()), random_floats(s.w_size()), random_floats(size_t(s.k)),
                              random_floats(s.y_size())});
            return RowCase{
                [in, pass, s](const Exec& e) {
                  Buf<float> x(e, in->x), w(e, in->w), bias(e, in->bias), dy(e, in->dy);
                  Buf<float> y(e, poisoned(s.y_size())), dx(e, poisoned(s.x_size()));
                  Buf<float> dw(e, poisoned(s.w_size())), dbias(e, poisoned(size_t(s.k)));
                  Buf<float> ws(e, at_least_one(poisoned(kernels::conv2d_workspace_floats(e.backend, s))));
                  kernels::Conv2dArgs<float> a{.shape = s, .workspace = ws.get()};
                  Outputs o;
                  switch (pass) {
                    case ConvPass::forward:
                      a.x = x.get(), a.w = w.get(), a.bias = bias.get(), a.y = y.get();
                      kernels::conv2d_forward(e, a);
                      o.add("y", y.download());
                      break;
                    case ConvPass::backward_data:
                      a.dy = dy.get(), a.w = w.get(), a.dx = dx.get();
                      kernels::conv2d_backward_data(e, a);
                      o.add("dx", dx.download());
                      break;
                    case ConvPass::backward_weight:
                      a.x = x.get(), a.dy = dy.get(), a.dw = dw.get(), a.dbias = dbias.get();
                      kernels::conv2d_backward_weight(e, a);
                      o.add("dw", dw.download());
                      o.add("dbias", dbias.download());
                      break;
                    case ConvPass::backward:
                      a.x = x.get(), a.dy = dy.get(), a.w = w.get(), a.dx = dx.get(), a.dw = dw.get();
                      a.dbias = dbias.get();
                      kernels::conv2d_backward(e, a);
                      o.add("dx", dx.download());
                      o.add("dw", dw.download());
                      o.add("dbias", dbias.download());
                      break;
                  }
                  return o;
                },
                [s](const Outputs&) {
                  const int npq = s.n * s.p() * s.q();
                  return std::vector<Expect>{
                      close("y", conv_tolerance(s.c * s.r * s.s, "y: fp32_dot(C*R*S) (test_conv_cuda.cpp)")),
                      close("dx", conv_tolerance(s.k * s.r * s.s, "dx: fp32_dot(K*R*S) (test_conv_cuda.cpp)")),
                      close("dw", conv_tolerance(npq, "dw: fp32_dot(N*P*Q) (test_conv_cuda.cpp)")),
                      close("dbias", conv_tolerance(npq, "dbias: fp32_dot(N*P*Q) (test_conv_cuda.cpp)"))};
                }};
          }};
}

std::vector<Row> conv_rows() {
  std::vector<Row> rows;
  const struct {
    kernels::Conv2dShape s;
    const char* name;
  } shapes[] = {{{5, 3, 9, 7, 4, 3, 3, 1, 1}, "N=5 C=3 9x7 K=4 3x3 stride 1 pad 1 (few taps)"},
                {{3, 16, 9, 7, 6, 3, 3, 2, 1}, "N=3 C=16 9x7 K=6 3x3 stride 2 pad 1 (implicit GEMM)"}};
  for (const auto& sh : shapes)
    for (ConvPass pass : {ConvPass::forward, ConvPass::backward_data, ConvPass::backward_weight, ConvPass::backward})
      rows.push_back(conv_row(pass, sh.s, sh.name));
  return rows;
}

// ---- BatchNorm ---------------------------------------------------------------------------------------------------
// test_batchnorm_cuda.cpp: compare_statistics, train_y_tolerance, eval_y_tolerance, compare_gradients; the CPU twin
// computes in double and rounds once, so the differences are the GPU's fp32.

using kernels::BatchNormHyper;
using kernels::BatchNormShape;
using kernels::Layout;

size_t bn_index(const BatchNormShape& s, int64_t n, int64_t c, int64_t i) {
  return size_t(s.layout == Layout::nchw ? (n * s.c + c) * s.hw + i : (n * s.hw + i) * s.c + c);
}

// max over channels of |gamma_c| * invstd_c: what multiplies an error in (x - mean).
double bn_scale(const std::vector<float>& gamma, const std::vector<float>& invstd) {
  double scale = 0;
  for (size_t c = 0; c < invstd.size(); ++c) scale = std::max(scale, std::abs(double(gamma[c])) * invstd[c]);
  return scale;
}
std::vector<float> eval_invstd(const std::vector<float>& rv, double eps) {
  std::vector<float> v(rv.size());
  for (size_t c = 0; c < rv.size(); ++c) v[c] = float(1 / std::sqrt(double(rv[c]) + eps));
  return v;
}

std::vector<Expect> bn_statistics_expect(double x_unit, double conv_err = 0) {
  const double conv_rel = x_unit > 0 ? 4 * conv_err / x_unit : 0;
  return {close("save_mean", {16 * kEps * x_unit + conv_err, 16 * kEps,
                              "mean: fp32 sums, a few eps of max|x| (test_batchnorm_cuda.cpp)"}),
          close("save_invstd",
                {0, 2e-5 + conv_rel, "invstd: fp32 M2, per-thread sums + Chan tree (test_batchnorm_cuda.cpp)"}),
          close("running_mean",
                {16 * kEps * x_unit + conv_err, 16 * kEps, "running_mean: as the mean (test_batchnorm_cuda.cpp)"}),
          close("running_var", {0, 2e-5 + conv_rel, "running_var: as invstd (test_batchnorm_cuda.cpp)"}),
          exact("num_batches_tracked", "an integer counter: exact")};
}
// compare_gradients: dx against k1*max|dy|*max(1, max|xhat|); dgamma/dbeta fp32 sums of count terms. `extra_sums`:
// what the stem adds for its convolution.
std::vector<Expect> bn_gradient_expect(double scale, double dy_unit, double xhat, double count, bool with_dx,
                                       double extra_sums = 0) {
  std::vector<Expect> out;
  if (with_dx)
    out.push_back(close("dx", {64 * kEps * scale * dy_unit * xhat, 64 * kEps,
                               "dx: fp32 against k1*max|dy|*max|xhat| (test_batchnorm_cuda.cpp)"}));
  const Tolerance sums{64 * std::sqrt(count) * kEps * dy_unit * xhat + extra_sums, 8 * std::sqrt(count) * kEps,
                       "dgamma/dbeta: fp32 sums of count terms (test_batchnorm_cuda.cpp)"};
  out.push_back(close("dgamma", sums));
  out.push_back(close("dbeta", sums));
  return out;
}
double bn_xhat(const BatchNormShape& s, const std::vector<float>& x, const std::vector<float>& mean,
               const std::vector<float>& invstd) {
  double xhat = 1;
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t c = 0; c < s.c; ++c)
      for (int64_t i = 0; i < s.hw; ++i)
        xhat = std::max(xhat, std::abs(double(x[bn_index(s, n, c, i)] - mean[c]) * invstd[c]));
  return xhat;
}

struct BnIn {
  BatchNormShape s;
  BatchNormHyper h;
  kernels::BatchNormPool pool;
  std::vector<float> x, gamma, beta, rm, rv;
  // the backward's inputs: a CPU training forward's statistics and outputs, and a random gradient
  std::vector<float> save_mean, save_invstd, y, dy;
  std::vector<int32_t> argmax;
};

// Random inputs, and the backward's from the CPU twin's training forward (pooled: y and argmax pooled).
BnIn make_bn(const BatchNormShape& s, const kernels::BatchNormPool& pool, bool relu, bool pooled) {
  BnIn in{s,
          {},
          pool,
          random_floats(size_t(s.n * s.c * s.hw)),
          random_floats(size_t(s.c), 0.5f, 1.5f),
          random_floats(size_t(s.c), -0.5f, 0.5f),
          random_floats(size_t(s.c), -0.2f, 0.2f),
          random_floats(size_t(s.c), 0.5f, 1.5f),
          {},
          {},
          {},
          {},
          {}};
  in.h.relu = relu;
  const size_t out = pooled ? size_t(s.n * s.c) * pool.p() * pool.q() : in.x.size();
  in.save_mean.resize(size_t(s.c)), in.save_invstd.resize(size_t(s.c)), in.y.resize(out), in.argmax.resize(out);
  std::vector<float> rm = in.rm, rv = in.rv;
  std::vector<float> ws(pooled ? kernels::batchnorm_pool_workspace_floats(Backend::cpu, s, pool) : 0);
  const kernels::BatchNormArgs<float> a{.shape = s,
                                        .hyper = in.h,
                                        .pool = pool,
                                        .x = in.x.data(),
                                        .gamma = in.gamma.data(),
                                        .beta = in.beta.data(),
                                        .y = in.y.data(),
                                        .argmax = pooled ? in.argmax.data() : nullptr,
                                        .save_mean = in.save_mean.data(),
                                        .save_invstd = in.save_invstd.data(),
                                        .running_mean = rm.data(),
                                        .running_var = rv.data(),
                                        .workspace = ws.data()};
  if (pooled)
    kernels::batchnorm_pool_forward_train(Exec{}, a);
  else
    kernels::batchnorm_forward_train(Exec{}, a);
  in.dy = random_floats(out);
  return in;
}

enum class BnOp { forward_train, forward_eval, backward };

// A pooled argmax may choose another element of its window where two values are within y's tolerance (a near
// tie): as test_batchnorm_cuda.cpp's check_choices, each GPU choice must name an element of its window whose value
// in `full` (the CPU's full-resolution output, NCHW) is the CPU choice's within `tol`.
void check_choices(const kernels::BatchNormPool& pool, int64_t planes, const std::vector<float>& full,
                   const OutputArray& got, const OutputArray& want, double tol) {
  const int P = pool.p(), Q = pool.q(), K = pool.window;
  const int64_t hw = int64_t(pool.h) * pool.w;
  int bad = 0;
  for (int64_t plane = 0; plane < planes; ++plane)
    for (int i = 0; i < P; ++i)
      for (int j = 0; j < Q; ++j) {
        const size_t k = size_t((plane * P + i) * Q + j);
        const int64_t g = got.ints.at(k), w = want.ints.at(k);
        if (g == w) continue;
        const bool inside = g >= 0 && g < hw && (g / pool.w) / K == i && (g % pool.w) / K == j;
        bad += !inside || !(double(full[size_t(plane * hw + g)]) >= double(full[size_t(plane * hw + w)]) - tol);
      }
  INFO("windows whose GPU choice is not a maximum within " << tol << ": " << bad);
  REQUIRE(bad == 0);
}

// The CPU's full-resolution BatchNorm output of x (NCHW): training (fresh statistics) or evaluation.
std::vector<float> bn_full(const BnIn& in, bool train) {
  std::vector<float> full(in.x.size()), mean(size_t(in.s.c)), invstd(size_t(in.s.c));
  std::vector<float> rm = in.rm, rv = in.rv;
  BatchNormShape s = in.s;
  const kernels::BatchNormArgs<float> a{.shape = s,
                                        .hyper = in.h,
                                        .x = in.x.data(),
                                        .gamma = in.gamma.data(),
                                        .beta = in.beta.data(),
                                        .y = full.data(),
                                        .save_mean = mean.data(),
                                        .save_invstd = invstd.data(),
                                        .running_mean = rm.data(),
                                        .running_var = rv.data()};
  if (train)
    kernels::batchnorm_forward_train(Exec{}, a);
  else
    kernels::batchnorm_forward_eval(Exec{}, a);
  return full;
}

Row bn_row(BnOp op, const BatchNormShape& s, const kernels::BatchNormPool& pool, bool relu, bool pooled,
           const std::string& shape) {
  const char* plain[] = {"batchnorm_forward_train", "batchnorm_forward_eval", "batchnorm_backward"};
  const char* fused[] = {"batchnorm_pool_forward_train", "batchnorm_pool_forward_eval", "batchnorm_pool_backward"};
  return {(pooled ? fused : plain)[int(op)], shape, [=] {
            auto in = keep(make_bn(s, pool, relu, pooled));
            return RowCase{
                [in, op, pooled](const Exec& e) {
                  const BatchNormShape& bs = in->s;
                  const size_t full = in->x.size(), out = in->y.size(), C = size_t(bs.c);
                  Buf<float> x(e, in->x), gamma(e, in->gamma), beta(e, in->beta), rm(e, in->rm), rv(e, in->rv);
                  Buf<float> y(e, poisoned(out)), mean(e, poisoned(C)), invstd(e, poisoned(C));
                  Buf<int32_t> argmax(e, std::vector<int32_t>(out, int32_t(kIntPoison)));
                  Buf<int64_t> batches(e, std::vector<int64_t>{5});
                  Buf<float> given_y(e, in->y), given_mean(e, in->save_mean), given_invstd(e, in->save_invstd);
                  Buf<int32_t> given_argmax(e, in->argmax);
                  Buf<float> dy(e, in->dy), dx(e, poisoned(full)), dgamma(e, poisoned(C)), dbeta(e, poisoned(C));
                  const size_t ws_floats = pooled ? kernels::batchnorm_pool_workspace_floats(e.backend, bs, in->pool)
                                                  : kernels::batchnorm_workspace_floats(e.backend, bs);
                  Buf<float> ws(e, at_least_one(poisoned(ws_floats)));
                  kernels::BatchNormArgs<float> a{.shape = bs,
                                                  .hyper = in->h,
                                                  .pool = in->pool,
                                                  .x = x.get(),
                                                  .gamma = gamma.get(),
                                                  .beta = beta.get(),
                                                  .workspace = ws.get()};
                  Outputs o;
                  switch (op) {
                    case BnOp::forward_train:
                      a.y = y.get(), a.argmax = pooled ? argmax.get() : nullptr;
                      a.save_mean = mean.get(), a.save_invstd = invstd.get();
                      a.running_mean = rm.get(), a.running_var = rv.get(), a.num_batches_tracked = batches.get();
                      pooled ? kernels::batchnorm_pool_forward_train(e, a) : kernels::batchnorm_forward_train(e, a);
                      o.add("y", y.download());
                      if (pooled) o.add_ints("argmax", argmax.download(), kIntPoison);
                      o.add("save_mean", mean.download());
                      o.add("save_invstd", invstd.download());
                      o.add("running_mean", rm.download());
                      o.add("running_var", rv.download());
                      o.add_ints("num_batches_tracked", batches.download());
                      break;
                    case BnOp::forward_eval:
                      a.y = y.get(), a.argmax = pooled ? argmax.get() : nullptr;
                      a.running_mean = rm.get(), a.running_var = rv.get();
                      pooled ? kernels::batchnorm_pool_forward_eval(e, a) : kernels::batchnorm_forward_eval(e, a);
                      o.add("y", y.download());
                      if (pooled) o.add_ints("argmax", argmax.download(), kIntPoison);
                      break;
                    case BnOp::backward:
                      a.y = in->h.relu ? given_y.get() : nullptr, a.argmax = pooled ? given_argmax.get() : nullptr;
                      a.save_mean = given_mean.get(), a.save_invstd = given_invstd.get();
                      a.dy = dy.get(), a.dx = dx.get(), a.dgamma = dgamma.get(), a.dbeta = dbeta.get();
                      pooled ? kernels::batchnorm_pool_backward(e, a) : kernels::batchnorm_backward(e, a);
                      o.add("dx", dx.download());
                      o.add("dgamma", dgamma.download());
                      o.add("dbeta", dbeta.download());
                      break;
                  }
                  return o;
                },
                [in, op, pooled](const Outputs& cpu) {
                  const double x_unit = max_abs(in->x);
                  std::vector<Expect> out;
                  if (op == BnOp::backward) {
                    return bn_gradient_expect(bn_scale(in->gamma, in->save_invstd), max_abs(in->dy),
                                              bn_xhat(in->s, in->x, in->save_mean, in->save_invstd),
                                              double(in->s.n * in->s.hw), true);
                  }
                  const bool train = op == BnOp::forward_train;
                  const double scale =
                      bn_scale(in->gamma, train ? cpu.floats("save_invstd") : eval_invstd(in->rv, in->h.eps));
                  const Tolerance y_tol = train ? train_y_tolerance(scale, x_unit) : eval_y_tolerance(scale, x_unit);
                  out.push_back(close("y", y_tol));
                  if (pooled) {
                    const auto full = std::make_shared<const std::vector<float>>(bn_full(*in, train));
                    const double tol = 2 * (y_tol.abs_tol + y_tol.rel_tol * max_abs(*full));
                    out.push_back(custom("argmax",
                                         "the same element, or one whose value is the window's maximum within twice "
                                         "y's tolerance (test_batchnorm_cuda.cpp, check_choices)",
                                         [in, full, tol](const OutputArray& got, const OutputArray& want) {
                                           check_choices(in->pool, in->s.n * in->s.c, *full, got, want, tol);
                                         }));
                  }
                  if (train)
                    for (auto& x : bn_statistics_expect(x_unit)) out.push_back(std::move(x));
                  return out;
                }};
          }};
}

std::vector<Row> batchnorm_rows() {
  std::vector<Row> rows;
  for (const Layout layout : {Layout::nchw, Layout::nhwc}) {
    const BatchNormShape s{5, 3, 63, layout};
    const bool relu = layout == Layout::nchw;
    const std::string shape =
        std::string("n=5 c=3 hw=63 ") + (layout == Layout::nchw ? "NCHW" : "NHWC") + (relu ? " relu" : "") + " affine";
    for (BnOp op : {BnOp::forward_train, BnOp::forward_eval, BnOp::backward})
      rows.push_back(bn_row(op, s, {}, relu, false, shape));
  }
  const kernels::BatchNormPool pool{9, 7, 2};
  const BatchNormShape s{5, 3, 63, Layout::nchw};
  for (BnOp op : {BnOp::forward_train, BnOp::forward_eval, BnOp::backward})
    rows.push_back(bn_row(op, s, pool, true, true, "n=5 c=3 9x7 window 2 relu affine"));
  return rows;
}

// ---- the fused stem: conv + BatchNorm + max-pool ------------------------------------------------------------------
// test_conv_batchnorm_pool_cuda.cpp, check_stem: the pooled BatchNorm's tolerances with the convolution's own error
// added (conv_err = fp32_dot(taps) of max|conv|, the two backends summing the C*R*S products in different orders).

struct StemIn {
  kernels::ConvBatchNormPoolShape stem;
  BatchNormHyper h;
  std::vector<float> x, w, gamma, beta, rm, rv;
  std::vector<float> conv;  // the CPU's conv2d_forward(x, w): the BatchNorm's input
  // the backward's inputs: the CPU training forward's outputs and statistics, a random gradient
  std::vector<float> y, save_mean, save_invstd, dy;
  std::vector<int32_t> argmax;
};

StemIn make_stem(const kernels::ConvBatchNormPoolShape& stem) {
  const kernels::Conv2dShape& cs = stem.conv;
  const BatchNormShape s = stem.batchnorm();
  const float bound = 1.f / std::sqrt(float(stem.taps()));  // nn.Conv2d's init range
  StemIn in{stem,
            {},
            random_floats(cs.x_size()),
            random_floats(cs.w_size(), -bound, bound),
            random_floats(size_t(s.c), 0.5f, 1.5f),
            random_floats(size_t(s.c), -0.5f, 0.5f),
            random_floats(size_t(s.c), -0.2f, 0.2f),
            random_floats(size_t(s.c), 0.5f, 1.5f),
            {},
            {},
            {},
            {},
            {},
            {}};
  in.h.relu = true;
  in.conv.resize(cs.y_size());
  kernels::conv2d_forward(
      Exec{}, kernels::Conv2dArgs<float>{.shape = cs, .x = in.x.data(), .w = in.w.data(), .y = in.conv.data()});
  const kernels::BatchNormPool pool = stem.pool();
  const size_t pooled = size_t(s.n * s.c) * pool.p() * pool.q();
  in.y.resize(pooled), in.argmax.resize(pooled), in.save_mean.resize(size_t(s.c)), in.save_invstd.resize(size_t(s.c));
  std::vector<float> rm = in.rm, rv = in.rv;
  std::vector<float> ws(kernels::conv_batchnorm_pool_workspace_floats(Backend::cpu, stem) + 2);
  kernels::conv_batchnorm_pool_forward_train(Exec{},
                                             kernels::ConvBatchNormPoolArgs<float>{.shape = stem,
                                                                                   .hyper = in.h,
                                                                                   .x = in.x.data(),
                                                                                   .w = in.w.data(),
                                                                                   .gamma = in.gamma.data(),
                                                                                   .beta = in.beta.data(),
                                                                                   .y = in.y.data(),
                                                                                   .argmax = in.argmax.data(),
                                                                                   .save_mean = in.save_mean.data(),
                                                                                   .save_invstd = in.save_invstd.data(),
                                                                                   .running_mean = rm.data(),
                                                                                   .running_var = rv.data(),
                                                                                   .workspace = ws.data()});
  in.dy = random_floats(pooled);
  return in;
}

// The BatchNorm part of the stem on the CPU's convolution output, as a BnIn (for the choices and the gradients).
BnIn stem_batchnorm(const StemIn& in) {
  BnIn b{in.stem.batchnorm(), in.h,           in.stem.pool(), in.conv, in.gamma, in.beta, in.rm, in.rv,
         in.save_mean,        in.save_invstd, in.y,           in.dy,   in.argmax};
  return b;
}

// ahead: conv_batchnorm_pool_moments first, then the training forward with moments_ready (a trainer's prepared
// batch); the CPU's moments op does nothing, and its forward is the same.
Row stem_row(BnOp op, const kernels::ConvBatchNormPoolShape& stem, const std::string& shape, bool ahead = false) {
  const char* names[] = {"conv_batchnorm_pool_forward_train", "conv_batchnorm_pool_forward_eval",
                         "conv_batchnorm_pool_backward"};
  return {
      cat(names[int(op)], ahead ? " after conv_batchnorm_pool_moments" : ""), shape, [op, stem, ahead] {
        auto in = keep(make_stem(stem));
        return RowCase{
            [in, op, ahead](const Exec& e) {
              const auto& st = in->stem;
              const size_t pooled = in->y.size(), C = size_t(st.conv.k);
              Buf<float> x(e, in->x), w(e, in->w), gamma(e, in->gamma), beta(e, in->beta), rm(e, in->rm), rv(e, in->rv);
              Buf<float> y(e, poisoned(pooled)), mean(e, poisoned(C)), invstd(e, poisoned(C));
              Buf<int32_t> argmax(e, std::vector<int32_t>(pooled, int32_t(kIntPoison)));
              Buf<int64_t> batches(e, std::vector<int64_t>{5});
              Buf<float> given_y(e, in->y), given_mean(e, in->save_mean), given_invstd(e, in->save_invstd);
              Buf<int32_t> given_argmax(e, in->argmax);
              Buf<float> dy(e, in->dy), dw(e, poisoned(st.conv.w_size())), dgamma(e, poisoned(C)),
                  dbeta(e, poisoned(C));
              // 8-byte aligned, as the header asks (device_alloc aligns every buffer)
              Buf<float> ws(e, at_least_one(poisoned(kernels::conv_batchnorm_pool_workspace_floats(e.backend, st))));
              kernels::ConvBatchNormPoolArgs<float> t{.shape = st,
                                                      .hyper = in->h,
                                                      .x = x.get(),
                                                      .w = w.get(),
                                                      .gamma = gamma.get(),
                                                      .beta = beta.get(),
                                                      .y = y.get(),
                                                      .argmax = argmax.get(),
                                                      .save_mean = mean.get(),
                                                      .save_invstd = invstd.get(),
                                                      .running_mean = rm.get(),
                                                      .running_var = rv.get(),
                                                      .num_batches_tracked = batches.get(),
                                                      .workspace = ws.get()};
              Outputs o;
              if (op == BnOp::forward_eval) {
                t.save_mean = nullptr, t.save_invstd = nullptr, t.num_batches_tracked = nullptr;
                kernels::conv_batchnorm_pool_forward_eval(e, t);
                o.add("y", y.download());
                o.add_ints("argmax", argmax.download(), kIntPoison);
                return o;
              }
              if (ahead) {
                kernels::conv_batchnorm_pool_moments(e, t);
                t.moments_ready = true;
              }
              kernels::conv_batchnorm_pool_forward_train(e, t);
              if (op == BnOp::forward_train) {
                o.add("y", y.download());
                o.add_ints("argmax", argmax.download(), kIntPoison);
                o.add("save_mean", mean.download());
                o.add("save_invstd", invstd.download());
                o.add("running_mean", rm.download());
                o.add("running_var", rv.download());
                o.add_ints("num_batches_tracked", batches.download());
                return o;
              }
              // The backward reads the moments its training forward just left in the workspace; it
              // differentiates the CPU's point (argmax, pooled y, statistics), as check_stem does.
              auto b = t;
              b.y = given_y.get(), b.argmax = given_argmax.get(), b.save_mean = given_mean.get();
              b.save_invstd = given_invstd.get(), b.dy = dy.get(), b.dw = dw.get();
              b.dgamma = dgamma.get(), b.dbeta = dbeta.get();
              kernels::conv_batchnorm_pool_backward(e, b);
              o.add("dw", dw.download());
              o.add("dgamma", dgamma.download());
              o.add("dbeta", dbeta.download());
              return o;
            },
            [in, op](const Outputs& cpu) {
              BnIn bn = stem_batchnorm(*in);  // a copy: the CPU ops take non-const pointers
              const double x_unit = max_abs(in->conv);
              const double conv_err = fp32_dot(in->stem.taps()).rel_tol * x_unit;
              const double count = double(bn.s.n * bn.s.hw);
              std::vector<Expect> out;
              if (op == BnOp::backward) {
                // dconv: the BatchNorm's dx on the CPU, what dw sums against x
                std::vector<float> dconv(in->conv.size()), dg(size_t(bn.s.c)), db(size_t(bn.s.c));
                std::vector<float> ws(kernels::batchnorm_pool_workspace_floats(Backend::cpu, bn.s, bn.pool));
                kernels::batchnorm_pool_backward(Exec{},
                                                 kernels::BatchNormArgs<float>{.shape = bn.s,
                                                                               .hyper = bn.h,
                                                                               .pool = bn.pool,
                                                                               .x = bn.x.data(),
                                                                               .gamma = bn.gamma.data(),
                                                                               .beta = bn.beta.data(),
                                                                               .y = bn.y.data(),
                                                                               .argmax = bn.argmax.data(),
                                                                               .save_mean = bn.save_mean.data(),
                                                                               .save_invstd = bn.save_invstd.data(),
                                                                               .dy = bn.dy.data(),
                                                                               .dx = dconv.data(),
                                                                               .dgamma = dg.data(),
                                                                               .dbeta = db.data(),
                                                                               .workspace = ws.data()});
                const double dconv_unit = max_abs(dconv), xs = max_abs(in->x);
                out.push_back(close("dw", {64 * std::sqrt(count) * kEps * dconv_unit * xs, 8 * std::sqrt(count) * kEps,
                                           "dw: fp32 sums of count dconv*x terms (test_batchnorm_cuda.cpp, "
                                           "check_stem)"}));
                const double scale = bn_scale(bn.gamma, bn.save_invstd), dy_unit = max_abs(bn.dy);
                for (auto& x : bn_gradient_expect(scale, dy_unit, bn_xhat(bn.s, bn.x, bn.save_mean, bn.save_invstd),
                                                  count, false, conv_err * scale * std::sqrt(count) * dy_unit))
                  out.push_back(std::move(x));
                return out;
              }
              const bool train = op == BnOp::forward_train;
              const double scale = bn_scale(bn.gamma, train ? cpu.floats("save_invstd") : eval_invstd(bn.rv, bn.h.eps));
              Tolerance y_tol = train ? train_y_tolerance(scale, x_unit) : eval_y_tolerance(scale, x_unit);
              y_tol.abs_tol += (train ? 2 : 1) * scale * conv_err;  // check_stem: + the convolution's error
              out.push_back(close("y", y_tol));
              const auto full = std::make_shared<const std::vector<float>>(bn_full(bn, train));
              const double tol = 2 * (y_tol.abs_tol + y_tol.rel_tol * max_abs(*full));
              const kernels::BatchNormPool pool = bn.pool;
              const int64_t planes = bn.s.n * bn.s.c;
              out.push_back(custom("argmax",
                                   "the same element, or one whose value is the window's maximum within twice "
                                   "y's tolerance (test_batchnorm_cuda.cpp, check_choices)",
                                   [pool, planes, full, tol](const OutputArray& got, const OutputArray& want) {
                                     check_choices(pool, planes, *full, got, want, tol);
                                   }));
              if (train)
                for (auto& x : bn_statistics_expect(x_unit, conv_err)) out.push_back(std::move(x));
              return out;
            }};
      }};
}

std::vector<Row> stem_rows() {
  const kernels::ConvBatchNormPoolShape stem{kernels::Conv2dShape{5, 3, 9, 7, 4, 3, 3, 1, 1}, 2};
  std::vector<Row> rows;
  for (BnOp op : {BnOp::forward_train, BnOp::forward_eval, BnOp::backward})
    rows.push_back(stem_row(op, stem, "n=5 C=3 9x7 K=4 3x3 pad 1 (27 taps), window 2, relu affine"));
  for (BnOp op : {BnOp::forward_train, BnOp::backward})
    rows.push_back(stem_row(op, stem, "n=5 C=3 9x7 K=4 3x3 pad 1 (27 taps), window 2, relu affine", /*ahead=*/true));
  return rows;
}

// ---- the table ------------------------------------------------------------------------------------------------

std::vector<Row> all_rows() {
  std::vector<Row> rows;
  auto append = [&](std::vector<Row> more) {
    for (auto& r : more) rows.push_back(std::move(r));
  };
  append(elementwise_rows());
  append(optimizer_rows());
  rows.push_back(gather_row("gather_batch", "N=40 D=63 (one plane) B=7 first 5", 40, 1, 9, 7, 7, 5, 0, false));
  rows.push_back(
      gather_row("gather_batch (3 channels, shift 2, flip)", "N=40 C=3 9x7 B=7 first 5", 40, 3, 9, 7, 7, 5, 2, true));
  rows.push_back(nonfinite_row());
  rows.push_back(xent_row(true));
  rows.push_back(xent_row(false));
  append(gemm_rows());
  rows.push_back(head_row(true));
  rows.push_back(head_row(false));
  append(conv_rows());
  append(batchnorm_rows());
  append(stem_rows());
  return rows;
}

void check_against_cpu(const std::vector<Expect>& expects, const Outputs& gpu, const Outputs& cpu) {
  // Every output has an expectation, and every expectation an output of this row.
  for (const OutputArray& a : gpu.arrays) {
    INFO("output " << a.name);
    REQUIRE(std::any_of(expects.begin(), expects.end(), [&](const Expect& x) { return x.output == a.name; }));
  }
  for (const Expect& x : expects) {
    if (!gpu.find(x.output)) continue;  // a shared list (conv, BatchNorm) names outputs other passes have
    const OutputArray &got = gpu.at(x.output), &want = cpu.at(x.output);
    INFO("output " << x.output << " [" << x.tol.reason << "]");
    REQUIRE(got.type == want.type);
    REQUIRE(got.size() == want.size());
    switch (x.how) {
      case Expect::How::exact: {
        Outputs g, w;
        g.arrays.push_back(got), w.arrays.push_back(want);
        require_same_bits(g, w);
        break;
      }
      case Expect::How::close:
        REQUIRE(got.type == OutputArray::Type::f32);
        NT_REQUIRE_CLOSE(got.f32, want.f32, x.tol);
        break;
      case Expect::How::custom:
        x.check(got, want);
        break;
    }
  }
}

TEST_CASE("every op on CUDA matches its CPU twin, with and without programmatic launch", "[cuda][ops]") {
  CudaExec cuda;
  Exec with_pdl = cuda.exec, without_pdl = cuda.exec;
  with_pdl.programmatic_launch = true;
  with_pdl.debug_sync = false;  // a sync after every launch would leave programmatic launch nothing to overlap
  with_pdl.math = kernels::Math::fp32;
  without_pdl.programmatic_launch = false;  // debug_sync stays on: a fault names its kernel
  without_pdl.math = kernels::Math::fp32;
  const Exec cpu{};
  if (!cuda_device().has_programmatic_launch())
    WARN("programmatic launch not on this code path (" << cuda_device().name << " runs " << cuda_device().code_path()
                                                       << "): the two CUDA runs launch alike; still compared");

  const std::vector<Row> rows = all_rows();
  for (const Row& row : rows) {
    INFO("op " << row.op << " [" << row.shape << "]");
    if (const std::string caveat = row.caveat(); !caveat.empty()) WARN(row.op << ": " << caveat);
    const RowCase c = row.make();
    const Outputs on_cpu = c.run(cpu);
    const Outputs pdl_on = c.run(with_pdl);
    const Outputs pdl_off = c.run(without_pdl);
    {
      INFO("CUDA with programmatic launch against CUDA without: the same bits");
      require_same_bits(pdl_on, pdl_off);
    }
    {
      INFO("the CPU leaves no poison either (every input is finite, so a NaN there is an unwritten element)");
      require_written(on_cpu);
    }
    {
      INFO("every CUDA output written, no NaN where the CPU has none");
      require_written(pdl_off, on_cpu);
    }
    check_against_cpu(c.expect(on_cpu), pdl_off, on_cpu);
  }
}

}  // namespace
}  // namespace nt::test
