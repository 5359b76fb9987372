// CUDA tests of the conv2d family against the CPU twin, on fresh random inputs: random shapes (odd sizes,
// strides 1-3, paddings 0-2, kernels 1x1 to 5x5), shapes that split the GEMM's K over blocks, and the cnn's
// shapes, in every math mode. Every output and the workspace are poisoned (NaN) before each run, so an element
// the kernels forgot to write, or a partial they forgot to produce, fails. Tolerance: fp32_dot(K of the pass's
// GEMM), since both backends sum the same K products in fp32 in different fixed orders. TF32 and BF16 (Exec::math):
// the reference is the CPU twin in the same mode, the fp32 pass on operands rounded as kernels/operand.h says (exact
// products), so the same tolerance holds; dbias sums dy as that mode has it (unrounded under TF32, rounded under
// BF16). Determinism: each pass run twice gives
// the same bits, and conv2d_backward (both backward passes, overlapped) the bits of the two passes. Workspace:
// sized for the full batch, enough for a partial one. The kernel lab's halo tile (not chosen by the engine) is
// checked the same way through its lab entry.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/conv.h"
#include "kernels/conv_lab.h"
#include "kernels/operand.h"
#include "kernels/tf32.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Conv2dArgs;
using kernels::Conv2dShape;
using kernels::Exec;

// Device buffers are never empty (a zero-size allocation is not what is being tested).
std::vector<float> at_least_one(std::vector<float> v) {
  if (v.empty()) v.push_back(kPoison);
  return v;
}

struct GpuResults {
  std::vector<float> y, dx, dw, db;
};

// together: the backward as conv2d_backward (backward_data beside backward_weight) instead of the two passes;
// weight_side (with together): its weight gradient on that side stream, joined before the results are read.
GpuResults run_gpu(const Exec& gpu, const Conv2dShape& s, const std::vector<float>& x, const std::vector<float>& w,
                   const std::vector<float>* bias, const std::vector<float>& dy, size_t workspace_floats,
                   bool together = false, const kernels::SideStream* weight_side = nullptr) {
  DeviceBuffer<float> d_x(gpu, at_least_one(x)), d_w(gpu, at_least_one(w)), d_dy(gpu, at_least_one(dy));
  DeviceBuffer<float> d_bias(gpu, at_least_one(bias ? *bias : std::vector<float>{}));
  DeviceBuffer<float> d_y(gpu, at_least_one(poisoned(s.y_size()))), d_dx(gpu, at_least_one(poisoned(s.x_size())));
  DeviceBuffer<float> d_dw(gpu, at_least_one(poisoned(s.w_size()))), d_db(gpu, at_least_one(poisoned(size_t(s.k))));
  DeviceBuffer<float> d_ws(gpu, at_least_one(poisoned(workspace_floats)));
  const Conv2dArgs<float> args{.shape = s,
                               .x = d_x.get(),
                               .w = d_w.get(),
                               .bias = bias ? d_bias.get() : nullptr,
                               .y = d_y.get(),
                               .dy = d_dy.get(),
                               .dx = d_dx.get(),
                               .dw = d_dw.get(),
                               .dbias = bias ? d_db.get() : nullptr,
                               .workspace = d_ws.get(),
                               .weight_side = weight_side};
  kernels::conv2d_forward(gpu, args);
  if (together) {
    kernels::conv2d_backward(gpu, args);
    if (weight_side) weight_side->join();
  } else {
    kernels::conv2d_backward_data(gpu, args);
    kernels::conv2d_backward_weight(gpu, args);
  }
  GpuResults r{d_y.download(), d_dx.download(), d_dw.download(), d_db.download()};
  r.y.resize(s.y_size()), r.dx.resize(s.x_size()), r.dw.resize(s.w_size()), r.db.resize(bias ? size_t(s.k) : 0);
  return r;
}

// v with its low `dropped` bits replaced by exactly half of their range: a tie for the rounding to TF32 (13 bits
// dropped) or BF16 (16).
float with_tie_bits(float v, int dropped) {
  uint32_t u = 0;
  std::memcpy(&u, &v, sizeof u);
  u = (u & ~((1u << dropped) - 1)) | (1u << (dropped - 1));
  std::memcpy(&v, &u, sizeof v);
  return v;
}

void check_against_cpu(const Exec& cuda, const Conv2dShape& s, bool with_bias,
                       kernels::Math math = kernels::Math::fp32) {
  INFO("n=" << s.n << " c=" << s.c << " h=" << s.h << " w=" << s.w << " k=" << s.k << " r=" << s.r << " s=" << s.s
            << " stride=" << s.stride << " pad=" << s.pad << " bias=" << with_bias << " " << math_name(math));
  const auto x = random_floats(s.x_size()), w = random_floats(s.w_size()), bias = random_floats(size_t(s.k));
  const auto dy = random_floats(s.y_size());
  const std::vector<float>* b = with_bias ? &bias : nullptr;

  std::vector<float> y = poisoned(s.y_size()), dx = poisoned(s.x_size()), dw = poisoned(s.w_size()),
                     db = poisoned(with_bias ? size_t(s.k) : 0);
  Exec cpu;
  cpu.math = math;  // the twin rounds the operands as the GPU does
  const Conv2dArgs<float> ref{.shape = s,
                              .x = x.data(),
                              .w = w.data(),
                              .bias = b ? bias.data() : nullptr,
                              .y = y.data(),
                              .dy = dy.data(),
                              .dx = dx.data(),
                              .dw = dw.data(),
                              .dbias = b ? db.data() : nullptr};
  kernels::conv2d_forward(cpu, ref);
  kernels::conv2d_backward_data(cpu, ref);
  kernels::conv2d_backward_weight(cpu, ref);

  Exec gpu = cuda;
  gpu.math = math;
  const size_t ws = kernels::conv2d_workspace_floats(kernels::Backend::cuda, s);
  const GpuResults first = run_gpu(gpu, s, x, w, b, dy, ws);
  NT_REQUIRE_CLOSE(first.y, y, fp32_dot(s.c * s.r * s.s));
  NT_REQUIRE_CLOSE(first.dx, dx, fp32_dot(s.k * s.r * s.s));
  NT_REQUIRE_CLOSE(first.dw, dw, fp32_dot(s.n * s.p() * s.q()));
  if (with_bias) NT_REQUIRE_CLOSE(first.db, db, fp32_dot(s.n * s.p() * s.q()));

  const GpuResults second = run_gpu(gpu, s, x, w, b, dy, ws);
  CHECK(same_bits(first.y, second.y));
  CHECK(same_bits(first.dx, second.dx));
  CHECK(same_bits(first.dw, second.dw));
  CHECK(same_bits(first.db, second.db));
  // conv2d_backward runs the same kernels, backward_data beside backward_weight: the same bits.
  const GpuResults together = run_gpu(gpu, s, x, w, b, dy, ws, true);
  CHECK(same_bits(first.dx, together.dx));
  CHECK(same_bits(first.dw, together.dw));
  CHECK(same_bits(first.db, together.db));
  // ... and with the weight gradient on a side stream (the trainer's schedule on one GPU): the same bits again.
  const kernels::SideStream side(gpu);
  const GpuResults aside = run_gpu(gpu, s, x, w, b, dy, ws, true, &side);
  CHECK(same_bits(first.dx, aside.dx));
  CHECK(same_bits(first.dw, aside.dw));
  CHECK(same_bits(first.db, aside.db));
}

