// CUDA GEMM (kernels/cuda/gemm.cu) against an independent reference: a naive triple loop in double
// precision on the host, written here from the contract in kernels/gemm.h. Every output buffer is
// poisoned with NaN first, so an element the kernel forgets fails, and the columns between N and ldc
// must still hold the poison afterwards, so a stray write fails too.
//
// Every run passes a workspace of gemm_workspace_floats(M, N, K) floats, poisoned, as Linear does, so the
// launcher's own choice of a split through it is what runs (a forced variant gets what it needs).
//
// Tolerance: fp32_dot(K) (8·sqrt(K)·eps) of the terms' magnitude (dot_tolerance): the GPU sums each output's
// K products in fp32 in its own fixed order (one FMA chain, or S chains added in rank order with
// split-K), the reference in double, so the difference is the GPU's fp32 rounding alone; a wrong index
// or a missed slab is an O(1) error relative to that scale.
#include "tests/support/catch2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/gemm_lab.h"
#include "kernels/operand.h"
#include "kernels/runtime.h"
#include "support/test_support.h"

namespace {

using nt::kernels::Epilogue;
using nt::kernels::Exec;
using nt::kernels::GemmDesc;
using nt::test::CudaExec;
using nt::test::DeviceBuffer;

using GemmFn = std::function<void(const Exec&, const GemmDesc&)>;

const GemmFn kAuto = [](const Exec& exec, const GemmDesc& d) { nt::kernels::gemm(exec, d); };
GemmFn forced(int tile, int split_k) {
  return [=](const Exec& exec, const GemmDesc& d) { nt::kernels::cuda::lab::gemm_variant(exec, d, tile, split_k); };
}
// split_k blocks through the workspace; run_gemm sizes it from workspace_split.
GemmFn forced_workspace(int tile, int split_k) {
  return [=](const Exec& exec, const GemmDesc& d) {
    nt::kernels::cuda::lab::gemm_workspace_variant(exec, d, tile, split_k);
  };
}

constexpr Epilogue kEpilogues[] = {Epilogue::none, Epilogue::bias, Epilogue::bias_relu, Epilogue::relu_mask};
constexpr int kSizes[] = {1, 7, 10, 33, 64, 65, 128, 160, 320, 784, 1000};

const char* name_of(Epilogue e) { return nt::kernels::gemm_kernel_name(e); }

struct Problem {
  int M = 1, N = 1, K = 1;
  bool trans_a = false, trans_b = false;
  Epilogue epilogue = Epilogue::none;
  bool row_sums = true;
  int pad_a = 0, pad_b = 0, pad_c = 0;  // leading dimension = minimum + pad
  int off_a = 0, off_b = 0, off_c = 0;  // floats added to the device pointers (1 → misaligned)
  int workspace_split = 0;              // a forced workspace split's factor (0: the launcher's plan)

