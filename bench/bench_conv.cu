// Conv kernel lab: nanotrain's implicit-GEMM conv2d passes at the cnn's shapes, in every math mode: fp32
// (FFMA), tf32 and bf16 (Exec::math: operands rounded to TF32 or BF16, tensor-core MMAs, fp32 sums).
//
//   bench_conv [output-folder]      prints a table; with a folder also writes conv.csv there, which
//                                   bench/conv_torch.py joins with PyTorch's (cuDNN) timings in the same
//                                   math; then the variant table (conv_variants.csv): conv2's passes with
//                                   each tile and split forced through the kernel lab (kernels/conv_lab.h)
//
// Shapes: conv1 x(N,1,28,28) w(32,1,3,3) pad 1 and conv2 x(N,32,14,14) w(64,32,3,3) pad 1, N = 64 and 256;
// passes forward, backward_data (dx; the cnn never needs conv1's), backward_weight (dw, no bias: the cnn's
// convs feed BatchNorm). Method: random inputs in [-1, 1]; each pass is first checked against the CPU twin
// (max |diff| / max |cpu|; for tf32 and bf16, and the lab's mma_ and bf16_ rows, the CPU twin in that math mode: the
// fp32 pass on rounded operands). Timing: the median of
// 50 repetitions of an event-timed loop of 100 back-to-back calls after warm-up, divided by 100 ("us", what
// conv_torch.py measures for cuDNN the same way), and the same from a CUDA graph of 100 calls ("us graph", no host
// launch cost: the engine's training step). GFLOP/s counts 2·N·K·P·Q·C·R·S per pass. Operands stay L2-resident between
// calls, as in training.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_timing.h"
#include "core/cuda_check.h"
#include "kernels/conv.h"
#include "kernels/conv_lab.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/runtime.h"