TEST_CASE("conv2d on CUDA matches the CPU twin on fixed shapes", "[cuda][conv]") {
  CudaExec cuda;
  const std::vector<Conv2dShape> shapes = {
      Conv2dShape{3, 5, 7, 9, 6, 3, 3, 1, 1},  // odd sizes
      Conv2dShape{3, 5, 7, 9, 6, 3, 3, 2, 0},  // stride 2: backward_data skips taps
      Conv2dShape{3, 5, 9, 8, 6, 3, 3, 2, 2},
      Conv2dShape{2, 5, 9, 11, 7, 5, 5, 1, 2},      // 5x5
      Conv2dShape{3, 5, 7, 9, 6, 1, 1, 2, 0},       // 1x1 stride 2
      Conv2dShape{2, 3, 6, 7, 4, 2, 3, 3, 1},       // non-square kernel, stride 3
      Conv2dShape{2, 64, 5, 5, 8, 3, 3, 1, 1},      // few tiles, long K: split-K in all passes
      Conv2dShape{1, 3, 70, 90, 40, 3, 3, 1, 1},    // many pixel tiles, M > 32
      Conv2dShape{5, 1, 11, 13, 5, 3, 3, 2, 1},     // 1x3x3, K = 5: the direct kernels, a partial channel group
      Conv2dShape{3, 1, 9, 9, 12, 5, 5, 1, 2},      // 1x5x5: 25 taps, the direct kernels with tap guards
      Conv2dShape{64, 1, 28, 28, 32, 3, 3, 1, 1},   // cnn conv1, batch 64
      Conv2dShape{64, 32, 14, 14, 64, 3, 3, 1, 1},  // cnn conv2, batch 64
      Conv2dShape{7, 32, 14, 14, 64, 3, 3, 1, 1},   // a partial last batch
      Conv2dShape{64, 16, 14, 14, 24, 3, 3, 1, 1},  // BF16: backward_weight channels-last on a 32-row tile, M < 32
      // 51076 pixels: BF16's backward_weight split to two blocks an SM, backward_data after it (400 tiles)
      Conv2dShape{1, 8, 226, 226, 8, 3, 3, 1, 1},
  };
  for (const kernels::Math math : math_modes()) {
    for (const auto& s : shapes) {
      check_against_cpu(cuda.exec, s, false, math);
      check_against_cpu(cuda.exec, s, true, math);
    }
  }
}

TEST_CASE("conv2d on CUDA matches the CPU twin on random shapes", "[cuda][conv]") {
  CudaExec cuda;
  auto pick = [](int lo, int hi) { return lo + int(rng()() % uint64_t(hi - lo + 1)); };
  int checked = 0;
  while (checked < 24) {
    const int ks[] = {1, 2, 3, 5};
    const Conv2dShape s{pick(1, 5),     pick(1, 40),    pick(1, 20), pick(1, 20), pick(1, 70),
                        ks[pick(0, 3)], ks[pick(0, 3)], pick(1, 3),  pick(0, 2)};
    if (s.p() == 0 || s.q() == 0) continue;
    const std::vector<kernels::Math> maths = math_modes();  // fp32, TF32 and BF16 in turn where the GPU has them
    check_against_cpu(cuda.exec, s, checked % 2 == 1, maths[size_t(checked / 2) % maths.size()]);
    ++checked;
  }
}