  int rows_a() const { return trans_a ? K : M; }  // A as stored
  int lda() const { return (trans_a ? M : K) + pad_a; }
  int rows_b() const { return trans_b ? N : K; }
  int ldb() const { return (trans_b ? K : N) + pad_b; }
  int ldc() const { return std::max(N, 1) + pad_c; }
  std::string describe() const {
    std::ostringstream s;
    s << "M=" << M << " N=" << N << " K=" << K << " trans_a=" << trans_a << " trans_b=" << trans_b << " "
      << name_of(epilogue) << " row_sums=" << row_sums << " lda=" << lda() << " ldb=" << ldb() << " ldc=" << ldc()
      << " offsets=" << off_a << "," << off_b << "," << off_c << " workspace_split=" << workspace_split;
    return s.str();
  }
};

struct Inputs {
  std::vector<float> A, B, bias, mask;  // as stored, with leading dimensions; mask has ldc
};

Inputs make_inputs(const Problem& p) {
  Inputs in;
  in.A = nt::test::random_floats(static_cast<size_t>(p.rows_a()) * p.lda());
  in.B = nt::test::random_floats(static_cast<size_t>(p.rows_b()) * p.ldb());
  in.bias = nt::test::random_floats(static_cast<size_t>(p.N));
  in.mask = nt::test::random_floats(static_cast<size_t>(p.M) * p.ldc());  // about half <= 0
  return in;
}

double op_a(const Problem& p, const Inputs& in, int m, int k) {
  return p.trans_a ? in.A[static_cast<size_t>(k) * p.lda() + m] : in.A[static_cast<size_t>(m) * p.lda() + k];
}
double op_b(const Problem& p, const Inputs& in, int k, int n) {
  return p.trans_b ? in.B[static_cast<size_t>(n) * p.ldb() + k] : in.B[static_cast<size_t>(k) * p.ldb() + n];
}

// op(A)·op(B) in double, (M, N) row-major with leading dimension N.
std::vector<double> reference_product(const Problem& p, const Inputs& in) {
  std::vector<double> c(static_cast<size_t>(p.M) * p.N, 0.0);
  for (int m = 0; m < p.M; ++m)
    for (int k = 0; k < p.K; ++k) {
      const double a = op_a(p, in, m, k);
      double* row = &c[static_cast<size_t>(m) * p.N];
      for (int n = 0; n < p.N; ++n) row[n] += a * op_b(p, in, k, n);
    }
  return c;
}

std::vector<double> reference_output(const Problem& p, const Inputs& in, const std::vector<double>& product) {
  std::vector<double> c = product;
  for (int m = 0; m < p.M; ++m)
    for (int n = 0; n < p.N; ++n) {
      double& v = c[static_cast<size_t>(m) * p.N + n];
      switch (p.epilogue) {
        case Epilogue::none:
          break;
        case Epilogue::bias:
          v += in.bias[n];
          break;
        case Epilogue::bias_relu:
          v = std::max(v + in.bias[n], 0.0);
          break;
        case Epilogue::relu_mask:
          v = in.mask[static_cast<size_t>(m) * p.ldc() + n] > 0.f ? v : 0.0;
          break;
      }
    }
  return c;
}

std::vector<double> reference_row_sums(const Problem& p, const Inputs& in) {
  std::vector<double> s(static_cast<size_t>(p.M), 0.0);
  for (int m = 0; m < p.M; ++m)
    for (int k = 0; k < p.K; ++k) s[m] += op_a(p, in, m, k);
  return s;
}

// A host vector placed `offset` floats into a device buffer (the prefix is random filler).
struct Placed {
  DeviceBuffer<float> buf;
  int offset;
  Placed(const Exec& exec, const std::vector<float>& host, int off) : buf(exec, host.size() + off + 1), offset(off) {
    std::vector<float> staged = nt::test::random_floats(host.size() + off + 1);
    std::copy(host.begin(), host.end(), staged.begin() + off);
    buf.upload(staged);
  }
  float* ptr() { return buf.get() + offset; }
  std::vector<float> download() const {
    auto all = buf.download();
    return {all.begin() + offset, all.end() - 1};
  }
};

struct Outputs {
  std::vector<float> C;         // (M, ldc) as the kernel left it, poison included
  std::vector<float> row_sums;  // (M)
};

Outputs run_gemm(const Exec& exec, const Problem& p, const Inputs& in, const GemmFn& gemm) {
  Placed A(exec, in.A, p.off_a), B(exec, in.B, p.off_b), bias(exec, in.bias, 0);
  Placed mask(exec, in.mask, p.off_c);  // shares C's leading dimension (and its alignment)
  Placed C(exec, nt::test::poisoned(static_cast<size_t>(p.M) * p.ldc()), p.off_c);
  Placed sums(exec, nt::test::poisoned(static_cast<size_t>(p.M)), 0);
  const size_t workspace_floats =
      p.workspace_split ? nt::kernels::cuda::lab::gemm_workspace_variant_floats(p.M, p.N, p.workspace_split)
                        : nt::kernels::gemm_workspace_floats(exec.backend, p.M, p.N, p.K);
  Placed workspace(exec, nt::test::poisoned(workspace_floats), 0);

  GemmDesc d;
  d.M = p.M, d.N = p.N, d.K = p.K;
  d.trans_a = p.trans_a, d.trans_b = p.trans_b;
  d.A = A.ptr(), d.lda = p.lda();
  d.B = B.ptr(), d.ldb = p.ldb();
  d.C = C.ptr(), d.ldc = p.ldc();
  d.epilogue = p.epilogue;
  d.bias = bias.ptr();
  d.mask = mask.ptr();
  d.a_row_sums = p.row_sums ? sums.ptr() : nullptr;
  d.workspace = workspace_floats > 0 ? workspace.ptr() : nullptr;
  gemm(exec, d);
  nt::kernels::synchronize(exec);
  return {C.download(), sums.download()};
}

// The (M, N) block of a (M, ldc) array.
std::vector<float> dense(const Problem& p, const std::vector<float>& c) {
  std::vector<float> out(static_cast<size_t>(p.M) * p.N);
  for (int m = 0; m < p.M; ++m)
    std::copy_n(c.begin() + static_cast<ptrdiff_t>(m) * p.ldc(), p.N, out.begin() + static_cast<ptrdiff_t>(m) * p.N);
  return out;
}

// Elements of C outside the (M, N) block (columns N..ldc-1) that the kernel wrote.
int stray_writes(const Problem& p, const std::vector<float>& c) {
  int stray = 0;
  for (int m = 0; m < p.M; ++m)
    for (int n = p.N; n < p.ldc(); ++n) stray += !std::isnan(c[static_cast<size_t>(m) * p.ldc() + n]);
  return stray;
}

// fp32_dot(K) of the terms' magnitude, not of the largest result: the largest over the outputs of
// Σ_k |op(A)(m, k)·op(B)(k, n)| (+ |bias|), and for the row sums Σ_k |op(A)(m, k)|. The fp32 sum's rounding scales with
// its terms, and a result whose terms cancel is far smaller than they are: M = N = 1, K = 65 drew -0.00422739 from 65
// products of random values in [-1, 1], and the GPU's -0.00422752 failed fp32_dot of that result (3.3e-8).
nt::test::Tolerance dot_tolerance(const Problem& p, const Inputs& in, bool row_sums) {
  double magnitude = 0;
  for (int m = 0; m < p.M; ++m) {
    if (row_sums) {
      double s = 0;
      for (int k = 0; k < p.K; ++k) s += std::abs(op_a(p, in, m, k));
      magnitude = std::max(magnitude, s);
      continue;
    }
    for (int n = 0; n < p.N; ++n) {
      double s = p.epilogue == Epilogue::bias || p.epilogue == Epilogue::bias_relu ? std::abs(in.bias[n]) : 0.0;
      for (int k = 0; k < p.K; ++k) s += std::abs(op_a(p, in, m, k) * op_b(p, in, k, n));
      magnitude = std::max(magnitude, s);
    }
  }
  nt::test::Tolerance tol = nt::test::fp32_dot(p.K);
  tol.abs_tol = tol.rel_tol * magnitude;
  tol.reason = "fp32 dot products: 8*sqrt(K)*eps of the terms' magnitude";
  return tol;
}

// `reference`: the inputs the reference multiplies (`in` itself, or its operands as Exec::math rounds them).
void check_problem(const Exec& exec, const Problem& p, const Inputs& in, const std::vector<double>& product,
                   const GemmFn& gemm, const Inputs* reference = nullptr) {
  INFO(p.describe());
  const Inputs& ref = reference ? *reference : in;
  const Outputs out = run_gemm(exec, p, in, gemm);
  const auto tol = dot_tolerance(p, ref, false);
  const std::vector<float> got = dense(p, out.C);
  const std::vector<double> want = reference_output(p, ref, product);
  NT_REQUIRE_CLOSE(std::span<const float>(got), std::span<const double>(want), tol);
  REQUIRE(stray_writes(p, out.C) == 0);
  if (p.row_sums) {
    const std::vector<double> sums = reference_row_sums(p, ref);
    NT_REQUIRE_CLOSE(std::span<const float>(out.row_sums), std::span<const double>(sums), dot_tolerance(p, ref, true));
  } else {
    REQUIRE(std::all_of(out.row_sums.begin(), out.row_sums.end(), [](float v) { return std::isnan(v); }));
  }
}

void check_problem(const Exec& exec, const Problem& p, const GemmFn& gemm = kAuto) {
  const Inputs in = make_inputs(p);
  check_problem(exec, p, in, reference_product(p, in), gemm);
}

// Every epilogue of one (shape, transposes) problem, sharing one reference product.
void check_all_epilogues(const Exec& exec, Problem p, const GemmFn& gemm = kAuto) {
  const Inputs in = make_inputs(p);
  const std::vector<double> product = reference_product(p, in);
  for (Epilogue e : kEpilogues) {
    p.epilogue = e;
    check_problem(exec, p, in, product, gemm);
  }
}

int round_up4_gap(int n) { return (4 - n % 4) % 4; }  // pad that makes a leading dimension of n a multiple of 4

struct Shape {
  int M, N, K;
};

// The MNIST MLP's GEMMs at batch 64 (784-320-160-10): forward, weight gradients (trans_a: dYᵀ·X), input
// gradients; the cnn's 3136->128 forward (split through the workspace); then edges: single elements, sizes
// around the tile multiples, long K (with few tiles: the workspace split, odd K), thin matrices.
constexpr Shape kTable[] = {
    {64, 320, 784}, {64, 160, 320},  {64, 10, 160},   {320, 784, 64},  {160, 320, 64}, {10, 160, 64},   {64, 320, 160},
    {64, 160, 10},  {64, 128, 3136}, {1, 1, 1},       {7, 10, 33},     {33, 65, 7},    {65, 128, 1000}, {37, 75, 2051},
    {1, 10, 4099},  {1000, 33, 65},  {128, 128, 128}, {784, 1000, 10}, {1, 1000, 784}, {1000, 1, 7},    {160, 7, 320},
};

}  // namespace

