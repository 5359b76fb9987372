// GEMM kernel lab: nanotrain's CUDA GEMM against cuBLAS SGEMM, fp32 on both sides (cuBLAS in pedantic
// math mode: no TF32, no reduced-precision tricks).
//
//   bench_gemm [output-folder]      prints three tables; with a folder also writes gemm.csv,
//                                   gemm_variants.csv and gemm_bf16.csv there
//
// Shapes: the MNIST MLP's GEMMs at batch 64 (forward X·Wᵀ, weight gradient dYᵀ·X with trans_a, input
// gradient dY·W), the cnn's 3136->128 layer's two backward GEMMs at batch 64, then 1024³ and 4096³ (with each
// transposed layout at 4096³).
// Method: random inputs in [-1, 1] (never zeros: zero operands flatter the FMA pipes' power); before
// timing, ours (epilogue none) is checked against cuBLAS on the same inputs. Each timing is the median
// of 50 repetitions of an event-timed loop (100 calls per loop for small problems, fewer for large),
// after warm-up, divided by the calls per loop. For small problems the per-call cost is also measured
// from a CUDA graph of 100 calls (the engine's Graph::capture, global capture mode), which removes the
// CPU launch overhead the training step's graph removes too. Operands stay L2-resident between calls,
// as they are in training (each layer's inputs were just written).
// Table 1: the launcher's own choice, ours plain and with the fused epilogue the engine uses on that
// shape, vs cuBLAS. Table 2: every tile/split variant of ours (kernel lab entry), to tune the rule. Table 3: BF16
// operands on the engine's Linear shapes, the FFMA tiles (rounding as they stage) against the tensor-core tiles.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_timing.h"
#include "core/cuda_check.h"
#include "kernels/gemm.h"
#include "kernels/gemm_lab.h"
#include "kernels/runtime.h"