TEST_CASE("conv2d's halo tile (kernel lab) matches the CPU twin", "[cuda][conv]") {
  namespace lab = kernels::cuda::lab;
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  if (!cuda_device().has_tf32()) {  // the lab's TF32 tiles then refuse, naming what they need
    const Conv2dShape s{1, 3, 8, 8, 4, 3, 3, 1, 1};
    DeviceBuffer<float> d_x(gpu, random_floats(s.x_size())), d_w(gpu, random_floats(s.w_size()));
    DeviceBuffer<float> d_y(gpu, poisoned(s.y_size()));
    CHECK_THROWS_WITH(lab::conv2d_variant(gpu, lab::forward,
                                          Conv2dArgs<float>{.shape = s, .x = d_x.get(), .w = d_w.get(), .y = d_y.get()},
                                          lab::halo_64, 1),
                      Contains("need sm_80 code"));
    return;
  }
  const std::vector<Conv2dShape> shapes = {
      Conv2dShape{3, 5, 7, 9, 6, 3, 3, 1, 1},      // odd sizes, channels padded to 8
      Conv2dShape{2, 5, 9, 11, 7, 5, 5, 1, 2},     // 5x5
      Conv2dShape{2, 6, 8, 5, 4, 3, 2, 1, 2},      // R != S, pad > S - 1: backward_data's source pads differ
      Conv2dShape{2, 4, 6, 7, 3, 1, 1, 1, 1},      // 1x1, pad 1: backward_data's source pad is -1 (a crop)
      Conv2dShape{1, 70, 4, 5, 33, 3, 3, 1, 1},    // channels in three chunks of shared memory, 33 of 64 rows
      Conv2dShape{2, 3, 10, 30, 40, 3, 3, 1, 1},   // bands of 3 output rows, the last of 1
      Conv2dShape{7, 32, 14, 14, 64, 3, 3, 1, 1},  // the cnn's conv2
  };
  for (const auto& s : shapes) {
    INFO("n=" << s.n << " c=" << s.c << " h=" << s.h << " w=" << s.w << " k=" << s.k << " r=" << s.r << " s=" << s.s
              << " pad=" << s.pad);
    const auto x = random_floats(s.x_size()), w = random_floats(s.w_size()), dy = random_floats(s.y_size());
    const auto xm = kernels::rounded_to_tf32(x), wm = kernels::rounded_to_tf32(w), dym = kernels::rounded_to_tf32(dy);
    std::vector<float> y(s.y_size()), dx(s.x_size());
    const Exec cpu;
    const Conv2dArgs<float> ref{
        .shape = s, .x = xm.data(), .w = wm.data(), .y = y.data(), .dy = dym.data(), .dx = dx.data()};
    kernels::conv2d_forward(cpu, ref);
    kernels::conv2d_backward_data(cpu, ref);
    DeviceBuffer<float> d_x(gpu, x), d_w(gpu, w), d_dy(gpu, dy);
    for (const int tile : {lab::halo_64, lab::halo_32}) {
      INFO("tile " << tile);
      DeviceBuffer<float> d_y(gpu, poisoned(s.y_size())), d_dx(gpu, poisoned(s.x_size()));
      const Conv2dArgs<float> args{
          .shape = s, .x = d_x.get(), .w = d_w.get(), .y = d_y.get(), .dy = d_dy.get(), .dx = d_dx.get()};
      lab::conv2d_variant(gpu, lab::forward, args, tile, 1);
      lab::conv2d_variant(gpu, lab::backward_data, args, tile, 1);
      NT_REQUIRE_CLOSE(d_y.download(), y, fp32_dot(s.c * s.r * s.s));
      NT_REQUIRE_CLOSE(d_dx.download(), dx, fp32_dot(s.k * s.r * s.s));
    }
  }
}