TEST_CASE("cuda gemm matches a double reference on the MLP shapes and edge shapes", "[cuda][gemm]") {
  CudaExec cuda;
  for (const Shape& s : kTable)
    for (int t = 0; t < 4; ++t) {
      Problem p;
      p.M = s.M, p.N = s.N, p.K = s.K;
      p.trans_a = t & 1, p.trans_b = t & 2;
      check_all_epilogues(cuda.exec, p);
    }
}

TEST_CASE("cuda gemm matches a double reference on random shapes, layouts and epilogues", "[cuda][gemm]") {
  CudaExec cuda;
  std::mt19937 pick(20261122u);
  auto size = [&] {
    return kSizes[std::uniform_int_distribution<int>(0, static_cast<int>(std::size(kSizes)) - 1)(pick)];
  };
  auto coin = [&] { return std::uniform_int_distribution<int>(0, 1)(pick) == 1; };
  auto pad = [&] { return coin() ? 0 : std::uniform_int_distribution<int>(1, 5)(pick); };
  int checked = 0;
  while (checked < 48) {
    Problem p;
    p.M = size(), p.N = size(), p.K = size();
    if (static_cast<double>(p.M) * p.N * p.K > 2e7) continue;  // keeps the double reference quick
    p.trans_a = coin(), p.trans_b = coin();
    p.epilogue = kEpilogues[std::uniform_int_distribution<int>(0, 3)(pick)];
    p.row_sums = coin();
    p.pad_a = pad(), p.pad_b = pad(), p.pad_c = pad();
    p.off_a = coin(), p.off_b = coin(), p.off_c = coin();
    check_problem(cuda.exec, p);
    ++checked;
  }
}