namespace {

using nt::kernels::Conv2dArgs;
using nt::kernels::Conv2dShape;
using nt::kernels::Exec;

constexpr int kReps = 50;
constexpr int kCalls = 100;

struct Case {
  const char* name;
  Conv2dShape shape;
};

Conv2dShape conv_shape(int n, int c, int hw, int k) {
  Conv2dShape s;
  s.n = n, s.c = c, s.h = hw, s.w = hw, s.k = k, s.r = 3, s.s = 3, s.stride = 1, s.pad = 1;
  return s;
}

// The CPU twin's three passes of one shape in each math mode, out[math][pass] (pass as the lab's: y, dx, dw): for
// TF32 and BF16, the twin on operands rounded as the GPU rounds them (kernels/operand.h).
using nt::kernels::Math;
constexpr Math kMaths[] = {Math::fp32, Math::tf32, Math::bf16};
struct References {
  std::vector<float> out[std::size(kMaths)][3];
};
References cpu_passes(const Exec& cpu, const Conv2dShape& s, const std::vector<float>& x, const std::vector<float>& w,
                      const std::vector<float>& dy) {
  References r;
  for (const Math math : kMaths) {
    Exec twin = cpu;
    twin.math = math;
    auto& out = r.out[static_cast<int>(math)];
    out[0].resize(s.y_size()), out[1].resize(s.x_size()), out[2].resize(s.w_size());
    const Conv2dArgs<float> args{.shape = s,
                                 .x = x.data(),
                                 .w = w.data(),
                                 .y = out[0].data(),
                                 .dy = dy.data(),
                                 .dx = out[1].data(),
                                 .dw = out[2].data()};
    nt::kernels::conv2d_forward(twin, args);
    nt::kernels::conv2d_backward_data(twin, args);
    nt::kernels::conv2d_backward_weight(twin, args);
  }
  return r;
}

std::vector<float> random_host(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

float* to_device(const std::vector<float>& host) {
  float* dev = nullptr;
  NT_CUDA_CHECK(cudaMalloc(&dev, std::max<size_t>(host.size(), 1) * sizeof(float)));
  NT_CUDA_CHECK(cudaMemcpy(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  return dev;
}

double relative_difference(const float* dev, const std::vector<float>& ref) {
  std::vector<float> got(ref.size());
  NT_CUDA_CHECK(cudaMemcpy(got.data(), dev, ref.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff = std::max(diff, std::abs(double(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(double(ref[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string out_dir = argc > 1 ? argv[1] : "";
  cudaDeviceProp prop{};
  NT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, sm_%d%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);

  Exec exec;
  exec.backend = nt::kernels::Backend::cuda;
  exec.stream = nt::kernels::create_stream();
  auto stream = static_cast<cudaStream_t>(exec.stream);
  nt::kernels::ThreadPool pool;
  Exec cpu;
  cpu.pool = &pool;
  std::mt19937 rng(7);

  const Case cases[] = {{"conv1 b64", conv_shape(64, 1, 28, 32)},
                        {"conv2 b64", conv_shape(64, 32, 14, 64)},
                        {"conv1 b256", conv_shape(256, 1, 28, 32)},
                        {"conv2 b256", conv_shape(256, 32, 14, 64)}};

  std::string csv = "shape,pass,math,M,N,K,us,us_graph,gflops,rel_diff\n";
  std::printf("\n%-11s %-16s %-5s %6s %7s %6s %9s %9s %9s %9s\n", "shape", "pass", "math", "M", "N", "K", "us",
              "us graph", "GFLOP/s", "rel diff");
  for (const auto& c : cases) {
    const Conv2dShape& s = c.shape;
    const size_t nx = s.x_size(), nw = s.w_size(), ny = s.y_size();
    const auto hx = random_host(nx, rng), hw = random_host(nw, rng), hdy = random_host(ny, rng);
    float *x = to_device(hx), *w = to_device(hw), *dy = to_device(hdy);
    float *y = to_device(std::vector<float>(ny)), *dx = to_device(std::vector<float>(nx));
    float* dw = to_device(std::vector<float>(nw));
    const size_t ws_floats = nt::kernels::conv2d_workspace_floats(nt::kernels::Backend::cuda, s);
    float* ws = to_device(std::vector<float>(ws_floats));

    const References refs = cpu_passes(cpu, s, hx, hw, hdy);

    const int P = s.p(), Q = s.q();
    const Conv2dArgs<float> args{.shape = s, .x = x, .w = w, .y = y, .dy = dy, .dx = dx, .dw = dw, .workspace = ws};
    struct Pass {
      const char* name;
      int M, N, K;
      std::function<void()> call;
      const float* out;
      int ref;  // the lab's pass
    };
    const Pass passes[] = {
        {"forward", s.k, s.n * P * Q, s.c * s.r * s.s, [&] { nt::kernels::conv2d_forward(exec, args); }, y, 0},
        {"backward_data", s.c, s.n * s.h * s.w, s.k * s.r * s.s, [&] { nt::kernels::conv2d_backward_data(exec, args); },
         dx, 1},
        {"backward_weight", s.k, s.c * s.r * s.s, s.n * P * Q, [&] { nt::kernels::conv2d_backward_weight(exec, args); },
         dw, 2},
    };
    const double flops = 2.0 * s.n * s.k * P * Q * double(s.c) * s.r * s.s;
    for (const auto& p : passes) {
      for (const Math math : kMaths) {
        exec.math = math;
        p.call();
        nt::kernels::synchronize(exec);
        const double diff = relative_difference(p.out, refs.out[static_cast<int>(math)][p.ref]);
        const double us = nt::bench::time_loop_us(stream, kCalls, kReps, p.call);
        const double us_graph = nt::bench::time_graph_us(exec, kCalls, kReps, p.call);
        const double gflops = flops / (us_graph * 1e3);
        const char* name = nt::profile::math_name(math);
        std::printf("%-11s %-16s %-5s %6d %7d %6d %9.2f %9.2f %9.0f %9.1e\n", c.name, p.name, name, p.M, p.N, p.K, us,
                    us_graph, gflops, diff);
        char line[256];
        std::snprintf(line, sizeof line, "%s,%s,%s,%d,%d,%d,%.3f,%.3f,%.1f,%.3e\n", c.name, p.name, name, p.M, p.N, p.K,
                      us, us_graph, gflops, diff);
        csv += line;
      }
    }
    exec.math = Math::fp32;
    for (float* ptr : {x, w, dy, y, dx, dw, ws}) NT_CUDA_CHECK(cudaFree(ptr));
  }

  // Variant table: conv2's passes with the candidate tiles and splits forced (graph µs), to tune choose_plan.
  namespace lab = nt::kernels::cuda::lab;
  struct Variant {
    int pass, tile, split;
  };
  const Variant variants[] = {
      {lab::forward, lab::narrow, 1},
      {lab::forward, lab::narrow_grouped, 1},
      {lab::forward, lab::medium, 1},
      {lab::forward, lab::tall_grouped, 1},
      {lab::forward, lab::wide_grouped, 1},
      {lab::backward_data, lab::narrow, 1},
      {lab::backward_data, lab::small_grouped, 1},
      {lab::backward_data, lab::narrow_grouped, 1},
      {lab::backward_data, lab::wide_grouped, 1},
      {lab::backward_data, lab::wide_grouped, 2},
      {lab::backward_data, lab::tall_grouped, 1},
      {lab::backward_weight, lab::small_grouped, 22},
      {lab::backward_weight, lab::tall_grouped, 22},
      {lab::backward_weight, lab::tall_grouped, 33},
      {lab::backward_weight, lab::tall_grouped, 44},
      {lab::backward_weight, lab::wide_grouped, 44},
      {lab::backward_weight, lab::wide_grouped, 80},
      {lab::forward, lab::mma_64x64, 1},
      {lab::forward, lab::mma_64x32, 1},
      {lab::forward, lab::mma_32x64, 1},
      {lab::forward, lab::mma_32x32, 1},
      {lab::forward, lab::mma_64x32, 2},
      {lab::forward, lab::mma_64x64, 2},
      {lab::backward_data, lab::mma_32x64, 1},
      {lab::backward_data, lab::mma_32x32, 1},
      {lab::backward_data, lab::mma_32x64, 2},
      {lab::backward_data, lab::mma_32x32, 2},
      {lab::backward_weight, lab::mma_64x32, 11},
      {lab::backward_weight, lab::mma_64x32, 22},
      {lab::backward_weight, lab::mma_64x32, 44},
      {lab::backward_weight, lab::mma_64x64, 44},
      {lab::backward_weight, lab::mma_32x32, 22},
      {lab::backward_weight, lab::mma_32x32, 44},
      {lab::forward, lab::halo_64, 1},
      {lab::forward, lab::halo_32, 1},
      {lab::backward_data, lab::halo_32, 1},
      {lab::backward_data, lab::halo_64, 1},
      {lab::forward, lab::channels_last_64x64, 1},
      {lab::forward, lab::channels_last_64x32, 1},
      {lab::forward, lab::channels_last_32x64, 1},
      {lab::forward, lab::channels_last_32x32, 1},
      {lab::backward_data, lab::channels_last_32x64, 1},
      {lab::backward_data, lab::channels_last_32x32, 1},
      {lab::backward_data, lab::channels_last_64x64, 1},
      {lab::forward, lab::channels_last_64x64_8w, 1},
      {lab::forward, lab::channels_last_32x64_8w, 1},
      {lab::backward_data, lab::channels_last_32x64_8w, 1},
      {lab::backward_data, lab::channels_last_64x64_8w, 1},
      {lab::backward_weight, lab::channels_last_64x64, 14},
      {lab::backward_weight, lab::channels_last_64x64, 27},
      {lab::backward_weight, lab::channels_last_64x64, 54},
      {lab::backward_weight, lab::channels_last_64x32, 15},
      {lab::backward_weight, lab::channels_last_64x32, 30},
      {lab::backward_weight, lab::channels_last_64x64_8w, 27},
      {lab::forward, lab::channels_last_bf16_64x64_8w, 1},
      {lab::forward, lab::channels_last_bf16_32x64_8w, 1},
      {lab::forward, lab::channels_last_bf16_64x32, 1},
      {lab::backward_data, lab::channels_last_bf16_32x64_8w, 1},
      {lab::backward_data, lab::channels_last_bf16_64x64_8w, 1},
      {lab::forward, lab::channels_last_64x96_12w, 1},
      {lab::forward, lab::channels_last_64x48_6w, 1},
      {lab::backward_data, lab::channels_last_32x96_12w, 1},
      {lab::backward_data, lab::channels_last_32x48_6w, 1},
      {lab::forward, lab::channels_last_bf16_64x96_12w, 1},
      {lab::forward, lab::channels_last_bf16_64x48_6w, 1},
      {lab::backward_data, lab::channels_last_bf16_32x96_12w, 1},
      {lab::backward_data, lab::channels_last_bf16_32x48_6w, 1},
      {lab::backward_data, lab::channels_last_bf16_64x96_12w, 1},
      {lab::forward, lab::channels_last_64x128_16w, 1},
      {lab::forward, lab::channels_last_64x96_8w, 1},
      {lab::backward_data, lab::channels_last_32x128_16w, 1},
      {lab::forward, lab::channels_last_bf16_64x128_16w, 1},
      {lab::forward, lab::channels_last_bf16_64x96_8w, 1},
      {lab::backward_data, lab::channels_last_bf16_32x128_16w, 1},
      {lab::backward_data, lab::channels_last_bf16_64x128_16w, 1},
      {lab::backward_weight, lab::channels_last_bf16_64x96_8w, 22},
      {lab::backward_weight, lab::channels_last_bf16_64x96_8w, 44},
      {lab::backward_weight, lab::channels_last_bf16_64x96_8w, 88},
      {lab::backward_weight, lab::channels_last_bf16_64x96_12w, 44},
      {lab::backward_weight, lab::channels_last_bf16_64x64_8w, 27},
      {lab::backward_weight, lab::channels_last_bf16_64x64_8w, 54},
      {lab::backward_weight, lab::channels_last_bf16_64x32, 30},
      {lab::backward_weight, lab::channels_last_bf16_64x128_16w, 44},
      {lab::backward_weight, lab::channels_last_bf16_64x48_6w, 22},
      {lab::backward_weight, lab::channels_last_bf16_64x48_6w, 44},
      {lab::backward_weight, lab::channels_last_bf16_64x96_8w, 176},
      {lab::backward_weight, lab::channels_last_bf16_64x64_8w, 108},
      {lab::backward_weight, lab::channels_last_64x96_8w, 44},
      {lab::backward_weight, lab::channels_last_64x96_8w, 88},
      {lab::backward_weight, lab::channels_last_64x96_12w, 88},
      {lab::backward_weight, lab::channels_last_64x64_8w, 54},
      {lab::backward_weight, lab::channels_last_64x64_8w, 108},
      {lab::backward_weight, lab::channels_last_64x32, 60},
      {lab::backward_weight, lab::channels_last_64x32, 120},
      {lab::forward, lab::channels_last_wg_64x64, 1},
      {lab::forward, lab::channels_last_wg_64x96, 1},
      {lab::forward, lab::channels_last_wg_64x128, 1},
      {lab::backward_data, lab::channels_last_wg_32x64, 1},
      {lab::backward_data, lab::channels_last_wg_32x96, 1},
      {lab::backward_data, lab::channels_last_wg_32x128, 1},
      {lab::forward, lab::channels_last_bf16_wg_64x64, 1},
      {lab::forward, lab::channels_last_bf16_wg_64x96, 1},
      {lab::forward, lab::channels_last_bf16_wg_64x128, 1},
      {lab::backward_data, lab::channels_last_bf16_wg_32x64, 1},
      {lab::backward_data, lab::channels_last_bf16_wg_32x96, 1},
      {lab::backward_data, lab::channels_last_bf16_wg_32x128, 1},
      {lab::backward_weight, lab::channels_last_bf16_wg_64x96, 22},
      {lab::backward_weight, lab::channels_last_bf16_wg_64x96, 44},
      {lab::backward_weight, lab::channels_last_bf16_wg_64x96, 88},
      {lab::backward_weight, lab::channels_last_bf16_wg_64x64, 54},
      {lab::backward_weight, lab::channels_last_bf16_wg_64x128, 44},
  };
  const char* tile_names[] = {"medium",        "narrow",         "narrow_grouped", "small",           "small_grouped",
                              "tall_grouped",  "wide_grouped",   "mma_64x64",      "mma_64x32",       "mma_32x64",
                              "mma_32x32",     "halo_64",        "halo_32",        "cl_64x64",        "cl_64x32",
                              "cl_32x64",      "cl_32x32",       "cl_64x64_8w",    "cl_32x64_8w",     "cl_64x96_12w",
                              "cl_64x48_6w",   "cl_32x96_12w",   "cl_32x48_6w",    "cl_64x128_16w",   "cl_32x128_16w",
                              "cl_64x96_8w",   "bf16_64x64_8w",  "bf16_32x64_8w",  "bf16_64x32",      "bf16_64x96_12w",
                              "bf16_64x48_6w", "bf16_32x96_12w", "bf16_32x48_6w",  "bf16_64x128_16w", "bf16_32x128_16w",
                              "bf16_64x96_8w", "wg_64x64",       "wg_64x96",       "wg_64x128",       "wg_32x64",
                              "wg_32x96",      "wg_32x128",      "bf16_wg_64x64",  "bf16_wg_64x96",   "bf16_wg_64x128",
                              "bf16_wg_32x64", "bf16_wg_32x96",  "bf16_wg_32x128"};  // in lab::ConvTile's order
  static_assert(std::size(tile_names) == lab::conv_tile_count, "a name for every lab tile");
  const char* pass_names[] = {"forward", "backward_data", "backward_weight"};
  std::string vcsv = "shape,pass,tile,split,us_graph,rel_diff\n";
  std::printf("\nvariants (graph us)\n%-11s %-16s %-15s %5s %9s %9s\n", "shape", "pass", "tile", "split", "us graph",
              "rel diff");
  for (const auto& c : {cases[1], cases[3]}) {
    const Conv2dShape& s = c.shape;
    const auto hx = random_host(s.x_size(), rng), hw = random_host(s.w_size(), rng), hdy = random_host(s.y_size(), rng);
    float *x = to_device(hx), *w = to_device(hw), *dy = to_device(hdy);
    float* out = to_device(std::vector<float>(std::max({s.x_size(), s.y_size(), s.w_size()})));
    size_t ws_floats = 1;
    for (const auto& v : variants)
      ws_floats = std::max(ws_floats, lab::conv2d_variant_workspace_floats(v.pass, s, v.split));
    float* ws = to_device(std::vector<float>(ws_floats));
    const References refs = cpu_passes(cpu, s, hx, hw, hdy);
    // Each pass writes its own output, all into `out`.
    const Conv2dArgs<float> args{.shape = s, .x = x, .w = w, .y = out, .dy = dy, .dx = out, .dw = out, .workspace = ws};
    for (const auto& v : variants) {
      const bool warpgroup = v.tile >= lab::channels_last_wg_64x64;
      if (warpgroup && !nt::kernels::cuda::runs_warpgroup_mma()) continue;  // wgmma needs sm_90a code
      auto call = [&] { lab::conv2d_variant(exec, v.pass, args, v.tile, v.split); };
      call();
      nt::kernels::synchronize(exec);
      const bool bf16 =
          (v.tile >= lab::channels_last_bf16_64x64_8w && !warpgroup) || v.tile >= lab::channels_last_bf16_wg_64x64;
      const Math math = bf16 ? Math::bf16 : v.tile >= lab::mma_64x64 ? Math::tf32 : Math::fp32;
      const double diff = relative_difference(out, refs.out[static_cast<int>(math)][v.pass]);
      const double us_graph = nt::bench::time_graph_us(exec, kCalls, kReps, call);
      std::printf("%-11s %-16s %-15s %5d %9.2f %9.1e\n", c.name, pass_names[v.pass], tile_names[v.tile], v.split,
                  us_graph, diff);
      char line[256];
      std::snprintf(line, sizeof line, "%s,%s,%s,%d,%.3f,%.3e\n", c.name, pass_names[v.pass], tile_names[v.tile],
                    v.split, us_graph, diff);
      vcsv += line;
    }
    for (float* ptr : {x, w, dy, out, ws}) NT_CUDA_CHECK(cudaFree(ptr));
  }
  nt::kernels::destroy_stream(exec.stream);

  if (!out_dir.empty() && !(nt::bench::write_result(out_dir, "conv.csv", csv) &&
                            nt::bench::write_result(out_dir, "conv_variants.csv", vcsv)))
    return 1;
  return 0;
}