// The channels-last kernel (kernels/cuda/conv_channels_last.cu) on every tile the lab can force, on shapes the plan
// would not give it (too few tiles): the forward where the input channels are a multiple of 4, backward_data where
// the output channels are and the stride is 1. The reference: the CPU's fp32 passes on TF32-rounded operands.
// The kernel lab's channels-last tiles of one operand format against the CPU twin: the fp32 passes on operands
// rounded as the format's stage rounds them (`rounded`; a product of two TF32 or two BF16 values is exact in fp32, so
// the tolerance is an fp32 sum's). vector: the channels a 16-byte copy carries. For each shape and tile: the forward,
// backward_data where it serves (stride 1, output channels a multiple of vector), and with weight_splits
// backward_weight at each split; every output poisoned first with a sentinel past its end, and the same bits again.
// Then the refusal of source channels that are no multiple of vector, and without sm_80 code the refusal of all.
void check_channels_last_tiles(const std::vector<Conv2dShape>& shapes, const std::vector<int>& tiles, int vector,
                               std::vector<float> (*rounded)(std::vector<float>),
                               const std::vector<int>& weight_splits = {}) {
  namespace lab = kernels::cuda::lab;
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  const Conv2dShape odd{1, vector / 2, 8, 8, vector, 3, 3, 1, 1};  // source channels no multiple of vector
  const auto refused = [&](const Conv2dShape& s, int tile, const std::string& reason) {
    DeviceBuffer<float> d_x(gpu, random_floats(s.x_size())), d_w(gpu, random_floats(s.w_size()));
    DeviceBuffer<float> d_y(gpu, poisoned(s.y_size())), d_ws(gpu, poisoned(4096));
    CHECK_THROWS_WITH(
        lab::conv2d_variant(
            gpu, lab::forward,
            Conv2dArgs<float>{.shape = s, .x = d_x.get(), .w = d_w.get(), .y = d_y.get(), .workspace = d_ws.get()},
            tile, 1),
        Contains(reason));
  };
  if (!cuda_device().has_tf32()) {  // TF32 and BF16 MMAs need sm_80 code: the lab's tiles refuse, naming it
    refused(Conv2dShape{1, vector, 8, 8, vector, 3, 3, 1, 1}, tiles[0], "need sm_80 code");
    return;
  }
  const auto poisoned_plus_sentinel = [&](size_t n) { return DeviceBuffer<float>(gpu, poisoned(n + 1)); };
  // The output of one lab call, checked against want (nothing written past the end), and the same bits again.
  const auto check_pass = [&](int pass, const Conv2dArgs<float>& args, int tile, int split, DeviceBuffer<float>& out,
                              const std::vector<float>& want, const Tolerance& tolerance) {
    lab::conv2d_variant(gpu, pass, args, tile, split);
    auto got = out.download();
    REQUIRE(std::isnan(got.back()));
    got.pop_back();
    NT_REQUIRE_CLOSE(got, want, tolerance);
    lab::conv2d_variant(gpu, pass, args, tile, split);  // the staged operands are rewritten; the sums' order is fixed
    auto again = out.download();
    again.pop_back();
    CHECK(same_bits(again, got));
  };
  for (const auto& s : shapes) {
    INFO("n=" << s.n << " c=" << s.c << " h=" << s.h << " w=" << s.w << " k=" << s.k << " r=" << s.r << " s=" << s.s
              << " stride=" << s.stride << " pad=" << s.pad);
    REQUIRE(s.c % vector == 0);  // every shape has a forward
    const bool backward_data = s.k % vector == 0 && s.stride == 1, backward_weight = s.k % vector == 0;
    const auto x = random_floats(s.x_size()), w = random_floats(s.w_size()), dy = random_floats(s.y_size());
    const auto xm = rounded(x), wm = rounded(w), dym = rounded(dy);
    std::vector<float> y(s.y_size()), dx(s.x_size()), dw(s.w_size());
    const Exec cpu;
    const Conv2dArgs<float> ref{
        .shape = s, .x = xm.data(), .w = wm.data(), .y = y.data(), .dy = dym.data(), .dx = dx.data(), .dw = dw.data()};
    kernels::conv2d_forward(cpu, ref);
    kernels::conv2d_backward_data(cpu, ref);
    kernels::conv2d_backward_weight(cpu, ref);
    DeviceBuffer<float> d_x(gpu, x), d_w(gpu, w), d_dy(gpu, dy);
    size_t ws = std::max(lab::conv2d_variant_workspace_floats(lab::forward, s, 1),
                         lab::conv2d_variant_workspace_floats(lab::backward_data, s, 1));
    for (const int split : weight_splits)
      ws = std::max(ws, lab::conv2d_variant_workspace_floats(lab::backward_weight, s, split));
    DeviceBuffer<float> d_ws(gpu, poisoned(ws));
    for (const int tile : tiles) {
      INFO("tile " << tile);
      auto d_y = poisoned_plus_sentinel(s.y_size()), d_dx = poisoned_plus_sentinel(s.x_size());
      const Conv2dArgs<float> args{.shape = s,
                                   .x = d_x.get(),
                                   .w = d_w.get(),
                                   .y = d_y.get(),
                                   .dy = d_dy.get(),
                                   .dx = d_dx.get(),
                                   .workspace = d_ws.get()};
      check_pass(lab::forward, args, tile, 1, d_y, y, fp32_dot(s.c * s.r * s.s));
      if (backward_data) {
        check_pass(lab::backward_data, args, tile, 1, d_dx, dx, fp32_dot(s.k * s.r * s.s));
      } else {
        CHECK_THROWS_WITH(lab::conv2d_variant(gpu, lab::backward_data, args, tile, 1),
                          Contains(s.stride != 1 ? std::string("stride 1") : cat("a multiple of ", vector)));
      }
      if (!backward_weight) continue;
      for (const int split : weight_splits) {
        INFO("backward_weight, split " << split);
        auto d_dw = poisoned_plus_sentinel(s.w_size());  // poisoned afresh for each split
        Conv2dArgs<float> weight_args = args;
        weight_args.dw = d_dw.get();
        check_pass(lab::backward_weight, weight_args, tile, split, d_dw, dw, fp32_dot(s.n * s.p() * s.q()));
      }
    }
  }
  refused(odd, tiles.back(), cat("a multiple of ", vector));
}

TEST_CASE("conv2d's channels-last TF32 kernel (kernel lab) matches the CPU twin", "[cuda][conv]") {
  namespace lab = kernels::cuda::lab;
  const std::vector<Conv2dShape> shapes = {
      Conv2dShape{3, 8, 7, 9, 12, 3, 3, 1, 1},     // odd image sizes; 12 outputs: a part of a 32-row tile
      Conv2dShape{1, 4, 5, 3, 8, 3, 3, 1, 1},      // one image of 15 pixels: a part of one column tile
      Conv2dShape{2, 12, 9, 11, 20, 5, 5, 1, 2},   // 5x5, Kg = 300: a last slab of 12
      Conv2dShape{2, 8, 8, 5, 4, 3, 2, 1, 2},      // R != S, pad > S - 1: backward_data's width pad is -1 (a crop)
      Conv2dShape{2, 4, 6, 7, 4, 1, 1, 1, 1},      // 1x1, pad 1
      Conv2dShape{3, 8, 9, 8, 7, 3, 3, 2, 1},      // stride 2, 7 outputs: the forward only
      Conv2dShape{2, 4, 9, 7, 8, 3, 3, 2, 1},      // stride 2: the forward and backward_weight
      Conv2dShape{1, 68, 4, 5, 36, 3, 3, 1, 1},    // 36 outputs: rows past M in a 64-row tile; 68 channels
      Conv2dShape{7, 32, 14, 14, 64, 3, 3, 1, 1},  // the cnn's conv2
  };
  check_channels_last_tiles(shapes,
                            {lab::channels_last_64x64, lab::channels_last_64x32, lab::channels_last_32x64,
                             lab::channels_last_32x32, lab::channels_last_64x64_8w, lab::channels_last_32x64_8w},
                            4, kernels::rounded_to_tf32, /*weight_splits=*/{1, 3});
  check_channels_last_tiles(shapes,
                            {lab::channels_last_64x96_12w, lab::channels_last_64x48_6w, lab::channels_last_32x96_12w,
                             lab::channels_last_32x48_6w, lab::channels_last_64x128_16w, lab::channels_last_32x128_16w,
                             lab::channels_last_64x96_8w},
                            4, kernels::rounded_to_tf32);  // no backward_weight on these tiles
}