namespace {

using nt::kernels::Epilogue;
using nt::kernels::Exec;
using nt::kernels::GemmDesc;

#define CUBLAS_CHECK(call)                                                                          \
  do {                                                                                              \
    cublasStatus_t st_ = (call);                                                                    \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                             \
      std::fprintf(stderr, "%s failed at %s:%d: status %d\n", #call, __FILE__, __LINE__, (int)st_); \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

struct Shape {
  const char* name;
  int M, N, K;
  bool trans_a, trans_b;
  Epilogue fused;  // what the engine runs on this shape
  bool row_sums;   // the weight gradient also produces the bias gradient
};

const Shape kShapes[] = {
    {"mlp fwd1 X*W1t", 64, 320, 784, false, true, Epilogue::bias_relu, false},
    {"mlp fwd2 H1*W2t", 64, 160, 320, false, true, Epilogue::bias_relu, false},
    {"mlp fwd3 H2*W3t", 64, 10, 160, false, true, Epilogue::bias, false},
    {"mlp dW1 dY1t*X", 320, 784, 64, true, false, Epilogue::none, true},
    {"mlp dW2 dY2t*H1", 160, 320, 64, true, false, Epilogue::none, true},
    {"mlp dW3 dY3t*H2", 10, 160, 64, true, false, Epilogue::none, true},
    {"mlp dX2 dY2*W2", 64, 320, 160, false, false, Epilogue::relu_mask, false},
    {"mlp dX3 dY3*W3", 64, 160, 10, false, false, Epilogue::relu_mask, false},
    {"cnn dW dYt*X", 128, 3136, 64, true, false, Epilogue::none, true},
    {"cnn dX dY*W", 64, 3136, 128, false, false, Epilogue::none, false},
    {"square 1024", 1024, 1024, 1024, false, false, Epilogue::none, false},
    {"square 4096 nn", 4096, 4096, 4096, false, false, Epilogue::none, false},
    {"square 4096 nt", 4096, 4096, 4096, false, true, Epilogue::none, false},
    {"square 4096 tn", 4096, 4096, 4096, true, false, Epilogue::none, false},
    {"square 4096 tt", 4096, 4096, 4096, true, true, Epilogue::none, false},
};

struct Variant {
  int tile, split_k;
  const char* name;
};
const Variant kVariants[] = {{0, 1, "large 128x128"}, {1, 1, "medium 64x64"},   {2, 1, "small 32x32"},
                             {2, 2, "small split2"},  {2, 4, "small split4"},   {2, 8, "small split8"},
                             {3, 1, "grouped 32x32"}, {3, 2, "grouped split2"}, {3, 4, "grouped split4"},
                             {3, 8, "grouped split8"}};

// BF16 (Exec::math BF16) on the engine's Linear shapes at batch 64 and 256, and two squares. The forward GEMMs get a
// workspace, as Linear gives them (the cnn's 3136->128 forward splits K through it).
struct Bf16Shape {
  Shape shape;
  bool workspace;
};
const Bf16Shape kBf16Shapes[] = {
    {{"mlp fwd1 X*W1t", 64, 320, 784, false, true, Epilogue::bias_relu, false}, true},
    {{"mlp fwd2 H1*W2t", 64, 160, 320, false, true, Epilogue::bias_relu, false}, true},
    {{"mlp dW1 dY1t*X", 320, 784, 64, true, false, Epilogue::none, true}, false},
    {{"mlp dW2 dY2t*H1", 160, 320, 64, true, false, Epilogue::none, true}, false},
    {{"mlp dX2 dY2*W2", 64, 320, 160, false, false, Epilogue::relu_mask, false}, false},
    {{"cnn fwd X*Wt", 64, 128, 3136, false, true, Epilogue::bias_relu, false}, true},
    {{"cnn dW dYt*X", 128, 3136, 64, true, false, Epilogue::none, true}, false},
    {{"cnn dX dY*W", 64, 3136, 128, false, false, Epilogue::none, false}, false},
    {{"mlp fwd1 b256", 256, 320, 784, false, true, Epilogue::bias_relu, false}, true},
    {{"mlp dW1 b256", 320, 784, 256, true, false, Epilogue::none, true}, false},
    {{"mlp dX2 b256", 256, 320, 160, false, false, Epilogue::relu_mask, false}, false},
    {{"cnn fwd b256", 256, 128, 3136, false, true, Epilogue::bias_relu, false}, true},
    {{"cnn dW b256", 128, 3136, 256, true, false, Epilogue::none, true}, false},
    {{"cnn dX b256", 256, 3136, 128, false, false, Epilogue::none, false}, false},
    {{"square 1024", 1024, 1024, 1024, false, false, Epilogue::none, false}, false},
    {{"square 2048", 2048, 2048, 2048, false, false, Epilogue::none, false}, false},
};
// Tensor-core variants: tile (lab::GemmTile) and workspace split (1: none).
struct Bf16Variant {
  int tile, split;
  const char* name;
};
const Bf16Variant kBf16Variants[] = {{4, 1, "mma 64x64"},   {5, 1, "mma 32x64"},   {6, 1, "mma 32x32"},
                                     {6, 4, "32x32 ws4"},   {6, 8, "32x32 ws8"},   {6, 13, "32x32 ws13"},
                                     {6, 16, "32x32 ws16"}, {6, 33, "32x32 ws33"}, {6, 49, "32x32 ws49"}};

constexpr int kReps = 50;
constexpr int kGraphCalls = 100;

float* device_random(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> host(n);
  for (auto& x : host) x = dist(rng);
  float* dev = nullptr;
  NT_CUDA_CHECK(cudaMalloc(&dev, std::max<size_t>(n, 1) * sizeof(float)));
  NT_CUDA_CHECK(cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return dev;
}

int calls_per_loop(double flops) { return flops < 1e9 ? 100 : flops < 2e10 ? 10 : 1; }

struct Operands {
  float *A, *B, *C, *C_ref, *bias, *mask, *row_sums;
  int lda, ldb, ldc;
};

Operands make_operands(const Shape& s, std::mt19937& rng) {
  Operands o{};
  o.lda = s.trans_a ? s.M : s.K;
  o.ldb = s.trans_b ? s.K : s.N;
  o.ldc = s.N;
  o.A = device_random(static_cast<size_t>(s.M) * s.K, rng);
  o.B = device_random(static_cast<size_t>(s.K) * s.N, rng);
  o.C = device_random(static_cast<size_t>(s.M) * s.N, rng);
  o.C_ref = device_random(static_cast<size_t>(s.M) * s.N, rng);
  o.bias = device_random(s.N, rng);
  o.mask = device_random(static_cast<size_t>(s.M) * s.N, rng);
  o.row_sums = device_random(s.M, rng);
  return o;
}

void free_operands(Operands& o) {
  for (float* p : {o.A, o.B, o.C, o.C_ref, o.bias, o.mask, o.row_sums}) NT_CUDA_CHECK(cudaFree(p));
}

GemmDesc desc_of(const Shape& s, const Operands& o, Epilogue e, bool row_sums) {
  GemmDesc d;
  d.M = s.M, d.N = s.N, d.K = s.K;
  d.trans_a = s.trans_a, d.trans_b = s.trans_b;
  d.A = o.A, d.lda = o.lda, d.B = o.B, d.ldb = o.ldb, d.C = o.C, d.ldc = o.ldc;
  d.epilogue = e;
  d.bias = o.bias, d.mask = o.mask;
  d.a_row_sums = row_sums ? o.row_sums : nullptr;
  return d;
}

// Row-major C(M,N) = op(A)·op(B) is column-major Cᵀ(N,M) = op(B)ᵀ·op(A)ᵀ: swap the operands and pass
// each one's own transpose flag (a row-major (R,C) array with ld is a column-major (C,R) one).
void cublas_gemm(cublasHandle_t h, const Shape& s, const Operands& o, float* C) {
  const float one = 1.f, zero = 0.f;
  CUBLAS_CHECK(cublasSgemm(h, s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, s.N, s.M,
                           s.K, &one, o.B, o.ldb, o.A, o.lda, &zero, C, o.ldc));
}

// max |ours - cuBLAS| over max |cuBLAS|.
double relative_difference(const float* ours, const float* ref, size_t n) {
  std::vector<float> a(n), b(n);
  NT_CUDA_CHECK(cudaMemcpy(a.data(), ours, n * sizeof(float), cudaMemcpyDeviceToHost));
  NT_CUDA_CHECK(cudaMemcpy(b.data(), ref, n * sizeof(float), cudaMemcpyDeviceToHost));
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

std::string trans_name(const Shape& s) { return std::string(s.trans_a ? "T" : "N") + (s.trans_b ? "T" : "N"); }

}  // namespace

int main(int argc, char** argv) {
  const std::string out_dir = argc > 1 ? argv[1] : "";
  cudaDeviceProp prop{};
  NT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, sm_%d%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);

  cudaStream_t stream = static_cast<cudaStream_t>(nt::kernels::create_stream());
  Exec exec;
  exec.backend = nt::kernels::Backend::cuda;
  exec.stream = stream;

  cublasHandle_t handle;
  CUBLAS_CHECK(cublasCreate(&handle));
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH));  // fp32 FMA only: no TF32
  void* workspace = nullptr;
  const size_t workspace_bytes = 32u << 20;  // fixed, so graph capture allocates nothing
  NT_CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
  CUBLAS_CHECK(cublasSetWorkspace(handle, workspace, workspace_bytes));

  std::mt19937 rng(20261122u);
  bool all_ok = true;
  std::string csv =
      "shape,M,N,K,trans,ours_us,cublas_us,ours_graph_us,cublas_graph_us,ours_fused_graph_us,ours_tflops,"
      "cublas_tflops,ours_over_cublas,max_rel_diff\n";
  std::string csv_variants = "shape,M,N,K,trans,variant,us,tflops\n";

  std::printf("\n%-18s %5s %5s %5s %3s | %9s %9s | %9s %9s %9s | %7s %7s %6s | %s\n", "shape", "M", "N", "K", "tr",
              "ours us", "cuBLAS us", "ours gr", "cuBLAS gr", "fused gr", "ours TF", "cuBL TF", "ratio", "check");
  for (const Shape& s : kShapes) {
    Operands o = make_operands(s, rng);
    const double flops = 2.0 * s.M * s.N * s.K;
    const size_t n_out = static_cast<size_t>(s.M) * s.N;

    // Correctness first: ours (plain) against cuBLAS on the same inputs.
    nt::kernels::gemm(exec, desc_of(s, o, Epilogue::none, false));
    cublas_gemm(handle, s, o, o.C_ref);
    NT_CUDA_CHECK(cudaStreamSynchronize(stream));
    const double rel = relative_difference(o.C, o.C_ref, n_out);
    const double allowed = 16.0 * std::sqrt(static_cast<double>(s.K)) * std::ldexp(1.0, -23);  // both round
    const bool ok = rel <= allowed;
    all_ok = all_ok && ok;

    const GemmDesc plain = desc_of(s, o, Epilogue::none, false);
    const GemmDesc fused = desc_of(s, o, s.fused, s.row_sums);
    const int calls = calls_per_loop(flops);
    const double ours_us = nt::bench::time_loop_us(stream, calls, kReps, [&] { nt::kernels::gemm(exec, plain); });
    const double cublas_us = nt::bench::time_loop_us(stream, calls, kReps, [&] { cublas_gemm(handle, s, o, o.C_ref); });
    const bool small = flops < 2e10;
    double ours_gr = NAN, cublas_gr = NAN, fused_gr = NAN;
    if (small) {
      ours_gr = nt::bench::time_graph_us(exec, kGraphCalls, kReps, [&] { nt::kernels::gemm(exec, plain); });
      cublas_gr = nt::bench::time_graph_us(exec, kGraphCalls, kReps, [&] { cublas_gemm(handle, s, o, o.C_ref); });
      fused_gr = nt::bench::time_graph_us(exec, kGraphCalls, kReps, [&] { nt::kernels::gemm(exec, fused); });
    }
    // Throughput from the launch-free numbers where we have them.
    const double ours_t = small ? ours_gr : ours_us, cublas_t = small ? cublas_gr : cublas_us;
    const double ours_tf = flops / ours_t * 1e-6, cublas_tf = flops / cublas_t * 1e-6;
    std::printf("%-18s %5d %5d %5d %3s | %9.2f %9.2f | %9.2f %9.2f %9.2f | %7.2f %7.2f %6.2f | %s (%.1e)\n", s.name,
                s.M, s.N, s.K, trans_name(s).c_str(), ours_us, cublas_us, ours_gr, cublas_gr, fused_gr, ours_tf,
                cublas_tf, cublas_t / ours_t, ok ? "ok" : "FAIL", rel);
    std::fflush(stdout);
    char line[512];
    std::snprintf(line, sizeof line, "%s,%d,%d,%d,%s,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f,%.3e\n", s.name, s.M, s.N,
                  s.K, trans_name(s).c_str(), ours_us, cublas_us, ours_gr, cublas_gr, fused_gr, ours_tf, cublas_tf,
                  cublas_t / ours_t, rel);
    csv += line;
    free_operands(o);
  }

  std::printf("\nvariants (kernel lab; graph per-call us for small problems, loop us for large)\n");
  std::printf("%-18s %3s", "shape", "tr");
  for (const Variant& v : kVariants) std::printf(" %14s", v.name);
  std::printf("\n");
  const bool clusters = prop.major >= 9;
  for (const Shape& s : kShapes) {
    if (s.M == 4096 && (s.trans_a || s.trans_b)) continue;  // the layouts do not change the ranking
    Operands o = make_operands(s, rng);
    const double flops = 2.0 * s.M * s.N * s.K;
    const bool small = flops < 2e10;
    std::printf("%-18s %3s", s.name, trans_name(s).c_str());
    for (const Variant& v : kVariants) {
      if (v.split_k > 1 && !clusters) {
        std::printf(" %14s", "-");
        continue;
      }
      const GemmDesc d = desc_of(s, o, s.fused, s.row_sums);
      auto call = [&] { nt::kernels::cuda::lab::gemm_variant(exec, d, v.tile, v.split_k); };
      const double us = small ? nt::bench::time_graph_us(exec, kGraphCalls, kReps, call)
                              : nt::bench::time_loop_us(stream, calls_per_loop(flops), kReps, call);
      std::printf(" %14.2f", us);
      std::fflush(stdout);
      char line[256];
      std::snprintf(line, sizeof line, "%s,%d,%d,%d,%s,%s,%.3f,%.3f\n", s.name, s.M, s.N, s.K, trans_name(s).c_str(),
                    v.name, us, flops / us * 1e-6);
      csv_variants += line;
    }
    std::printf("\n");
    free_operands(o);
  }

  // BF16: graph per-call µs of the FFMA tiles' plan (what ran before the tensor-core tiles), the plan, and each
  // tensor-core variant whose split leaves every block a slab.
  std::string csv_bf16 = "shape,M,N,K,trans,variant,us\n";
  Exec bf16 = exec;
  bf16.math = nt::kernels::Math::bf16;
  std::printf("\nBF16 operands (graph per-call us)\n%-18s %3s %11s %11s", "shape", "tr", "ffma plan", "plan");
  for (const Bf16Variant& v : kBf16Variants) std::printf(" %11s", v.name);
  std::printf("\n");
  for (const Bf16Shape& b : kBf16Shapes) {
    const Shape& s = b.shape;
    Operands o = make_operands(s, rng);
    GemmDesc d = desc_of(s, o, s.fused, s.row_sums);
    d.workspace = b.workspace ? static_cast<float*>(workspace) : nullptr;
    auto time = [&](const char* name, auto&& call) {
      const double us = nt::bench::time_graph_us(bf16, kGraphCalls, kReps, call);
      std::printf(" %11.2f", us);
      std::fflush(stdout);
      char line[256];
      std::snprintf(line, sizeof line, "%s,%d,%d,%d,%s,%s,%.3f\n", s.name, s.M, s.N, s.K, trans_name(s).c_str(), name,
                    us);
      csv_bf16 += line;
    };
    std::printf("%-18s %3s", s.name, trans_name(s).c_str());
    time("ffma plan", [&] { nt::kernels::cuda::lab::gemm_ffma_plan(bf16, d); });
    time("plan", [&] { nt::kernels::gemm(bf16, d); });
    for (const Bf16Variant& v : kBf16Variants) {
      const size_t needed = nt::kernels::cuda::lab::gemm_workspace_variant_floats(s.M, s.N, v.split) * sizeof(float);
      if (v.split > 1 && (v.split > (s.K + 31) / 32 || needed > workspace_bytes)) {
        std::printf(" %11s", "-");
        continue;
      }
      GemmDesc forced = d;
      forced.workspace = static_cast<float*>(workspace);
      time(v.name, [&] {
        if (v.split == 1)
          nt::kernels::cuda::lab::gemm_variant(bf16, forced, v.tile, 1);
        else
          nt::kernels::cuda::lab::gemm_workspace_variant(bf16, forced, v.tile, v.split);
      });
    }
    std::printf("\n");
    free_operands(o);
  }

  if (!out_dir.empty() && !(nt::bench::write_result(out_dir, "gemm.csv", csv) &&
                            nt::bench::write_result(out_dir, "gemm_variants.csv", csv_variants) &&
                            nt::bench::write_result(out_dir, "gemm_bf16.csv", csv_bf16)))
    return 1;

  CUBLAS_CHECK(cublasDestroy(handle));
  NT_CUDA_CHECK(cudaFree(workspace));
  nt::kernels::destroy_stream(stream);
  if (!all_ok) {
    std::printf("\nFAIL: ours and cuBLAS disagree beyond 16*sqrt(K)*eps on some shape\n");
    return 1;
  }
  return 0;
}