TEST_CASE("every tile configuration and split-K factor matches the reference", "[cuda][gemm]") {
  // Forced through the kernel lab so that each kernel is covered whatever the SM count makes the
  // launcher's rule pick. 131×199×259 leaves partial tiles in every dimension, a partial slab in K, and
  // sizes of 3 mod 4, so a float4 at an edge is partly out of range.
  CudaExec cuda;
  struct Variant {
    int tile, split_k;
  };
  std::vector<Variant> variants = {{0, 1}, {1, 1}, {2, 1}, {3, 1}};
  // Cluster split-K where the code path has clusters (sm_90 code); elsewhere the launcher never picks it (and the
  // gemm lab refuses it).
  if (nt::test::cuda_device().has_clusters())
    variants.insert(variants.end(), {{2, 2}, {2, 4}, {2, 8}, {3, 2}, {3, 4}, {3, 8}});
  else
    WARN("cluster split-K not checked: " << nt::test::cuda_device().code_path());
  for (const Shape& s : {Shape{131, 199, 259}, Shape{64, 320, 784}, Shape{33, 7, 10}})
    for (const Variant& v : variants)
      for (int t = 0; t < 4; ++t) {
        INFO("tile " << v.tile << " split_k " << v.split_k);
        Problem p;
        p.M = s.M, p.N = s.N, p.K = s.K;
        p.trans_a = t & 1, p.trans_b = t & 2;
        check_all_epilogues(cuda.exec, p, forced(v.tile, v.split_k));
        p.pad_a = 1, p.pad_b = 3, p.pad_c = 2;  // the scalar-load path of the same kernel
        p.epilogue = Epilogue::bias_relu;
        check_problem(cuda.exec, p, forced(v.tile, v.split_k));
        // float4 loads with ragged edges: leading dimensions padded up to multiples of 4, sizes not
        p.pad_a = round_up4_gap(p.trans_a ? p.M : p.K);
        p.pad_b = round_up4_gap(p.trans_b ? p.K : p.N);
        p.pad_c = round_up4_gap(p.N);
        p.epilogue = Epilogue::relu_mask;
        check_problem(cuda.exec, p, forced(v.tile, v.split_k));
      }
}

TEST_CASE("the split through a workspace matches the reference for every factor, empty splits included",
          "[cuda][gemm]") {
  // 259 = 4 slabs of 64 and a partial one: split 256 leaves most blocks an empty K range (they write zeros);
  // 3136 at 49 and 5 splits: one slab each, and ragged ranges; both small tiles, every epilogue and layout.
  CudaExec cuda;
  struct Variant {
    Shape shape;
    int split;
  };
  for (const Variant& v : {Variant{{131, 199, 259}, 2}, Variant{{131, 199, 259}, 256}, Variant{{64, 128, 3136}, 49},
                           Variant{{33, 7, 3136}, 5}, Variant{{1, 10, 4099}, 64}})
    for (int tile : {2, 3})
      for (int t = 0; t < 4; ++t) {
        INFO("tile " << tile << " split " << v.split);
        Problem p;
        p.M = v.shape.M, p.N = v.shape.N, p.K = v.shape.K;
        p.trans_a = t & 1, p.trans_b = t & 2;
        p.workspace_split = v.split;
        check_all_epilogues(cuda.exec, p, forced_workspace(tile, v.split));
        p.row_sums = false;  // the reduction must then leave the row sums alone
        p.pad_a = 1, p.pad_b = 3, p.pad_c = 2;
        p.epilogue = Epilogue::bias_relu;
        check_problem(cuda.exec, p, forced_workspace(tile, v.split));
      }
}