TEST_CASE("conv2d's channels-last kernel with BF16 operands (kernel lab) matches the CPU twin", "[cuda][conv]") {
  namespace lab = kernels::cuda::lab;
  const std::vector<Conv2dShape> shapes = {
      Conv2dShape{3, 8, 7, 9, 16, 3, 3, 1, 1},     // odd image sizes; 16 outputs: a part of a 32-row tile
      Conv2dShape{1, 8, 5, 3, 8, 3, 3, 1, 1},      // one image of 15 pixels: a part of one column tile
      Conv2dShape{2, 16, 9, 11, 24, 5, 5, 1, 2},   // 5x5, Kg = 400: a last slab of 16
      Conv2dShape{2, 8, 8, 5, 8, 3, 2, 1, 2},      // R != S, pad > S - 1: backward_data's width pad is -1 (a crop)
      Conv2dShape{2, 8, 6, 7, 8, 1, 1, 1, 1},      // 1x1, pad 1
      Conv2dShape{3, 8, 9, 8, 7, 3, 3, 2, 1},      // stride 2, 7 outputs: the forward only
      Conv2dShape{1, 72, 4, 5, 40, 3, 3, 1, 1},    // 40 outputs: rows past M in a 64-row tile; 72 channels
      Conv2dShape{7, 32, 14, 14, 64, 3, 3, 1, 1},  // the cnn's conv2
  };
  check_channels_last_tiles(
      shapes,
      {lab::channels_last_bf16_64x64_8w, lab::channels_last_bf16_32x64_8w, lab::channels_last_bf16_64x32,
       lab::channels_last_bf16_64x96_12w, lab::channels_last_bf16_64x48_6w, lab::channels_last_bf16_32x96_12w,
       lab::channels_last_bf16_32x48_6w, lab::channels_last_bf16_64x128_16w, lab::channels_last_bf16_32x128_16w,
       lab::channels_last_bf16_64x96_8w},
      8, kernels::rounded_to_bf16, /*weight_splits=*/{1, 3});
}

TEST_CASE("conv2d's channels-last kernel on warpgroup MMAs (kernel lab) matches the CPU twin and mma.sync's bits",
          "[cuda][conv]") {
  // The wgmma kernels (sm_90a code) on the shapes of the two tests above, against the CPU twin: forward and
  // backward_data in both formats, backward_weight in BF16 (64-row tiles; MN-major operands, which wgmma takes in
  // 16-bit formats only) at splits 1 and 3. Then bit for bit against the mma.sync kernel of the same tile on conv2-like
  // shapes: both sum each output slab by slab in kg (or pixel) order and a slab's k steps in order, each step an MMA
  // of k 8 (TF32) or 16 (BF16) into the fp32 accumulator. Without sm_90a code the tiles refuse, naming it.
  namespace lab = kernels::cuda::lab;
  if (!cuda_device().warpgroup_mma) {
    CudaExec cuda;
    const Conv2dShape s{1, 8, 8, 8, 8, 3, 3, 1, 1};
    DeviceBuffer<float> d_x(cuda.exec, random_floats(s.x_size())), d_w(cuda.exec, random_floats(s.w_size()));
    DeviceBuffer<float> d_y(cuda.exec, poisoned(s.y_size())), d_ws(cuda.exec, poisoned(4096));
    CHECK_THROWS_WITH(
        lab::conv2d_variant(
            cuda.exec, lab::forward,
            Conv2dArgs<float>{.shape = s, .x = d_x.get(), .w = d_w.get(), .y = d_y.get(), .workspace = d_ws.get()},
            lab::channels_last_wg_64x64, 1),
        Contains(cuda_device().has_tf32() ? "sm_90a" : "need sm_80 code"));
    return;
  }
  check_channels_last_tiles(
      {
          Conv2dShape{3, 8, 7, 9, 12, 3, 3, 1, 1},     // odd image sizes; 12 outputs: a part of a 32-row tile
          Conv2dShape{1, 4, 5, 3, 8, 3, 3, 1, 1},      // one image of 15 pixels: a part of one column tile
          Conv2dShape{2, 12, 9, 11, 20, 5, 5, 1, 2},   // 5x5, Kg = 300: a last slab of 12
          Conv2dShape{2, 8, 8, 5, 4, 3, 2, 1, 2},      // R != S, pad > S - 1: backward_data's width pad is -1
          Conv2dShape{3, 8, 9, 8, 7, 3, 3, 2, 1},      // stride 2, 7 outputs: the forward only
          Conv2dShape{1, 68, 4, 5, 36, 3, 3, 1, 1},    // 36 outputs: rows past M in a 64-row tile; 68 channels
          Conv2dShape{7, 32, 14, 14, 64, 3, 3, 1, 1},  // the cnn's conv2
      },
      {lab::channels_last_wg_64x64, lab::channels_last_wg_64x96, lab::channels_last_wg_64x128,
       lab::channels_last_wg_32x64, lab::channels_last_wg_32x96, lab::channels_last_wg_32x128},
      4, kernels::rounded_to_tf32);
  check_channels_last_tiles(
      {
          Conv2dShape{3, 8, 7, 9, 16, 3, 3, 1, 1},     // odd image sizes; 16 outputs: a part of a 32-row tile
          Conv2dShape{2, 16, 9, 11, 24, 5, 5, 1, 2},   // 5x5, Kg = 400: a last slab of 16
          Conv2dShape{2, 8, 8, 5, 8, 3, 2, 1, 2},      // R != S, pad > S - 1
          Conv2dShape{1, 72, 4, 5, 40, 3, 3, 1, 1},    // 40 outputs: rows past M in a 64-row tile; 72 channels
          Conv2dShape{7, 32, 14, 14, 64, 3, 3, 1, 1},  // the cnn's conv2
      },
      {lab::channels_last_bf16_wg_64x64, lab::channels_last_bf16_wg_64x96, lab::channels_last_bf16_wg_64x128,
       lab::channels_last_bf16_wg_32x64, lab::channels_last_bf16_wg_32x96, lab::channels_last_bf16_wg_32x128},
      8, kernels::rounded_to_bf16);
  check_channels_last_tiles(
      {
          Conv2dShape{3, 8, 7, 9, 16, 3, 3, 1, 1},     // odd image sizes: 189 pixels, a last slab of 29
          Conv2dShape{2, 16, 9, 11, 24, 5, 5, 1, 2},   // 5x5: 400 columns, a part of the last column tile
          Conv2dShape{2, 8, 8, 5, 8, 3, 2, 1, 2},      // R != S, pad > S - 1
          Conv2dShape{3, 8, 9, 8, 8, 3, 3, 2, 1},      // stride 2
          Conv2dShape{1, 72, 4, 5, 40, 3, 3, 1, 1},    // 40 outputs: rows past M in the 64-row tile; 72 channels
          Conv2dShape{7, 32, 14, 14, 64, 3, 3, 1, 1},  // the cnn's conv2
      },
      {lab::channels_last_bf16_wg_64x64, lab::channels_last_bf16_wg_64x96, lab::channels_last_bf16_wg_64x128}, 8,
      kernels::rounded_to_bf16, /*weight_splits=*/{1, 3});

  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  struct Pair {
    int warpgroup, sync;
  };
  for (const Conv2dShape& s : {Conv2dShape{7, 32, 14, 14, 64, 3, 3, 1, 1}, Conv2dShape{3, 16, 9, 11, 40, 3, 3, 1, 1}})
    for (const Pair pair : {Pair{lab::channels_last_wg_64x96, lab::channels_last_64x96_12w},
                            Pair{lab::channels_last_wg_32x64, lab::channels_last_32x64},
                            Pair{lab::channels_last_bf16_wg_64x96, lab::channels_last_bf16_64x96_12w},
                            Pair{lab::channels_last_bf16_wg_32x64, lab::channels_last_bf16_32x64_8w}})
      for (const int pass : {int(lab::forward), int(lab::backward_data), int(lab::backward_weight)}) {
        const bool weight = pass == lab::backward_weight;
        if (weight && pair.warpgroup != lab::channels_last_bf16_wg_64x96) continue;  // BF16 64-row tiles only
        const int split = weight ? 3 : 1;
        INFO("n=" << s.n << " c=" << s.c << " k=" << s.k << " tiles " << pair.warpgroup << ", "
                  << (weight ? int(lab::channels_last_bf16_64x96_8w) : pair.sync) << " pass " << pass);
        DeviceBuffer<float> d_x(gpu, random_floats(s.x_size())), d_w(gpu, random_floats(s.w_size()));
        DeviceBuffer<float> d_dy(gpu, random_floats(s.y_size()));
        DeviceBuffer<float> d_ws(gpu, poisoned(std::max({lab::conv2d_variant_workspace_floats(lab::forward, s, 1),
                                                         lab::conv2d_variant_workspace_floats(lab::backward_data, s, 1),
                                                         lab::conv2d_variant_workspace_floats(pass, s, split)})));
        const size_t out_size = pass == lab::forward ? s.y_size() : weight ? s.w_size() : s.x_size();
        const auto run = [&](int tile) {
          DeviceBuffer<float> d_out(gpu, poisoned(out_size));
          const Conv2dArgs<float> args{.shape = s,
                                       .x = d_x.get(),
                                       .w = d_w.get(),
                                       .y = d_out.get(),
                                       .dy = d_dy.get(),
                                       .dx = d_out.get(),
                                       .dw = d_out.get(),
                                       .workspace = d_ws.get()};
          lab::conv2d_variant(gpu, pass, args, tile, split);
          return d_out.download();
        };
        // The weight kernels' mma.sync tile of 64×96 runs on 8 warps (the plan's).
        CHECK(same_bits(run(pair.warpgroup), run(weight ? int(lab::channels_last_bf16_64x96_8w) : pair.sync)));
      }
}

