// CPU GEMM: C(M,N) = epilogue(op(A)(M,K) · op(B)(K,N)), written with `=`; optionally
// a_row_sums[m] = Σ_k op(A)[m,k]. The contract (layouts, leading dimensions, epilogues) is kernels/gemm.h.
// It is the reference the CUDA backend is tested against and the engine's CPU workhorse.
//
// Method (Goto/BLIS-style, sized for the small shapes of MNIST models). The register-blocked micro-kernel
// computes a tile T(MR,NR) = Σ_k U(i,k)·V(k,j): NR is the vector direction, MR the broadcast one.
//   - Orientation: T = C (U = op(A), V = op(B)) or T = Cᵀ (U = op(B)ᵀ, V = op(A)ᵀ). The one chosen packs
//     V without a transpose where possible, else transposes the smaller operand (Linear forward:
//     X·Wᵀ packs the batch, not the weights); see choose_transposed().
//   - V is packed once per call, in parallel, into NR-wide panels, k-major and zero-padded:
//     vpack[q][k][c] = V(q·NR+c, k). Packing absorbs transposes and leading dimensions; a K-contiguous
//     source is transposed 8×8 at a time in registers.
//   - U is read in place: MR row pointers when its rows are K-contiguous, else MR consecutive values per k
//     (a partial last panel is copied, zero-padded, to a small buffer). Packing it would be a transpose of
//     the larger operand in the forward pass, which costs as much as the multiply.
//   - Compute tasks, one per (block of U panels, V panel), go to the pool as one contiguous chunk per
//     thread (run_chunked says why). A task walks K in blocks of at most kMaxKc so the V block (kc×NR)
//     stays in L1; partial tiles live in a task-local buffer and C is written once, through the epilogue
//     (a transposed tile is transposed back on the way out).
//   - The micro-kernel (GCC vector extensions) is compiled three times and picked once by CPU features:
//     AVX-512 (8×32), AVX2+FMA (6×16), baseline x86-64 SSE2 (4×8); the build stays portable.
//     NT_CPU_GEMM_ISA=avx2|generic forces a lesser variant (to test them).
//
// Numerics: each C element is one fp32 chain acc += a_k·b_k over k = 0..K-1 in order (an FMA per step
// where the ISA has one: GCC contracts a*b+c by default, which rounds once and never reorders). A K-block
// continues the previous block's partial sum, so the result depends on neither the blocking, the
// orientation, the task split nor the thread count: bit-identical run to run and for any pool size.
// The ISA variants may differ from one another in the last bits (FMA vs mul+add).
// Row sums: one fp32 chain per row, k in order. bias_relu is `v < 0 ? 0 : v`, so NaN propagates as in
// torch.relu; relu_mask selects (mask > 0 ? v : 0) rather than multiplying, so the gradient is exactly 0
// where the ReLU was off. No -ffast-math: reassociation would break the fixed order and NaN handling.
// C must not alias A, B, bias or mask.
// Exec::math BF16 (kernels/operand.h): the same GEMM on rounded copies of A and B (kernels/cpu/rounded_operands.h),
// so the row sums are of the rounded op(A), as the GPU's are.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/op_scope.h"
#include "kernels/cpu/rounded_operands.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/gemm.h"

#define NT_INLINE [[gnu::always_inline]] inline  // hot templates take the ISA of the variant calling them