namespace {

// Under Exec::math BF16 (kernels/operand.h) A and B are rounded to BF16 as each slab is staged. The reference is the
// double product of the rounded operands, exact products, and the row sums of the rounded op(A), so the tolerance is
// the GPU's fp32 sums alone, as above: the FFMA tiles sum in their order, the tensor-core tiles in the MMA's.
void check_bf16(const Exec& bf16, Problem p, const GemmFn& gemm) {
  const Inputs in = make_inputs(p);
  Inputs rounded = in;
  rounded.A = nt::kernels::rounded_operands(in.A, nt::kernels::Math::bf16);
  rounded.B = nt::kernels::rounded_operands(in.B, nt::kernels::Math::bf16);
  const std::vector<double> product = reference_product(p, rounded);
  for (Epilogue e : kEpilogues) {
    p.epilogue = e;
    check_problem(bf16, p, in, product, gemm, &rounded);
  }
  // The rounding shows: the fp32 product of the same inputs is another (its first element suffices).
  if (p.M > 0 && p.N > 0 && p.K > 0) {
    double first = 0;
    for (int k = 0; k < p.K; ++k) first += op_a(p, in, 0, k) * op_b(p, in, k, 0);
    REQUIRE(std::abs(product[0] - first) > 0);
  }
}

Exec bf16_exec(const CudaExec& cuda) {
  Exec bf16 = cuda.exec;
  bf16.math = nt::kernels::Math::bf16;
  return bf16;
}

const GemmFn kFfmaPlan = [](const Exec& exec, const GemmDesc& d) { nt::kernels::cuda::lab::gemm_ffma_plan(exec, d); };

}  // namespace

TEST_CASE("cuda gemm with BF16 operands matches the reference of the rounded operands in every configuration",
          "[cuda][gemm]") {
  // Every FFMA tile (which rounds as it stages), cluster and workspace split, and where the device runs sm_80 code
  // every tensor-core tile unsplit and split through the workspace; each layout and epilogue. 131×199×259 leaves
  // partial tiles in every dimension and a partial slab; 33×7×10 is smaller than one tile.
  CudaExec cuda;
  const Exec bf16 = bf16_exec(cuda);
  struct Variant {
    GemmFn gemm;
    int workspace_split;
    const char* name;
  };
  std::vector<Variant> variants = {{kAuto, 0, "the plan"},
                                   {kFfmaPlan, 0, "the FFMA plan"},
                                   {forced(0, 1), 0, "large"},
                                   {forced(1, 1), 0, "medium"},
                                   {forced(2, 1), 0, "small"},
                                   {forced(3, 1), 0, "small grouped"},
                                   {forced_workspace(3, 5), 5, "small grouped, workspace split 5"}};
  if (nt::test::cuda_device().has_clusters())
    variants.insert(variants.end(), {{forced(2, 4), 0, "small, cluster split 4"}, {forced(3, 8), 0, "grouped, 8"}});
  if (nt::test::cuda_device().has_tf32()) {
    namespace lab = nt::kernels::cuda::lab;
    variants.insert(variants.end(), {{forced(lab::mma_64x64, 1), 0, "mma 64x64"},
                                     {forced(lab::mma_32x64, 1), 0, "mma 32x64"},
                                     {forced(lab::mma_32x32, 1), 0, "mma 32x32"},
                                     {forced_workspace(lab::mma_32x32, 5), 5, "mma 32x32, workspace split 5"},
                                     {forced_workspace(lab::mma_64x64, 3), 3, "mma 64x64, workspace split 3"}});
  } else {
    WARN("BF16 tensor-core tiles not checked: " << nt::test::cuda_device().code_path());
  }
  for (const Shape& s : {Shape{131, 199, 259}, Shape{64, 128, 3136}, Shape{33, 7, 10}})
    for (const Variant& v : variants)
      for (int t = 0; t < 4; ++t) {
        INFO(v.name);
        Problem p;
        p.M = s.M, p.N = s.N, p.K = s.K;
        p.trans_a = t & 1, p.trans_b = t & 2;
        p.workspace_split = v.workspace_split;
        check_bf16(bf16, p, v.gemm);
      }
}