TEST_CASE("conv2d on CUDA with TF32 or BF16 rounds each operand as round_to_tf32 or round_to_bf16 does",
          "[cuda][conv]") {
  // A 1x1 convolution over 40 channels (a GEMM, not the direct kernel) of which only channel 0 is non-zero:
  // y = x0·w0 exactly, so the GPU's product must equal round(x0)·round(w0) bit for bit. x0 holds random values and
  // values whose dropped bits are exactly half of their range (ties: away from zero in TF32, to even in BF16).
  const kernels::Math math = GENERATE(kernels::Math::tf32, kernels::Math::bf16);
  INFO(math_name(math));
  CudaExec cuda;
  Exec gpu = cuda.exec;
  gpu.math = math;
  const Conv2dShape s{1, 40, 16, 16, 3, 1, 1, 1, 0};
  if (!cuda_device().has_tf32()) {  // without sm_80 code the tensor-core kernels refuse, naming what they need
    DeviceBuffer<float> d_x(gpu, random_floats(s.x_size())), d_w(gpu, random_floats(s.w_size()));
    DeviceBuffer<float> d_y(gpu, poisoned(s.y_size()));
    CHECK_THROWS_WITH(
        kernels::conv2d_forward(gpu, Conv2dArgs<float>{.shape = s, .x = d_x.get(), .w = d_w.get(), .y = d_y.get()}),
        Contains("need sm_80 code"));
    return;
  }
  const int dropped = math == kernels::Math::tf32 ? 13 : 16;  // the mantissa bits the format drops
  std::vector<float> x(s.x_size(), 0.f), w(s.w_size(), 0.f);
  const auto values = random_floats(256);
  for (int i = 0; i < 256; ++i) {
    x[size_t(i)] = values[size_t(i)];  // channel 0 of image 0
    if (i % 4 == 0) x[size_t(i)] = with_tie_bits(x[size_t(i)], dropped);
  }
  // a tie, a round-up, a random-ish one
  const float w0[3] = {1.f + std::ldexp(1.f, -(24 - dropped)), -1.f - std::ldexp(1.5f, -(24 - dropped)), 0.7f};
  for (int k = 0; k < 3; ++k) w[size_t(k) * 40] = w0[k];
  DeviceBuffer<float> d_x(gpu, x), d_w(gpu, w), d_y(gpu, poisoned(s.y_size()));
  DeviceBuffer<float> d_ws(gpu, at_least_one(poisoned(kernels::conv2d_workspace_floats(kernels::Backend::cuda, s))));
  kernels::conv2d_forward(
      gpu, Conv2dArgs<float>{.shape = s, .x = d_x.get(), .w = d_w.get(), .y = d_y.get(), .workspace = d_ws.get()});
  const auto y = d_y.download();
  std::vector<float> want(s.y_size());
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < 256; ++i)
      want[size_t(k) * 256 + size_t(i)] =
          kernels::round_operand(x[size_t(i)], math) * kernels::round_operand(w0[k], math);
  CHECK(same_bits(y, want));
  CHECK_FALSE(same_bits(want, [&] {  // the rounding is visible: fp32 products differ
    std::vector<float> exact(s.y_size());
    for (int k = 0; k < 3; ++k)
      for (int i = 0; i < 256; ++i) exact[size_t(k) * 256 + size_t(i)] = x[size_t(i)] * w0[k];
    return exact;
  }()));
}