namespace nt::kernels::cpu {
namespace {

constexpr int kMaxKc = 256;                    // V block 256×32 floats = 32 KiB: stays in L1
constexpr int kMaxBlockPanels = 16;            // U panels per task (bounds the partial-tile buffer)
constexpr double kMinParallelFlops = 1 << 20;  // below ~1 MFLOP waking the pool costs more than it saves

// A strided matrix view: element (o, k) at p[o*so + k*sk]; so or sk is 1 for every operand of a GEMM.
struct Operand {
  const float* p;
  int64_t so, sk;
};

struct Plan {
  const GemmDesc* d;
  bool transposed;  // T = Cᵀ: i runs over n, j over m
  Operand u, v;     // U (I, K) read in place, V (J, K) packed
  int I, J, K;
  int kc, k_blocks;            // K split into k_blocks blocks of kc (the last may be shorter)
  int i_panels, j_panels;      // MR-row panels of U, NR-row panels of V
  int block_panels, i_blocks;  // compute task t: U panels of block t % i_blocks, V panel t / i_blocks
  float* vpack;                // (j_panels, K, NR)
};

// 64-byte aligned scratch from a buffer that grows to the largest request, then is reused (no
// steady-state allocation); contents unspecified.
float* scratch(std::vector<float>& buf, size_t n) {
  if (buf.size() < n + 16) buf.assign(n + 16, 0.f);
  return buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64 / sizeof(float);
}

template <int W>
struct Vec;  // W floats in one vector register
template <>
struct Vec<1> {
  typedef float type;
};
template <>
struct Vec<4> {
  typedef float type __attribute__((vector_size(16)));
};
template <>
struct Vec<8> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct Vec<16> {
  typedef float type __attribute__((vector_size(64)));
};
typedef int i8 __attribute__((vector_size(32)));

// out = lanes I... of the 16 lanes of (a, b): GCC's __builtin_shuffle; clang has only __builtin_shufflevector, which
// GCC knows from version 12 on. By reference, as load and store.
template <int... I>
NT_INLINE void shuffle(Vec<8>::type& out, const Vec<8>::type& a, const Vec<8>::type& b) {
#if defined(__clang__)
  out = __builtin_shufflevector(a, b, I...);
#else
  out = __builtin_shuffle(a, b, i8{I...});
#endif
}

// memcpy: no alignment or aliasing assumptions, compiled to one vector move. Vectors pass by reference:
// by value they would change the ABI between the ISA variants (-Wpsabi).
template <class V>
NT_INLINE void load(V& v, const float* p) {
  std::memcpy(&v, p, sizeof(V));
}
template <class V>
NT_INLINE void store(float* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

// dst[k*ldd + p] = src[p*ld + k] for p, k < 8: an in-register 8×8 transpose (unpack, shuffle, lane swap).
NT_INLINE void transpose8x8(const float* src, int64_t ld, float* dst, int64_t ldd) {
  using V = Vec<8>::type;
  V r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) load(r[i], src + i * ld);
  for (int i = 0; i < 8; i += 2) {
    shuffle<0, 8, 1, 9, 4, 12, 5, 13>(t[i], r[i], r[i + 1]);
    shuffle<2, 10, 3, 11, 6, 14, 7, 15>(t[i + 1], r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    for (int h = 0; h < 2; ++h) {
      shuffle<0, 1, 8, 9, 4, 5, 12, 13>(u[i + h * 2], t[i + h], t[i + h + 2]);
      shuffle<2, 3, 10, 11, 6, 7, 14, 15>(u[i + h * 2 + 1], t[i + h], t[i + h + 2]);
    }
  }
  for (int k = 0; k < 4; ++k) {  // u[k] holds columns k and k+4 of rows 0-3, u[k+4] those of rows 4-7
    V lo, hi;
    shuffle<0, 1, 2, 3, 8, 9, 10, 11>(lo, u[k], u[k + 4]);
    shuffle<4, 5, 6, 7, 12, 13, 14, 15>(hi, u[k], u[k + 4]);
    store(dst + k * ldd, lo);
    store(dst + (k + 4) * ldd, hi);
  }
}

// ---- packing V ------------------------------------------------------------------------------------------

// dst (K, P) = rows o0..o0+count-1 (count <= P) of the view, zero-padded to P columns.
template <int P>
NT_INLINE void pack_panel(const Operand& v, int64_t o0, int count, int K, float* dst) {
  const float* src = v.p + o0 * v.so;
  if (v.so == 1) {  // the P values of each k are contiguous: row copies
    for (int k = 0; k < K; ++k) {
      const float* s = src + k * v.sk;
      float* o = dst + static_cast<int64_t>(k) * P;
      if (count == P) {
        for (int p = 0; p < P; ++p) o[p] = s[p];
      } else {
        for (int p = 0; p < P; ++p) o[p] = p < count ? s[p] : 0.f;
      }
    }
    return;
  }
  // K-contiguous source (sk == 1): transpose, 8×8 blocks where whole, element by element at the edges.
  const int k8 = K / 8 * 8, p8 = count / 8 * 8;
  for (int p = 0; p < p8; p += 8) {
    for (int k = 0; k < k8; k += 8) transpose8x8(src + p * v.so + k, v.so, dst + k * P + p, P);
    for (int k = k8; k < K; ++k)
      for (int i = p; i < p + 8; ++i) dst[k * P + i] = src[i * v.so + k];
  }
  for (int k = 0; k < K; ++k)
    for (int p = p8; p < P; ++p) dst[k * P + p] = p < count ? src[p * v.so + k] : 0.f;
}

// sums[m] = Σ_k op(A)[m,k], k in order; vectorized across rows when A is stored transposed.
NT_INLINE void row_sums(const GemmDesc& d, const Operand& a) {
  if (a.so == 1) {
    std::fill(d.a_row_sums, d.a_row_sums + d.M, 0.f);
    for (int k = 0; k < d.K; ++k)
      for (int m = 0; m < d.M; ++m) d.a_row_sums[m] += a.p[k * a.sk + m];
    return;
  }
  constexpr int kRows = 8;  // independent chains, for instruction-level parallelism
  for (int m0 = 0; m0 < d.M; m0 += kRows) {
    const int rows = std::min(kRows, d.M - m0);
    float s[kRows] = {};
    for (int k = 0; k < d.K; ++k)
      for (int r = 0; r < rows; ++r) s[r] += a.p[(m0 + r) * a.so + k];
    std::copy(s, s + rows, d.a_row_sums + m0);
  }
}

// ---- micro-kernel ---------------------------------------------------------------------------------------

// U read in place, by rows: U(r, k) = rows[r][k] (each row K-contiguous).
template <int MR>
struct URows {
  const float* rows[MR];
  NT_INLINE float operator()(int r, int k) const { return rows[r][k]; }
};
// U read in place, by k: U(r, k) = p[k*sk + r] (the MR values of one k contiguous).
struct UCols {
  const float* p;
  int64_t sk;
  NT_INLINE float operator()(int r, int k) const { return p[k * sk + r]; }
};

// tile(MR, NR) = (accumulate ? tile : 0) + Σ_{k<kc} U(r,k) · v[k][c], v a packed (kc, NR) block.
template <int MR, int NR, int W, class U>
NT_INLINE void micro_kernel(int kc, const U& u, const float* v, float* tile, bool accumulate) {
  using Vf = typename Vec<W>::type;
  constexpr int NV = NR / W;
  Vf acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NV; ++c) {
      acc[r][c] = Vf{};
      if (accumulate) load(acc[r][c], tile + r * NR + c * W);
    }
  for (int k = 0; k < kc; ++k, v += NR) {
    Vf vk[NV];
    for (int c = 0; c < NV; ++c) load(vk[c], v + c * W);
    for (int r = 0; r < MR; ++r) {
      const float ur = u(r, k);
      for (int c = 0; c < NV; ++c) acc[r][c] += vk[c] * ur;  // contracted to one FMA where available
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NV; ++c) store(tile + r * NR + c * W, acc[r][c]);
}

// ---- epilogue -------------------------------------------------------------------------------------------

// C[m, n0..n0+cols) = epilogue(vals[0..cols)), W values at a time (cols % W == 0; W = 1 takes any cols).
// Whole tile rows use explicit vectors: an auto-vectorized loop would peel to align C, then read the
// just-written tile misaligned, defeating store forwarding (costly at K = 64: docs/design.md, 'The CPU GEMM's stores').
template <int W = 1>
NT_INLINE void store_row(const GemmDesc& d, int m, int n0, int cols, const float* vals) {
  using T = typename Vec<W>::type;
  float* c = d.C + static_cast<int64_t>(m) * d.ldc + n0;
  T v, x;  // v: the value, x: the bias or the mask
  switch (d.epilogue) {
    case Epilogue::none:
      for (int j = 0; j < cols; j += W) load(v, vals + j), store(c + j, v);
      break;
    case Epilogue::bias:
      for (int j = 0; j < cols; j += W) load(v, vals + j), load(x, d.bias + n0 + j), store(c + j, T(v + x));
      break;
    case Epilogue::bias_relu:
      for (int j = 0; j < cols; j += W) {
        load(v, vals + j), load(x, d.bias + n0 + j);
        v += x;
        store(c + j, T(v < 0.f ? T{} : v));  // NaN < 0 is false: NaN propagates
      }
      break;
    case Epilogue::relu_mask: {
      const float* mask = d.mask + static_cast<int64_t>(m) * d.ldc + n0;
      for (int j = 0; j < cols; j += W) load(v, vals + j), load(x, mask + j), store(c + j, T(x > 0.f ? v : T{}));
      break;
    }
  }
}

// Writes the valid (rows, cols) corner of a tile (MR, NR) at T(i0, j0) through the epilogue.
template <int MR, int NR, int W>
NT_INLINE void store_tile(const Plan& pl, int i0, int j0, int rows, int cols, const float* tile) {
  const GemmDesc& d = *pl.d;
  if (!pl.transposed) {
    for (int r = 0; r < rows; ++r) {
      if (cols == NR)
        store_row<W>(d, i0 + r, j0, NR, tile + r * NR);
      else
        store_row(d, i0 + r, j0, cols, tile + r * NR);
    }
    return;
  }
  alignas(64) float ct[NR * MR];  // the tile transposed: (NR, MR), rows are rows of C
  if constexpr (MR == 8) {
    for (int c = 0; c < NR; c += 8) transpose8x8(tile + c, NR, ct + c * MR, MR);
  } else {
    for (int c = 0; c < NR; ++c)
      for (int r = 0; r < MR; ++r) ct[c * MR + r] = tile[r * NR + c];
  }
  for (int c = 0; c < cols; ++c) {
    if (rows == MR)
      store_row<MR % 8 == 0 ? 8 : 1>(d, j0 + c, i0, MR, ct + c * MR);
    else
      store_row(d, j0 + c, i0, rows, ct + c * MR);
  }
}

// ---- tasks ----------------------------------------------------------------------------------------------

// Phase 1, task t: pack V panel t; the last task (when asked) computes the row sums.
template <int NR>
NT_INLINE void pack_task(const Plan& pl, int64_t t) {
  if (t == pl.j_panels) return row_sums(*pl.d, pl.transposed ? pl.v : pl.u);
  const int j0 = static_cast<int>(t) * NR;
  pack_panel<NR>(pl.v, j0, std::min(NR, pl.J - j0), pl.K, pl.vpack + t * pl.K * NR);
}

// Phase 2, task t: T for U panels [p0, p1) × V panel q, over all of K.
template <int MR, int NR, int W>
NT_INLINE void compute_task(const Plan& pl, int64_t t) {
  thread_local std::vector<float> partial_buf, edge_buf;
  const int q = static_cast<int>(t / pl.i_blocks);
  const int p0 = static_cast<int>(t % pl.i_blocks) * pl.block_panels;
  const int p1 = std::min(pl.i_panels, p0 + pl.block_panels);
  float* partial = scratch(partial_buf, static_cast<size_t>(p1 - p0) * MR * NR);  // (p1-p0, MR, NR)
  const Operand& u = pl.u;
  for (int kb = 0; kb < pl.k_blocks; ++kb) {
    const int k0 = kb * pl.kc, kc = std::min(pl.kc, pl.K - k0);
    const float* v = pl.vpack + (static_cast<int64_t>(q) * pl.K + k0) * NR;
    for (int p = p0; p < p1; ++p) {
      const int i0 = p * MR, rows = std::min(MR, pl.I - i0);
      float* tile = partial + (p - p0) * MR * NR;
      if (u.sk == 1) {  // rows K-contiguous; a partial panel repeats its last row (results discarded)
        URows<MR> ur;
        for (int r = 0; r < MR; ++r) ur.rows[r] = u.p + std::min(i0 + r, pl.I - 1) * u.so + k0;
        micro_kernel<MR, NR, W>(kc, ur, v, tile, kb > 0);
      } else if (rows == MR) {
        micro_kernel<MR, NR, W>(kc, UCols{u.p + k0 * u.sk + i0, u.sk}, v, tile, kb > 0);
      } else {  // partial panel of a k-major U: copy it zero-padded, reading nothing past row I
        float* edge = scratch(edge_buf, static_cast<size_t>(kc) * MR);
        for (int k = 0; k < kc; ++k)
          for (int r = 0; r < MR; ++r) edge[k * MR + r] = r < rows ? u.p[(k0 + k) * u.sk + i0 + r] : 0.f;
        micro_kernel<MR, NR, W>(kc, UCols{edge, MR}, v, tile, kb > 0);
      }
    }
  }
  const int j0 = q * NR, cols = std::min(NR, pl.J - j0);
  for (int p = p0; p < p1; ++p)
    store_tile<MR, NR, W>(pl, p * MR, j0, std::min(MR, pl.I - p * MR), cols, partial + (p - p0) * MR * NR);
}

// ---- ISA variants, chosen once --------------------------------------------------------------------------

struct Variant {
  int mr, nr;
  void (*pack)(const Plan&, int64_t);
  void (*compute)(const Plan&, int64_t);
};

void pack_generic(const Plan& pl, int64_t t) { pack_task<8>(pl, t); }
void compute_generic(const Plan& pl, int64_t t) { compute_task<4, 8, 4>(pl, t); }
constexpr Variant kGeneric{4, 8, pack_generic, compute_generic};
#if defined(__x86_64__)
[[gnu::target("avx2,fma")]] void pack_avx2(const Plan& pl, int64_t t) { pack_task<16>(pl, t); }
[[gnu::target("avx2,fma")]] void compute_avx2(const Plan& pl, int64_t t) { compute_task<6, 16, 8>(pl, t); }
[[gnu::target("avx512f")]] void pack_avx512(const Plan& pl, int64_t t) { pack_task<32>(pl, t); }
[[gnu::target("avx512f")]] void compute_avx512(const Plan& pl, int64_t t) { compute_task<8, 32, 16>(pl, t); }
constexpr Variant kAvx2{6, 16, pack_avx2, compute_avx2};
constexpr Variant kAvx512{8, 32, pack_avx512, compute_avx512};
#endif

Variant select_variant() {
  const char* env = std::getenv("NT_CPU_GEMM_ISA");
  const std::string forced = env ? env : "";
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2 && __builtin_cpu_supports("avx512f") && forced != "avx2" && forced != "generic") return kAvx512;
  if (avx2 && forced != "generic") return kAvx2;
#endif
  return kGeneric;
}

const Variant& variant() {
  static const Variant chosen = select_variant();
  return chosen;
}

int div_up(int a, int b) { return (a + b - 1) / b; }

// Runs fn(0..n-1) as one contiguous chunk per thread. Tasks are numbered V panel by V panel, so a chunk
// packs the V panels it then reads and writes one region of C; the calling thread, which starts first,
// nearly always takes chunk 0, so call after call each core finds its data in its own L2. Handing out
// single tasks made V and C migrate between the cores' caches, which cost more than balancing gained.
template <class Fn>
void run_chunked(ThreadPool* pool, int threads, int64_t n, const Fn& fn) {
  struct Job {
    int64_t n, chunks;
    const Fn& fn;
  } job{n, std::min<int64_t>(threads, n), fn};
  // One captured pointer fits std::function's inline storage: no allocation per call.
  parallel_for(pool, job.chunks, [&job](int64_t c) {
    for (int64_t t = job.n * c / job.chunks; t < job.n * (c + 1) / job.chunks; ++t) job.fn(t);
  });
}

// Compute T = Cᵀ instead of C? Compares rough cycle counts: padded tile FMAs, packing V (a transpose
// costs ~4× a copy), and transposing the tiles back.
bool choose_transposed(const GemmDesc& d, const Variant& v) {
  const double K = d.K;
  auto cost = [&](int I, int J, bool v_transposes, double store) {
    const double fma = double(div_up(I, v.mr)) * v.mr * div_up(J, v.nr) * v.nr * K / 32;
    return fma + J * K * (v_transposes ? 1.0 : 0.25) + store;
  };
  const double as_c = cost(d.M, d.N, d.trans_b, 0);
  const double as_ct = cost(d.N, d.M, !d.trans_a, 0.5 * d.M * d.N);
  return as_ct < as_c;
}

size_t stored_extent(int rows, int cols, int ld) { return rows == 0 || cols == 0 ? 0 : size_t(rows - 1) * ld + cols; }

}  // namespace

template <>
void gemm(const Exec& exec, const GemmArgs<float>& d) {
  if (gemm_rounds_operands(exec.math)) {
    GemmArgs<float> rounded = d;
    rounded.A =
        rounded_copy(d.A, d.trans_a ? stored_extent(d.K, d.M, d.lda) : stored_extent(d.M, d.K, d.lda), exec.math, 0);
    rounded.B =
        rounded_copy(d.B, d.trans_b ? stored_extent(d.N, d.K, d.ldb) : stored_extent(d.K, d.N, d.ldb), exec.math, 1);
    Exec fp32 = exec;
    fp32.math = Math::fp32;
    return cpu::gemm<float>(fp32, rounded);
  }
  const double M = d.M, N = d.N, K = d.K;
  OpScope scope(exec, gemm_kernel_name(d.epilogue), {4 * (M * K + K * N + M * N), 2 * M * N * K});
  if (d.M == 0) return;
  if (d.K == 0) {  // C = epilogue(0), row sums 0
    const float zeros[64] = {};
    for (int m = 0; m < d.M; ++m)
      for (int n0 = 0; n0 < d.N; n0 += 64) store_row(d, m, n0, std::min(64, d.N - n0), zeros);
    if (d.a_row_sums) std::fill(d.a_row_sums, d.a_row_sums + d.M, 0.f);
    return;
  }

  const Variant& var = variant();
  ThreadPool* pool = 2 * M * N * K >= kMinParallelFlops ? exec.pool : nullptr;
  const int threads = pool ? pool->size() : 1;
  const Operand a = d.trans_a ? Operand{d.A, 1, d.lda} : Operand{d.A, d.lda, 1};  // op(A) as (m, k)
  const Operand b = d.trans_b ? Operand{d.B, d.ldb, 1} : Operand{d.B, 1, d.ldb};  // op(B) as (n, k)

  Plan pl{};
  pl.d = &d;
  pl.transposed = choose_transposed(d, var);
  pl.u = pl.transposed ? b : a;
  pl.v = pl.transposed ? a : b;
  pl.I = pl.transposed ? d.N : d.M;
  pl.J = pl.transposed ? d.M : d.N;
  pl.K = d.K;
  pl.k_blocks = div_up(d.K, kMaxKc);
  pl.kc = div_up(d.K, pl.k_blocks);
  pl.i_panels = div_up(pl.I, var.mr);
  pl.j_panels = div_up(pl.J, var.nr);
  // Tasks: enough (4 per thread) for one contiguous chunk per thread to split the work evenly, made of
  // V panels first, then of U blocks as large as allowed.
  const int want_tasks = threads > 1 ? 4 * threads : 1;
  pl.i_blocks = std::max(div_up(want_tasks, std::max(pl.j_panels, 1)), div_up(pl.i_panels, kMaxBlockPanels));
  pl.i_blocks = std::max(1, std::min(pl.i_blocks, pl.i_panels));
  pl.block_panels = std::max(1, div_up(pl.i_panels, pl.i_blocks));
  pl.i_blocks = div_up(pl.i_panels, pl.block_panels);

  thread_local std::vector<float> vpack_buf;  // the calling thread's; workers fill it, then read it
  pl.vpack = scratch(vpack_buf, static_cast<size_t>(pl.j_panels) * d.K * var.nr);

  run_chunked(pool, threads, pl.j_panels + (d.a_row_sums ? 1 : 0), [&](int64_t t) { var.pack(pl, t); });
  const int64_t compute_tasks = static_cast<int64_t>(pl.i_blocks) * pl.j_panels;
  run_chunked(pool, threads, compute_tasks, [&](int64_t t) { var.compute(pl, t); });
}

}  // namespace nt::kernels::cpu