TEST_CASE("cuda gemm with BF16 operands: the engine's shapes, edges and random problems through the plan",
          "[cuda][gemm]") {
  // The plan (the tensor-core tiles where the device runs sm_80 code) on every shape of the table, every layout; then
  // random shapes, leading dimensions, offsets (the scalar-load and scalar-store paths) and row sums.
  CudaExec cuda;
  const Exec bf16 = bf16_exec(cuda);
  for (const Shape& s : kTable)
    for (int t = 0; t < 4; ++t) {
      Problem p;
      p.M = s.M, p.N = s.N, p.K = s.K;
      p.trans_a = t & 1, p.trans_b = t & 2;
      check_bf16(bf16, p, kAuto);
    }
  std::mt19937 pick(20261128u);
  auto size = [&] {
    return kSizes[std::uniform_int_distribution<int>(0, static_cast<int>(std::size(kSizes)) - 1)(pick)];
  };
  auto coin = [&] { return std::uniform_int_distribution<int>(0, 1)(pick) == 1; };
  auto pad = [&] { return coin() ? 0 : std::uniform_int_distribution<int>(1, 5)(pick); };
  for (int checked = 0; checked < 24;) {
    Problem p;
    p.M = size(), p.N = size(), p.K = size();
    if (static_cast<double>(p.M) * p.N * p.K > 2e7) continue;  // keeps the double reference quick
    p.trans_a = coin(), p.trans_b = coin();
    p.row_sums = coin();
    p.pad_a = pad(), p.pad_b = pad(), p.pad_c = pad();
    p.off_a = coin(), p.off_b = coin(), p.off_c = coin();
    check_bf16(bf16, p, kAuto);
    ++checked;
  }
}

TEST_CASE("cuda gemm with BF16 operands: the same bits again, and from the scalar paths", "[cuda][gemm]") {
  // Each plan sums in one order, and the vector and scalar load paths stage the same values in the same places.
  CudaExec cuda;
  const Exec bf16 = bf16_exec(cuda);
  for (const Shape& s : {Shape{64, 320, 784}, Shape{320, 784, 64}, Shape{64, 128, 3136}, Shape{128, 3136, 64},
                         Shape{64, 3136, 128}, Shape{131, 199, 259}})
    for (int t = 0; t < 4; ++t) {
      Problem p;
      p.M = s.M, p.N = s.N, p.K = s.K;
      p.trans_a = t & 1, p.trans_b = t & 2;
      p.epilogue = Epilogue::bias_relu;
      INFO(p.describe());
      const Inputs in = make_inputs(p);
      const Outputs first = run_gemm(bf16, p, in, kAuto);
      const Outputs second = run_gemm(bf16, p, in, kAuto);
      Problem shifted = p;
      shifted.off_a = shifted.off_b = shifted.off_c = 1;
      const Outputs scalar = run_gemm(bf16, shifted, in, kAuto);
      REQUIRE(std::none_of(first.C.begin(), first.C.end(), [](float v) { return std::isnan(v); }));
      for (const Outputs* again : {&second, &scalar}) {
        REQUIRE(std::memcmp(first.C.data(), again->C.data(), first.C.size() * sizeof(float)) == 0);
        REQUIRE(std::memcmp(first.row_sums.data(), again->row_sums.data(), first.row_sums.size() * sizeof(float)) == 0);
      }
    }
}

TEST_CASE("unaligned leading dimensions and pointers take the scalar path and stay correct", "[cuda][gemm]") {
  CudaExec cuda;
  for (int t = 0; t < 4; ++t)
    for (const Shape& s : {Shape{64, 320, 784}, Shape{65, 33, 160}, Shape{320, 784, 64}}) {
      Problem p;
      p.M = s.M, p.N = s.N, p.K = s.K;
      p.trans_a = t & 1, p.trans_b = t & 2;
      p.epilogue = Epilogue::relu_mask;
      SECTION("leading dimensions not multiples of 4") {
        p.pad_a = 1, p.pad_b = 2, p.pad_c = 3;
        check_problem(cuda.exec, p);
      }
      SECTION("every pointer one float off 16-byte alignment") {
        p.off_a = p.off_b = p.off_c = 1;
        check_problem(cuda.exec, p);
      }
      SECTION("only B misaligned") {
        p.off_b = 1;
        check_problem(cuda.exec, p);
      }
      SECTION("only C misaligned (scalar stores, vector loads)") {
        p.off_c = 1;
        check_problem(cuda.exec, p);
      }
    }
}