TEST_CASE(
    "conv2d on CUDA takes x and dy staged in TF32 or BF16 where its plan multiplies them so, with the bits they give "
    "in fp32",
    "[cuda][conv][bf16]") {
  // kernels/conv.h, 'Staged operands': the layer's neighbours write x and dy channels-last in the math's element and
  // the passes read them there, which must change nothing, since the passes round x and dy the same way as they stage
  // them. Every output poisoned with a sentinel past its end; the passes from x_staged, dy_staged or both against the
  // same passes from x and dy, bit for bit (conv2d_backward and backward_data and backward_weight alone), and against
  // the CPU twin on rounded operands (fp32_dot, as the tests above). Shapes: the cnn's conv2 at batch 64 and at 42
  // (the fewest images whose pixels fill the channels-last tiles), and 16 -> 24 channels of 19x21 images (a 32-row
  // tile). BF16 with dbias; TF32 without (its dbias sums the unrounded dy, so a bias takes no staged operands).
  const kernels::Math math = GENERATE(kernels::Math::tf32, kernels::Math::bf16);
  INFO(math_name(math));
  if (!cuda_device().has_tf32()) {
    WARN("staged operands not checked: " << cuda_device().name << " runs " << cuda_device().code_path());
    return;
  }
  CudaExec cuda;
  Exec gpu = cuda.exec;
  gpu.math = math;
  const bool bias = math == kernels::Math::bf16;
  const Conv2dShape shapes[] = {
      {64, 32, 14, 14, 64, 3, 3, 1, 1}, {42, 32, 14, 14, 64, 3, 3, 1, 1}, {40, 16, 19, 21, 24, 3, 3, 1, 1}};
  for (const Conv2dShape& s : shapes) {
    INFO("n=" << s.n << " c=" << s.c << " " << s.h << "x" << s.w << " k=" << s.k);
    REQUIRE(kernels::conv2d_takes_staged(kernels::Backend::cuda, s, math, bias));
    CHECK(kernels::conv2d_takes_staged(kernels::Backend::cuda, s, math, true) == (math == kernels::Math::bf16));
    CHECK_FALSE(kernels::conv2d_takes_staged(kernels::Backend::cuda, s, kernels::Math::fp32, false));
    CHECK_FALSE(kernels::conv2d_takes_staged(kernels::Backend::cpu, s, math, false));
    const auto x = random_floats(s.x_size()), w = random_floats(s.w_size()), dy = random_floats(s.y_size());
    DeviceBuffer<float> d_x(gpu, x), d_w(gpu, w), d_dy(gpu, dy);
    DeviceBuffer<uint32_t> x_staged(gpu, staged_copy(math, x, s.n, s.c, int64_t(s.h) * s.w)),
        dy_staged(gpu, staged_copy(math, dy, s.n, s.k, int64_t(s.p()) * s.q()));
    DeviceBuffer<float> d_ws(gpu, poisoned(kernels::conv2d_workspace_floats(kernels::Backend::cuda, s)));
    // y, dx, dw and dbias, from x and dy or from the staged ones (the fp32 pointers then null): conv2d_backward, and
    // backward_data and backward_weight alone, which must agree with it.
    auto run = [&](bool x_from_staged, bool dy_from_staged) {
      DeviceBuffer<float> y(gpu, poisoned(s.y_size() + 1)), dx(gpu, poisoned(s.x_size() + 1)),
          dw(gpu, poisoned(s.w_size() + 1)), db(gpu, poisoned(size_t(s.k) + 1)), dw_alone(gpu, poisoned(s.w_size())),
          dx_alone(gpu, poisoned(s.x_size()));
      Conv2dArgs<float> a{.shape = s,
                          .x = x_from_staged ? nullptr : d_x.get(),
                          .w = d_w.get(),
                          .y = y.get(),
                          .dy = dy_from_staged ? nullptr : d_dy.get(),
                          .dx = dx.get(),
                          .dw = dw.get(),
                          .dbias = bias ? db.get() : nullptr,
                          .workspace = d_ws.get(),
                          .x_staged = x_from_staged ? x_staged.get() : nullptr,
                          .dy_staged = dy_from_staged ? dy_staged.get() : nullptr};
      kernels::conv2d_forward(gpu, a);
      kernels::conv2d_backward(gpu, a);
      a.dw = dw_alone.get(), a.dbias = nullptr, a.dx = dx_alone.get();
      kernels::conv2d_backward_weight(gpu, a);
      kernels::conv2d_backward_data(gpu, a);
      std::vector<std::vector<float>> out{y.download(), dx.download(), dw.download(), db.download()};
      for (auto& v : out) {
        REQUIRE(std::isnan(v.back()));  // nothing past the end
        v.pop_back();
      }
      CHECK(same_bits(out[2], dw_alone.download()));
      CHECK(same_bits(out[1], dx_alone.download()));
      return out;
    };
    const auto from_x = run(false, false);
    std::vector<std::vector<float>> from_staged;
    for (const auto& [x_from_staged, dy_from_staged] : {std::pair{true, false}, {false, true}, {true, true}}) {
      INFO("staged: x " << x_from_staged << ", dy " << dy_from_staged);
      from_staged = run(x_from_staged, dy_from_staged);
      for (size_t i = 0; i < from_x.size(); ++i) {
        INFO("output " << i << " (y, dx, dw, dbias)");
        CHECK(same_bits(from_staged[i], from_x[i]));
      }
    }
    const auto xr = kernels::rounded_operands(x, math), wr = kernels::rounded_operands(w, math),
               dyr = kernels::rounded_operands(dy, math);
    std::vector<float> y(s.y_size()), dw(s.w_size());
    kernels::conv2d_forward(Exec{}, Conv2dArgs<float>{.shape = s, .x = xr.data(), .w = wr.data(), .y = y.data()});
    kernels::conv2d_backward_weight(Exec{},
                                    Conv2dArgs<float>{.shape = s, .x = xr.data(), .dy = dyr.data(), .dw = dw.data()});
    NT_REQUIRE_CLOSE(from_staged[0], y, fp32_dot(s.c * s.r * s.s));
    NT_REQUIRE_CLOSE(from_staged[2], dw, fp32_dot(s.n * s.p() * s.q()));
  }
  // A staged input where the plan has none: fp32 math, or a batch too small for the channels-last tiles.
  const Conv2dShape small{2, 32, 14, 14, 64, 3, 3, 1, 1};
  CHECK_FALSE(kernels::conv2d_takes_staged(kernels::Backend::cuda, small, math, false));
  DeviceBuffer<uint32_t> staged_x(gpu, std::vector<uint32_t>(small.x_size()));
  DeviceBuffer<float> w(gpu, random_floats(small.w_size())), y(gpu, poisoned(small.y_size()));
  DeviceBuffer<float> ws(gpu, poisoned(kernels::conv2d_workspace_floats(kernels::Backend::cuda, small)));
  const Conv2dArgs<float> a{
      .shape = small, .w = w.get(), .y = y.get(), .workspace = ws.get(), .x_staged = staged_x.get()};
  CHECK_THROWS_WITH(kernels::conv2d_forward(gpu, a), Contains("staged"));
  CHECK_THROWS_WITH(kernels::conv2d_forward(cuda.exec, a), Contains("staged"));
  DeviceBuffer<float> dx(gpu, poisoned(small.x_size()));
  const Conv2dArgs<float> b{
      .shape = small, .w = w.get(), .dx = dx.get(), .workspace = ws.get(), .dy_staged = staged_x.get()};
  CHECK_THROWS_WITH(kernels::conv2d_backward_data(gpu, b), Contains("staged"));
}