TEST_CASE("vector and scalar load paths give bit-identical results", "[cuda][gemm]") {
  // Both paths place the same values in the same shared-memory slots and sum in the same order.
  CudaExec cuda;
  for (int t = 0; t < 4; ++t) {
    Problem p;
    p.M = 64, p.N = 320, p.K = 784;
    p.trans_a = t & 1, p.trans_b = t & 2;
    p.epilogue = Epilogue::bias;
    const Inputs in = make_inputs(p);
    const Outputs aligned = run_gemm(cuda.exec, p, in, kAuto);
    Problem shifted = p;
    shifted.off_a = shifted.off_b = shifted.off_c = 1;
    const Outputs scalar = run_gemm(cuda.exec, shifted, in, kAuto);
    INFO(p.describe());
    REQUIRE(std::memcmp(aligned.C.data(), scalar.C.data(), aligned.C.size() * sizeof(float)) == 0);
    REQUIRE(std::memcmp(aligned.row_sums.data(), scalar.row_sums.data(), aligned.row_sums.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("K = 0 gives the epilogue of zero and zero row sums", "[cuda][gemm]") {
  CudaExec cuda;
  for (const Shape& s : {Shape{33, 65, 0}, Shape{64, 320, 0}, Shape{300, 300, 0}})
    for (int t = 0; t < 4; ++t) {
      Problem p;
      p.M = s.M, p.N = s.N, p.K = 0;
      p.trans_a = t & 1, p.trans_b = t & 2;
      check_all_epilogues(cuda.exec, p);
    }
}

TEST_CASE("N = 0 still writes the row sums, M = 0 writes nothing", "[cuda][gemm]") {
  CudaExec cuda;
  for (int t = 0; t < 4; ++t) {
    Problem p;
    p.M = 65, p.N = 0, p.K = 100;
    p.trans_a = t & 1, p.trans_b = t & 2;
    check_problem(cuda.exec, p);  // C has only its padding column: it must stay poisoned
  }
  Problem empty;
  empty.M = 0, empty.N = 33, empty.K = 7;
  check_problem(cuda.exec, empty);
}

TEST_CASE("cuda gemm is bit-reproducible run to run", "[cuda][gemm]") {
  CudaExec cuda;
  struct Case {
    Shape shape;
    GemmFn gemm;
    const char* what;
  };
  const Case cases[] = {
      {{64, 320, 784}, kAuto, "MLP forward (split-K on sm_90)"},
      {{320, 784, 64}, kAuto, "MLP weight gradient"},
      {{2000, 1500, 1000}, kAuto, "large tile"},
      {{1000, 1000, 784}, kAuto, "medium tile"},
      {{64, 128, 3136}, kAuto, "cnn forward (split through the workspace)"},
  };
  for (const Case& c : cases)
    for (int t = 0; t < 4; ++t) {
      Problem p;
      p.M = c.shape.M, p.N = c.shape.N, p.K = c.shape.K;
      p.trans_a = t & 1, p.trans_b = t & 2;
      p.epilogue = Epilogue::bias_relu;
      INFO(c.what << ": " << p.describe());
      const Inputs in = make_inputs(p);
      const Outputs first = run_gemm(cuda.exec, p, in, c.gemm);
      const Outputs second = run_gemm(cuda.exec, p, in, c.gemm);
      REQUIRE(std::none_of(first.C.begin(), first.C.end(), [](float v) { return std::isnan(v); }));
      REQUIRE(std::memcmp(first.C.data(), second.C.data(), first.C.size() * sizeof(float)) == 0);
      REQUIRE(std::memcmp(first.row_sums.data(), second.row_sums.data(), first.row_sums.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("cuda gemm runs inside a captured CUDA graph and replays the same bits", "[cuda][gemm]") {
  // The training step is captured once and replayed: the launcher must do nothing a capture forbids. A split through
  // the workspace adds its reduction as a second node: the cnn's forward in fp32 and BF16, the mlp's first forward in
  // BF16 on tensor cores, and in fp32 where there are no clusters to split it in one kernel.
  CudaExec cuda;
  struct Case {
    nt::kernels::Math math;
    Shape shape;
    size_t nodes;
  };
  const size_t mlp_forward_nodes = nt::test::cuda_device().has_clusters() ? 1 : 2;
  std::vector<Case> cases = {{nt::kernels::Math::fp32, {64, 320, 784}, mlp_forward_nodes},
                             {nt::kernels::Math::fp32, {320, 784, 64}, 1},
                             {nt::kernels::Math::fp32, {64, 128, 3136}, 2}};
  if (nt::test::cuda_device().has_tf32())
    cases.insert(cases.end(), {{nt::kernels::Math::bf16, {64, 320, 784}, 2},
                               {nt::kernels::Math::bf16, {320, 784, 64}, 1},
                               {nt::kernels::Math::bf16, {64, 128, 3136}, 2}});
  for (const Case& c : cases) {
    Exec exec = cuda.exec;
    exec.math = c.math;
    Exec capture_exec = exec;
    capture_exec.debug_sync = false;  // synchronizing is what a capture forbids
    Problem p;
    p.M = c.shape.M, p.N = c.shape.N, p.K = c.shape.K;
    p.trans_a = c.shape.M == 320, p.trans_b = c.shape.M == 64;
    p.epilogue = Epilogue::bias_relu;
    INFO(p.describe() << (c.math == nt::kernels::Math::bf16 ? " BF16" : " fp32"));
    const Inputs in = make_inputs(p);
    const Outputs eager = run_gemm(exec, p, in, kAuto);
    const GemmFn captured = [&](const Exec&, const GemmDesc& d) {
      auto graph = nt::kernels::Graph::capture(capture_exec, [&] { nt::kernels::gemm(capture_exec, d); });
      REQUIRE(graph.node_count() == c.nodes);
      graph.launch(capture_exec);
    };
    const Outputs replayed = run_gemm(exec, p, in, captured);
    REQUIRE(std::memcmp(eager.C.data(), replayed.C.data(), eager.C.size() * sizeof(float)) == 0);
  }
}

namespace {

// The chain of Linear's backward after the layer above it: `above` writes dz (here a GEMM of its own),
// then dW = dzᵀ·x with the bias gradient, then dx = dz·W through x's ReLU, then `below`, a consumer of dx.
// With `overlap` the dx GEMM declares itself independent of the dW GEMM (GemmArgs::overlaps_previous).
struct BackwardChain {
  static constexpr int kRows = 64, kIn = 320, kOut = 160, kAbove = 784, kBelow = 50;
  const Exec& exec;
  DeviceBuffer<float> h, w_above, dz, x, w, dw, db, dx, w_below, out;
  BackwardChain(const Exec& e)
      : exec(e),
        h(e, nt::test::random_floats(size_t(kRows) * kAbove)),
        w_above(e, nt::test::random_floats(size_t(kAbove) * kOut)),
        dz(e, size_t(kRows) * kOut),
        x(e, nt::test::random_floats(size_t(kRows) * kIn)),
        w(e, nt::test::random_floats(size_t(kOut) * kIn)),
        dw(e, size_t(kOut) * kIn),
        db(e, kOut),
        dx(e, size_t(kRows) * kIn),
        w_below(e, nt::test::random_floats(size_t(kIn) * kBelow)),
        out(e, size_t(kRows) * kBelow) {}

  void run(bool overlap) {
    GemmDesc above{kRows, kOut, kAbove};  // dz (64,160) = h·w_above
    above.A = h.get(), above.lda = kAbove, above.B = w_above.get(), above.ldb = kOut, above.C = dz.get(),
    above.ldc = kOut;
    GemmDesc grad_w{kOut, kIn, kRows};  // dW (160,320) = dzᵀ·x, db = Σ_rows dz
    grad_w.trans_a = true, grad_w.A = dz.get(), grad_w.lda = kOut, grad_w.B = x.get(), grad_w.ldb = kIn;
    grad_w.C = dw.get(), grad_w.ldc = kIn, grad_w.a_row_sums = db.get();
    GemmDesc grad_x{kRows, kIn, kOut};  // dx (64,320) = dz·W through x > 0
    grad_x.A = dz.get(), grad_x.lda = kOut, grad_x.B = w.get(), grad_x.ldb = kIn, grad_x.C = dx.get(), grad_x.ldc = kIn;
    grad_x.epilogue = Epilogue::relu_mask, grad_x.mask = x.get(), grad_x.overlaps_previous = overlap;
    GemmDesc below{kRows, kBelow, kIn};  // out (64,50) = dx·w_below: must find dx complete
    below.A = dx.get(), below.lda = kIn, below.B = w_below.get(), below.ldb = kBelow, below.C = out.get(),
    below.ldc = kBelow;
    for (const GemmDesc* d : {&above, &grad_w, &grad_x, &below}) nt::kernels::gemm(exec, *d);
  }
  std::vector<std::vector<float>> results() const {
    return {dz.download(), dw.download(), db.download(), dx.download(), out.download()};
  }
};

}  // namespace

TEST_CASE("an input-gradient GEMM that overlaps the weight gradient gives the bits of stream order", "[cuda][gemm]") {
  // Under programmatic dependent launch, without a synchronization between launches (which would serialize
  // them), eagerly and replayed from a captured graph: dz, dW, db, dx and the consumer of dx are those of the
  // plain chain, bit for bit, every time.
  CudaExec cuda;
  Exec exec = cuda.exec;
  exec.debug_sync = false;
  exec.programmatic_launch = true;
  BackwardChain chain(exec);
  chain.run(false);
  const auto want = chain.results();
  REQUIRE(std::none_of(want[4].begin(), want[4].end(), [](float v) { return std::isnan(v); }));
  for (int round = 0; round < 20; ++round) {
    chain.run(true);
    REQUIRE(chain.results() == want);
  }
  auto graph = nt::kernels::Graph::capture(exec, [&] { chain.run(true); });
  for (int replay = 0; replay < 20; ++replay) {
    graph.launch(exec);
    REQUIRE(chain.results() == want);
  }
}