TEST_CASE("conv2d on CUDA: a partial batch fits the full batch's workspace", "[cuda][conv]") {
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  // conv2: backward_weight splits K = 12544 over blocks; conv1: the direct backward_weight's per-block partials
  for (const auto& full : {Conv2dShape{64, 32, 14, 14, 64, 3, 3, 1, 1}, Conv2dShape{64, 1, 28, 28, 32, 3, 3, 1, 1}}) {
    const size_t ws = kernels::conv2d_workspace_floats(kernels::Backend::cuda, full);
    REQUIRE(ws > 0);
    const float guard = 12345.f;
    for (int n : {1, 3, 17, 63}) {
      INFO("c=" << full.c << " n=" << n);
      Conv2dShape s = full;
      s.n = n;
      REQUIRE(kernels::conv2d_workspace_floats(kernels::Backend::cuda, s) <= ws);
      const auto x = random_floats(s.x_size()), w = random_floats(s.w_size()), dy = random_floats(s.y_size());
      std::vector<float> ws_host(ws + 4096, guard);
      DeviceBuffer<float> d_x(gpu, x), d_w(gpu, w), d_dy(gpu, dy), d_ws(gpu, ws_host);
      DeviceBuffer<float> d_y(gpu, poisoned(s.y_size())), d_dx(gpu, poisoned(s.x_size())),
          d_dw(gpu, poisoned(s.w_size()));
      DeviceBuffer<float> d_db(gpu, poisoned(size_t(s.k)));
      std::vector<kernels::Math> maths = math_modes();
      std::reverse(maths.begin(), maths.end());  // fp32 last: its dw is checked below
      for (const kernels::Math math : maths) {
        Exec mode = gpu;
        mode.math = math;
        const Conv2dArgs<float> args{.shape = s,
                                     .x = d_x.get(),
                                     .w = d_w.get(),
                                     .y = d_y.get(),
                                     .dy = d_dy.get(),
                                     .dx = d_dx.get(),
                                     .dw = d_dw.get(),
                                     .dbias = d_db.get(),
                                     .workspace = d_ws.get()};
        kernels::conv2d_forward(mode, args);
        kernels::conv2d_backward_data(mode, args);
        kernels::conv2d_backward_weight(mode, args);
        const auto after = d_ws.download();
        CHECK(std::all_of(after.begin() + long(ws), after.end(), [&](float v) { return v == guard; }));
      }

      std::vector<float> dw(s.w_size()), db(size_t(s.k));
      kernels::conv2d_backward_weight(
          Exec{}, Conv2dArgs<float>{.shape = s, .x = x.data(), .dy = dy.data(), .dw = dw.data(), .dbias = db.data()});
      NT_REQUIRE_CLOSE(d_dw.download(), dw, fp32_dot(s.n * s.p() * s.q()));
      NT_REQUIRE_CLOSE(d_db.download(), db, fp32_dot(s.n * s.p() * s.q()));
    }
  }
}

}  // namespace
}  // namespace nt::test
