// BatchNorm on the GPU, fp32 (contract in kernels/batchnorm.h; CPU twin kernels/cpu/batchnorm.cpp).
//
// Math, per channel c over its count = n·hw values:
//   forward_train  (mean, M2) by Chan's parallel combination of per-thread shifted sums (below);
//                  var = M2/count, invstd = 1/sqrtf(var + eps), y = fmaf(x - mean, gamma·invstd, beta)
//                  (x - mean first: a large mean does not cancel against a precomputed shift), ReLU as
//                  (v < 0 ? 0 : v) so NaN stays NaN; running_mean = (1-m)·rm + m·mean,
//                  running_var = (1-m)·rv + m·M2/(count-1); *num_batches_tracked += 1.
//   forward_eval   y = fmaf(x - running_mean, gamma/sqrtf(running_var + eps), beta), ReLU as above.
//   backward       dy' = relu ? (y > 0 ? dy : 0) : dy (a select); S1 = Σdy', S2 = Σdy'·(x - mean) (centred);
//                  dgamma = S2·invstd, dbeta = S1; dx = k1·(dy' - S1/count - (x - mean)·a) with
//                  k1 = gamma·invstd, a = invstd·dgamma/count. All outputs written with `=`.
// Layouts: NCHW x[(n·C + c)·hw + i], NHWC x[(n·hw + i)·C + c]. With hw == 1 both are (n, C) and the
// NHWC path runs (coalesced across channels).
//
// Numerics of the statistics. Each thread sums its values shifted by the first value it read,
// s1 = Σ(x - K), s2 = Σ(x - K)², over a few dozen values, and turns them into (count, mean = K + s1/n,
// M2 = max(s2 - s1²/n, 0)); K lies inside the data, so s2 does not swamp M2 even when |mean| ≫ std.
// From there on only (count, mean, M2) triples are combined (Chan et al.):
//   n = na + nb, d = mb - ma, mean = ma + d·nb/n, M2 = M2a + M2b + d²·na·nb/n
// which cannot go negative. The backward sums are centred on save_mean, so they do not cancel either.
//
// Work split (a "chunk" plan that depends on the shape only, see plan_chunks):
//   NCHW  block (c, p): channel c, units [p·L, (p+1)·L) of the channel's n·hw/V units (V = 4 with float4
//         loads when hw % 4 == 0 and the tensors are 16-byte aligned, else 1); unit j is plane n = j / hwv,
//         offset i = j % hwv, address (n·C + c)·hwv + i in units. The 256 threads stride the chunk.
//   NHWC  block (g, p): a group of tc vector columns (V channels each, V = 4 when C % 4 == 0 and aligned)
//         and rows [p·L, (p+1)·L); thread t is column q = t % tc, row lane r = t / tc (tr = 256 / tc lanes),
//         so a warp reads whole contiguous rows; every thread keeps its V channels for the whole chunk.
// Every thread issues kUnroll = 4 independent 16-byte loads before using any (bytes in flight), reads
// the statistics pass through the read-only path, and streams the outputs with evict-first stores.
//
// Passes (launches):
//   forward_train NCHW: stats → apply (the apply block's warp 0 first combines its channel's partials,
//                 and blocks p == 0 write save_*, running_* and num_batches_tracked): 2 launches.
//   forward_train NHWC: stats → finalize (a block per 8 channels, 128 lanes each) → apply: 3 launches (an
//                 apply block serves up to 1024 channels, too many to combine per block).
//   forward_eval: one apply launch, per-channel scale computed by each thread.
//   backward: reduce → apply (NCHW, fused finalize) or reduce → finalize → apply (NHWC); without dx,
//                 reduce → finalize.
//   with a fused max-pool (NCHW, batchnorm_pool_*; see "fused max-pool" below): forward_train stats → pool
//                 (normalize each window, write its maximum and argmax); forward_eval pool; backward
//                 reduce over the pooled outputs → apply over the windows' cells.
//   with the convolution before it fused in too (conv_batchnorm_pool_*, the last section): the same passes on
//                 values recomputed from the convolution's input, and the weight gradient instead of dx.
// L2 reuse: the apply launches walk the grid and each chunk in REVERSE order of the statistics pass, so
// the first data they read are the last the statistics pass left in the (50 MB) L2.
//
// Reduction order (determinism, no atomics): inside a block, thread partials combine by a fixed warp
// shuffle-down tree, then the warps' results in warp order (NCHW), or by a fixed fold over the row
// lanes (NHWC); block partials land in the workspace at [field][c][p] (partial_at); a finalizing warp (NCHW,
// in the apply block) combines chunk p = lane, lane + 32, ... sequentially per lane, then a shuffle-down
// tree, and uses lane 0's result; the NHWC finalize kernel chains p = r, r + 128, ... per lane r of 128,
// then folds the lanes in a fixed order (finalize_forward_kernel). The plan depends only on the shape and on
// the 16-byte alignment of the pointers, so a given call gives the same bits every time.
//
// Workspace (floats): partials 3·P·C (forward: mean, M2, count) or 2·P·C (backward: S1, S2), then
// per-channel parameters (3·C forward, 4·C backward) for the NHWC apply; sized for the larger:
// 3·P·C + 4·C with P the shape's chunk count (P_actual <= P for either vector width).
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/batchnorm.h"
#include "kernels/cuda/fast_divmod.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/tf32.h"

namespace nt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarpSize = 32;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kUnroll = 4;                   // independent loads in flight per thread
constexpr int kMaxVec = 4;                   // float4
constexpr int64_t kTargetBlocks = 1024;      // ~8 blocks per SM of an H100 (132 SMs): one wave, all resident
constexpr int64_t kMinElemsPerBlock = 4096;  // 16 KB: below this a block is mostly launch and reduction
// With a fused max-pool (the cnn's 64x32x28x28 and 64x64x14x14): 4 KB, so these latency-bound launches get
// 32 and 12 chunks per channel instead of 12 and 3 (measured in the cnn's step on the H100: the statistics
// pass 7.1 -> 6.5 and 7.7 -> 6.1 us). The unfused kernels keep 16 KB: at 4 KB the NHWC plans of those
// shapes reach 1024 chunks, which the finalize kernel then combines per channel (2x slower in bench_batchnorm).
constexpr int64_t kMinElemsPerBlockPooled = 1024;
constexpr int64_t kMaxChunksNchw = 128;      // partials a fused finalizing warp combines (4 per lane at most)
constexpr int64_t kMaxChunksNhwc = 1024;     // partials the finalize kernel's warp combines (32 per lane)
constexpr int64_t kMaxExtent = int64_t(1) << 30;  // units per channel (NCHW) / rows (NHWC): 32-bit index math
constexpr unsigned kFullMask = 0xffffffffu;

// ---- plan ----------------------------------------------------------------------------------------

struct Geometry {
  int64_t C = 0;       // channels
  int64_t extent = 0;  // NCHW: vector units per channel (n·hwv); NHWC: rows (n·hw)
  int64_t chunk = 0;   // units or rows per chunk
  int chunks = 0;      // P: chunks actually used (<= the workspace's plan)
  uint32_t hwv = 1;    // NCHW: vector units per plane (hw / V)
  int64_t cv = 0;      // NHWC: vector units per row (C / V)
  int tc = 1, tr = 1;  // NHWC: thread columns and row lanes of a block
  int groups = 1;      // NHWC: column groups (grid.x)
  int fold = 0;        // NHWC: largest power of two < tr (first stride of the row-lane fold), 0 if tr == 1
};

Layout effective_layout(const BatchNormShape& s) { return s.hw == 1 ? Layout::nhwc : s.layout; }

// Chunks per channel (NCHW) or per column group (NHWC): about kTargetBlocks blocks in all, none smaller
// than kMinElemsPerBlock elements. From the shape alone, so that the workspace query agrees with every call.
int64_t plan_chunks(const BatchNormShape& s, int64_t min_elems = kMinElemsPerBlock) {
  const int64_t count = s.n * s.hw;
  if (effective_layout(s) == Layout::nchw) {
    const int64_t want = div_up<int64_t>(kTargetBlocks, s.c);
    const int64_t by_size = std::max<int64_t>(1, count / min_elems);
    return std::clamp<int64_t>(std::min(want, by_size), 1, kMaxChunksNchw);
  }
  const int64_t channels_per_block = std::min<int64_t>(s.c, int64_t(kThreads) * kMaxVec);
  const int64_t want = div_up<int64_t>(kTargetBlocks, div_up<int64_t>(s.c, channels_per_block));
  const int64_t by_size = std::max<int64_t>(1, count * channels_per_block / min_elems);
  return std::clamp<int64_t>(std::min(want, by_size), 1, kMaxChunksNhwc);
}

Geometry make_geometry(const BatchNormShape& s, Layout layout, int V, int64_t min_elems = kMinElemsPerBlock) {
  Geometry g;
  g.C = s.c;
  const int64_t planned = plan_chunks(s, min_elems);
  if (layout == Layout::nchw) {
    g.hwv = static_cast<uint32_t>(s.hw / V);
    g.extent = s.n * (s.hw / V);
  } else {
    g.cv = s.c / V;
    g.tc = static_cast<int>(std::min<int64_t>(g.cv, kThreads));
    g.tr = kThreads / g.tc;
    g.groups = static_cast<int>(div_up<int64_t>(g.cv, g.tc));
    g.extent = s.n * s.hw;
    if (g.tr > 1)
      for (g.fold = 1; g.fold * 2 < g.tr;) g.fold *= 2;
  }
  NT_CHECK(g.extent <= kMaxExtent && s.c < (int64_t(1) << 31), "batchnorm: n·hw = ", s.n * s.hw, " with c = ", s.c,
           " exceeds the kernels' 32-bit index range");
  g.chunk = div_up<int64_t>(g.extent, planned);
  g.chunks = static_cast<int>(div_up<int64_t>(g.extent, g.chunk));
  return g;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }  // nullptr counts as aligned

// ---- statistics helpers ---------------------------------------------------------------------------

struct Stat {
  float mean, m2, n;  // count as float: exact to 2^24, and only ever used in ratios beyond that
};

__device__ __forceinline__ Stat combine(const Stat& a, const Stat& b) {
  if (b.n == 0.f) return a;
  if (a.n == 0.f) return b;
  const float n = a.n + b.n;
  const float fb = b.n / n;
  const float d = b.mean - a.mean;
  return {fmaf(d, fb, a.mean), a.m2 + b.m2 + d * d * a.n * fb, n};
}

__device__ __forceinline__ Stat shfl_down(const Stat& s, int offset) {
  return {__shfl_down_sync(kFullMask, s.mean, offset), __shfl_down_sync(kFullMask, s.m2, offset),
          __shfl_down_sync(kFullMask, s.n, offset)};
}

// Lane 0 ends with the warp's combination: lane l takes lane l + o for o = 16, 8, 4, 2, 1. (Lanes whose
// partner is past 31 combine garbage that lane 0's chain never reads.)
__device__ __forceinline__ Stat warp_combine(Stat s) {
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) s = combine(s, shfl_down(s, o));
  return s;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) v += __shfl_down_sync(kFullMask, v, o);
  return v;
}

// One thread's values shifted by the first one it read (see the top of the file).
struct Shifted {
  float shift = 0.f, s1 = 0.f, s2 = 0.f;
  __device__ __forceinline__ void add(float v) {
    const float d = v - shift;
    s1 += d;
    s2 = fmaf(d, d, s2);
  }
  __device__ __forceinline__ Stat stat(int n) const {
    if (n == 0) return {0.f, 0.f, 0.f};
    const float fn = static_cast<float>(n);
    const float d = s1 / fn;
    return {shift + d, fmaxf(s2 - s1 * d, 0.f), fn};
  }
};

// Whole block (all threads one channel): the result is valid in thread 0.
__device__ Stat block_combine(Stat s) {
  __shared__ Stat warp_stats[kWarps];
  s = warp_combine(s);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) warp_stats[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < kWarps; ++w) s = combine(s, warp_stats[w]);
  return s;
}

__device__ float2 block_sum2(float2 v) {
  __shared__ float2 warp_sums[kWarps];
  v.x = warp_sum(v.x);
  v.y = warp_sum(v.y);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < kWarps; ++w) v.x += warp_sums[w].x, v.y += warp_sums[w].y;
  return v;
}

// ---- memory helpers -------------------------------------------------------------------------------

template <int V>
struct Pack {
  float v[V];
};

// Statistics pass: through the read-only path, default caching (the apply pass may find them in L2).
template <int V>
__device__ __forceinline__ Pack<V> load_keep(const float* p, int64_t unit) {
  if constexpr (V == 4) {
    const float4 t = __ldg(reinterpret_cast<const float4*>(p) + unit);
    return {{t.x, t.y, t.z, t.w}};
  } else {
    return {{__ldg(p + unit)}};
  }
}
// Last use: evict-first.
template <int V>
__device__ __forceinline__ Pack<V> load_last(const float* p, int64_t unit) {
  if constexpr (V == 4) {
    const float4 t = __ldcs(reinterpret_cast<const float4*>(p) + unit);
    return {{t.x, t.y, t.z, t.w}};
  } else {
    return {{__ldcs(p + unit)}};
  }
}
template <int V>
__device__ __forceinline__ void store_stream(float* p, int64_t unit, const Pack<V>& a) {
  if constexpr (V == 4)
    __stcs(reinterpret_cast<float4*>(p) + unit, make_float4(a.v[0], a.v[1], a.v[2], a.v[3]));
  else
    __stcs(p + unit, a.v[0]);
}

// The indices of [begin, end) that lane `lane` of `lanes` owns, kUnroll at a time: body(idx, valid)
// gets kUnroll indices of which the first `valid` are in range. Forward: begin + lane, + lanes, ...;
// reverse: end - 1 - lane, - lanes, ... (the same coverage, walked from the end).
template <bool kReverse, class Body>
__device__ __forceinline__ void for_chunk(int64_t begin, int64_t end, int lane, int lanes, const Body& body) {
  const int64_t step = int64_t(kUnroll) * lanes;
  if constexpr (!kReverse) {
    for (int64_t j = begin + lane; j < end; j += step) {
      int64_t idx[kUnroll];
      int valid = 0;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        idx[u] = j + int64_t(u) * lanes;
        valid += idx[u] < end;
      }
      body(idx, valid);
    }
  } else {
    for (int64_t j = end - 1 - lane; j >= begin; j -= step) {
      int64_t idx[kUnroll];
      int valid = 0;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        idx[u] = j - int64_t(u) * lanes;
        valid += idx[u] >= begin;
      }
      body(idx, valid);
    }
  }
}

// NCHW: the address, in vector units, of unit j of channel c. j < 2^30, so 32-bit division.
__device__ __forceinline__ int64_t nchw_unit(const Geometry& g, int64_t c, int64_t j) {
  const uint32_t n = static_cast<uint32_t>(j) / g.hwv;
  const uint32_t i = static_cast<uint32_t>(j) - n * g.hwv;
  return (int64_t(n) * g.C + c) * g.hwv + i;
}

// ---- per-channel parameters ------------------------------------------------------------------------

struct ForwardArgs {
  const float* x;
  const float* gamma;  // nullable
  const float* beta;   // nullable
  float* y;
  float* ws;  // partials [3][C][P], then (NHWC) parameters [3][C]
  float* save_mean;
  float* save_invstd;
  float* running_mean;  // nullable
  float* running_var;   // nullable
  int64_t* num_batches_tracked;  // nullable
  const float* eval_mean;  // forward_eval: running statistics, read only
  const float* eval_var;
  float eps, momentum, count, count_m1;
};

struct BackwardArgs {
  const float* x;
  const float* y;  // forward output; read only with relu
  const float* dy;
  const float* gamma;  // nullable
  const float* save_mean;
  const float* save_invstd;
  float* dx;      // nullable (then no apply pass)
  float* dgamma;  // nullable
  float* dbeta;   // nullable
  float* ws;      // partials [2][C][P], then (NHWC) parameters [4][C]
  float count;
};

struct FwdParams {
  float center, scale, offset;  // y = (x - center)·scale + offset
};
struct BwdParams {
  float center, k1, mdy, a;  // dx = k1·(dy' - mdy - (x - center)·a)
};

__device__ __forceinline__ int64_t params_at(const Geometry& g, int fields) { return fields * int64_t(g.chunks) * g.C; }

// Partial p of channel c within a field of the partials: [field][c][p], so a warp that combines one channel's
// partials reads consecutive floats.
__device__ __forceinline__ int64_t partial_at(const Geometry& g, int p, int64_t c) { return c * g.chunks + p; }

// Partials a finalizing lane loads before combining any: they come from L2, and a chain that waited for
// each load in turn took tens of microseconds for the 32 per lane of the NHWC plan. The combination order
// (p = lane, lane + lanes, ...) is the same as one at a time.
constexpr int kPartialsInFlight = 8;

// Lane `lane` of `lanes` combines channel c's partials p = lane, lane + lanes, ... in that order, issuing
// kPartialsInFlight loads before it uses any.
__device__ Stat chain_forward_partials(const Geometry& g, const float* ws, int64_t c, int lane, int lanes) {
  const int64_t pc = int64_t(g.chunks) * g.C;
  Stat s{0.f, 0.f, 0.f};
  for (int p0 = lane; p0 < g.chunks; p0 += kPartialsInFlight * lanes) {
    Stat part[kPartialsInFlight];
#pragma unroll
    for (int i = 0; i < kPartialsInFlight; ++i) {
      const int p = p0 + i * lanes;
      const int64_t k = partial_at(g, p, c);
      part[i] = p < g.chunks ? Stat{ws[k], ws[pc + k], ws[2 * pc + k]} : Stat{0.f, 0.f, 0.f};
    }
#pragma unroll
    for (int i = 0; i < kPartialsInFlight; ++i) s = combine(s, part[i]);  // an empty partial changes nothing
  }
  return s;
}

// Channel c's parameters from its combined statistics s; with `write`, stores save_*, running_* (and bumps
// num_batches_tracked for channel 0).
__device__ FwdParams forward_params(const ForwardArgs& a, const Stat& s, int64_t c, bool write) {
  const float invstd = 1.f / sqrtf(s.m2 / a.count + a.eps);
  if (write) {
    a.save_mean[c] = s.mean;
    a.save_invstd[c] = invstd;
    const float m = a.momentum;
    if (a.running_mean) a.running_mean[c] = (1.f - m) * a.running_mean[c] + m * s.mean;
    if (a.running_var) a.running_var[c] = (1.f - m) * a.running_var[c] + m * (s.m2 / a.count_m1);
    if (c == 0 && a.num_batches_tracked) *a.num_batches_tracked += 1;
  }
  return {s.mean, invstd * (a.gamma ? a.gamma[c] : 1.f), a.beta ? a.beta[c] : 0.f};
}

// One full warp combines channel c's partials (chained per lane, then warp_combine); lane 0 gets the
// parameters and, with `write`, stores them (forward_params).
__device__ FwdParams finalize_forward(const Geometry& g, const ForwardArgs& a, int64_t c, bool write) {
  const int lane = threadIdx.x % kWarpSize;
  const Stat s = warp_combine(chain_forward_partials(g, a.ws, c, lane, kWarpSize));
  return lane == 0 ? forward_params(a, s, c, write) : FwdParams{0.f, 0.f, 0.f};
}

__device__ __forceinline__ FwdParams eval_params(const ForwardArgs& a, int64_t c) {
  const float g = a.gamma ? a.gamma[c] : 1.f;
  return {a.eval_mean[c], g / sqrtf(a.eval_var[c] + a.eps), a.beta ? a.beta[c] : 0.f};
}

// The backward's (S1, S2) partials of channel c, chained like chain_forward_partials.
__device__ float2 chain_backward_partials(const Geometry& g, const float* ws, int64_t c, int lane, int lanes) {
  const int64_t pc = int64_t(g.chunks) * g.C;
  float2 s = make_float2(0.f, 0.f);
  for (int p0 = lane; p0 < g.chunks; p0 += kPartialsInFlight * lanes) {
    float2 part[kPartialsInFlight];
#pragma unroll
    for (int i = 0; i < kPartialsInFlight; ++i) {
      const int p = p0 + i * lanes;
      const int64_t k = partial_at(g, p, c);
      part[i] = p < g.chunks ? make_float2(ws[k], ws[pc + k]) : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < kPartialsInFlight; ++i) s.x += part[i].x, s.y += part[i].y;  // + 0 changes nothing
  }
  return s;
}

// Channel c's dx parameters from its sums (S1, S2); with `write`, stores dgamma and dbeta.
__device__ BwdParams backward_params(const BackwardArgs& b, float2 sums, int64_t c, bool write) {
  const float invstd = b.save_invstd[c];
  const float dgamma = sums.y * invstd;
  if (write) {
    if (b.dgamma) b.dgamma[c] = dgamma;
    if (b.dbeta) b.dbeta[c] = sums.x;
  }
  return {b.save_mean[c], (b.gamma ? b.gamma[c] : 1.f) * invstd, sums.x / b.count, invstd * dgamma / b.count};
}

__device__ BwdParams finalize_backward(const Geometry& g, const BackwardArgs& b, int64_t c, bool write) {
  const int lane = threadIdx.x % kWarpSize;
  const float2 chained = chain_backward_partials(g, b.ws, c, lane, kWarpSize);
  const float2 sums = make_float2(warp_sum(chained.x), warp_sum(chained.y));
  return lane == 0 ? backward_params(b, sums, c, write) : BwdParams{0.f, 0.f, 0.f, 0.f};
}

// What warp 0 computes (finalize(), run by its 32 lanes; lane 0's result), handed to every thread of the
// block while the other warps wait at the barrier. Every thread of the block calls it.
template <class Params, class Finalize>
__device__ __forceinline__ Params from_warp0(const Finalize& finalize) {
  __shared__ Params shared;
  if (threadIdx.x < kWarpSize) {
    const Params r = finalize();
    if (threadIdx.x == 0) shared = r;
  }
  __syncthreads();
  return shared;
}

// Channel c's parameters in a block of chunk p: kTrain, finalized by warp 0 (blocks p == 0 also store
// save_*/running_*); else from the running statistics.
template <bool kTrain>
__device__ __forceinline__ FwdParams block_forward_params(const Geometry& g, const ForwardArgs& a, int64_t c, int p) {
  if constexpr (kTrain) return from_warp0<FwdParams>([&] { return finalize_forward(g, a, c, p == 0); });
  else return eval_params(a, c);
}

// The same for the backward (blocks p == 0 store dgamma/dbeta); g: the reduction's partial layout.
__device__ __forceinline__ BwdParams block_backward_params(const Geometry& g, const BackwardArgs& b, int64_t c, int p) {
  return from_warp0<BwdParams>([&] { return finalize_backward(g, b, c, p == 0); });
}

template <bool kRelu>
__device__ __forceinline__ float normalize(float x, const FwdParams& f) {
  const float v = fmaf(x - f.center, f.scale, f.offset);
  if constexpr (kRelu) return v < 0.f ? 0.f : v;
  return v;
}

__device__ __forceinline__ float dx_of(float g, float x, const BwdParams& b) {
  return b.k1 * (g - b.mdy - (x - b.center) * b.a);
}

// ---- forward: statistics ---------------------------------------------------------------------------

// grid (C, P): block (c, p) writes the partial (mean, M2, count) of channel c over chunk p.
template <int V>
__global__ void __launch_bounds__(kThreads) nchw_stats_kernel(const Geometry g, const float* __restrict__ x,
                                                              float* __restrict__ ws) {
  begin_dependent_kernel();
  const int64_t c = blockIdx.x;
  const int p = blockIdx.y;
  const int64_t begin = int64_t(p) * g.chunk, end = std::min(g.extent, begin + g.chunk);
  Shifted acc;
  int n = 0;
  if (begin + threadIdx.x < end) acc.shift = load_keep<V>(x, nchw_unit(g, c, begin + threadIdx.x)).v[0];
  for_chunk<false>(begin, end, threadIdx.x, kThreads, [&](const int64_t (&j)[kUnroll], int valid) {
    Pack<V> v[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < valid) v[u] = load_keep<V>(x, nchw_unit(g, c, j[u]));
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < valid) {
#pragma unroll
        for (int k = 0; k < V; ++k) acc.add(v[u].v[k]);
        n += V;
      }
  });
  const Stat s = block_combine(acc.stat(n));
  if (threadIdx.x == 0) {
    const int64_t pc = int64_t(g.chunks) * g.C, k = partial_at(g, p, c);
    ws[k] = s.mean;
    ws[pc + k] = s.m2;
    ws[2 * pc + k] = s.n;
  }
}

// grid (groups, P): block (grp, p) writes the partials of its tc·V channels over rows chunk p.
template <int V>
__global__ void __launch_bounds__(kThreads) nhwc_stats_kernel(const Geometry g, const float* __restrict__ x,
                                                              float* __restrict__ ws) {
  begin_dependent_kernel();
  __shared__ float sm_mean[kThreads * kMaxVec], sm_m2[kThreads * kMaxVec], sm_n[kThreads * kMaxVec];
  const int t = threadIdx.x, q = t % g.tc, r = t / g.tc;
  const int64_t col = int64_t(blockIdx.x) * g.tc + q;  // vector column: channels col·V .. col·V + V-1
  const int p = blockIdx.y;
  const bool active = r < g.tr && col < g.cv;
  const int64_t begin = int64_t(p) * g.chunk, end = std::min(g.extent, begin + g.chunk);
  if (active) {
    Shifted acc[V];
    int n = 0;
    if (begin + r < end) {
      const Pack<V> first = load_keep<V>(x, (begin + r) * g.cv + col);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k].shift = first.v[k];
    }
    for_chunk<false>(begin, end, r, g.tr, [&](const int64_t (&row)[kUnroll], int valid) {
      Pack<V> v[kUnroll] = {};
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (u < valid) v[u] = load_keep<V>(x, row[u] * g.cv + col);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (u < valid) {
#pragma unroll
          for (int k = 0; k < V; ++k) acc[k].add(v[u].v[k]);
          ++n;
        }
    });
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const Stat s = acc[k].stat(n);
      sm_mean[t * V + k] = s.mean, sm_m2[t * V + k] = s.m2, sm_n[t * V + k] = s.n;
    }
  }
  __syncthreads();
  // Fold the row lanes: lane r takes lane r + s for s = fold, fold/2, ..., 1 (a fixed tree).
  for (int s = g.fold; s >= 1; s /= 2) {
    if (active && r < s && r + s < g.tr) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int a = t * V + k, b = (t + s * g.tc) * V + k;
        const Stat m = combine({sm_mean[a], sm_m2[a], sm_n[a]}, {sm_mean[b], sm_m2[b], sm_n[b]});
        sm_mean[a] = m.mean, sm_m2[a] = m.m2, sm_n[a] = m.n;
      }
    }
    __syncthreads();
  }
  if (active && r == 0) {
    const int64_t pc = int64_t(g.chunks) * g.C;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t idx = partial_at(g, p, col * V + k);
      ws[idx] = sm_mean[t * V + k];
      ws[pc + idx] = sm_m2[t * V + k];
      ws[2 * pc + idx] = sm_n[t * V + k];
    }
  }
}

// ---- forward: finalize and apply ---------------------------------------------------------------------

// The finalize kernels (NHWC, and the backward without dx): grid ceil(C / kFinalizeChannels) blocks of
// kFinalizeThreads; block b serves channels c0 = kFinalizeChannels·b + j, j < kFinalizeChannels. Thread t is
// channel j = t / kFinalizeLanes, lane r = t % kFinalizeLanes: it chains partials p = r, r + kFinalizeLanes, ...
// (a warp reads 32 consecutive partials of its channel: one 128-byte line per field). Then each warp folds
// its 32 lanes by a shuffle-down tree, and thread j < kFinalizeChannels adds channel j's 4 warps in order.
// Why so many lanes: a combination is a few dozen dependent instructions, and with a warp per channel
// chaining 1024 partials (32 per lane, the partials then stored [p][c], 32 sectors per warp load) the kernel
// took 11.0 us at 64x128x56x56 on the H100; with 128 lanes per channel, 8.0 us, the same with the lanes
// folded in shared memory or with a 2-ulp division in the combination (Nsight Compute).
constexpr int kFinalizeThreads = 1024;
constexpr int kFinalizeChannels = 8;
constexpr int kFinalizeLanes = kFinalizeThreads / kFinalizeChannels;
constexpr int kFinalizeWarpsPerChannel = kFinalizeLanes / kWarpSize;
static_assert(kFinalizeLanes % kWarpSize == 0, "a channel's lanes are whole warps");

// Every thread of the block passes its lane's chained value; thread j < kFinalizeChannels gets channel j's
// combination (warp_fold: a warp's tree, valid in lane 0; combine: two values in order).
template <class T, class WarpFold, class Combine>
__device__ __forceinline__ T fold_finalize_lanes(const T& mine, const WarpFold& warp_fold, const Combine& combine) {
  __shared__ T warps[kFinalizeChannels][kFinalizeWarpsPerChannel];
  const T folded = warp_fold(mine);
  const int w = threadIdx.x / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) warps[w / kFinalizeWarpsPerChannel][w % kFinalizeWarpsPerChannel] = folded;
  __syncthreads();
  T out = mine;
  if (threadIdx.x < kFinalizeChannels) {
    out = warps[threadIdx.x][0];
#pragma unroll
    for (int q = 1; q < kFinalizeWarpsPerChannel; ++q) out = combine(out, warps[threadIdx.x][q]);
  }
  return out;
}

__global__ void __launch_bounds__(kFinalizeThreads) finalize_forward_kernel(const Geometry g, const ForwardArgs a) {
  begin_dependent_kernel();
  const int64_t c0 = int64_t(blockIdx.x) * kFinalizeChannels;
  const int64_t chain_c = c0 + threadIdx.x / kFinalizeLanes;  // the channel whose partials this thread chains
  const int lane = threadIdx.x % kFinalizeLanes;
  const Stat chained = chain_c < g.C ? chain_forward_partials(g, a.ws, chain_c, lane, kFinalizeLanes) : Stat{};
  const Stat s = fold_finalize_lanes(chained, [](const Stat& v) { return warp_combine(v); }, combine);
  const int64_t c = c0 + threadIdx.x;  // threads < kFinalizeChannels: the channel whose combination s is
  if (threadIdx.x < kFinalizeChannels && c < g.C) {
    const FwdParams f = forward_params(a, s, c, true);
    float* params = a.ws + params_at(g, 3);
    params[c] = f.center, params[g.C + c] = f.scale, params[2 * g.C + c] = f.offset;
  }
}

// grid (C, P), reversed: block (C-1-bx, P-1-by). kTrain: warp 0 finalizes the channel (blocks p == 0
// also store save_*/running_*), else the parameters come from the running statistics.
template <int V, bool kTrain, bool kRelu>
__global__ void __launch_bounds__(kThreads) nchw_forward_apply_kernel(const Geometry g, const ForwardArgs a) {
  begin_dependent_kernel();
  const int64_t c = g.C - 1 - int64_t(blockIdx.x);
  const int p = g.chunks - 1 - static_cast<int>(blockIdx.y);
  const FwdParams f = block_forward_params<kTrain>(g, a, c, p);
  const int64_t begin = int64_t(p) * g.chunk, end = std::min(g.extent, begin + g.chunk);
  for_chunk<true>(begin, end, threadIdx.x, kThreads, [&](const int64_t (&j)[kUnroll], int valid) {
    Pack<V> v[kUnroll] = {};
    int64_t at[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < valid) at[u] = nchw_unit(g, c, j[u]), v[u] = load_last<V>(a.x, at[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < valid) {
#pragma unroll
        for (int k = 0; k < V; ++k) v[u].v[k] = normalize<kRelu>(v[u].v[k], f);
        store_stream<V>(a.y, at[u], v[u]);
      }
  });
}

// grid (groups, P), reversed. kTrain: parameters from the finalize kernel, else from running statistics.
template <int V, bool kTrain, bool kRelu>
__global__ void __launch_bounds__(kThreads) nhwc_forward_apply_kernel(const Geometry g, const ForwardArgs a) {
  begin_dependent_kernel();
  const int q = threadIdx.x % g.tc, r = threadIdx.x / g.tc;
  const int64_t col = int64_t(g.groups - 1 - static_cast<int>(blockIdx.x)) * g.tc + q;
  const int p = g.chunks - 1 - static_cast<int>(blockIdx.y);
  if (r >= g.tr || col >= g.cv) return;
  FwdParams f[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t c = col * V + k;
    if constexpr (kTrain) {
      const float* params = a.ws + params_at(g, 3);
      f[k] = {params[c], params[g.C + c], params[2 * g.C + c]};
    } else {
      f[k] = eval_params(a, c);
    }
  }
  const int64_t begin = int64_t(p) * g.chunk, end = std::min(g.extent, begin + g.chunk);
  for_chunk<true>(begin, end, r, g.tr, [&](const int64_t (&row)[kUnroll], int valid) {
    Pack<V> v[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < valid) v[u] = load_last<V>(a.x, row[u] * g.cv + col);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < valid) {
#pragma unroll
        for (int k = 0; k < V; ++k) v[u].v[k] = normalize<kRelu>(v[u].v[k], f[k]);
        store_stream<V>(a.y, row[u] * g.cv + col, v[u]);
      }
  });
}

// ---- backward -----------------------------------------------------------------------------------------

template <int V, bool kRelu>
__device__ __forceinline__ Pack<V> grad_in(const BackwardArgs& b, int64_t unit, bool last) {
  Pack<V> d = last ? load_last<V>(b.dy, unit) : load_keep<V>(b.dy, unit);
  if constexpr (kRelu) {
    const Pack<V> y = last ? load_last<V>(b.y, unit) : load_keep<V>(b.y, unit);
#pragma unroll
    for (int k = 0; k < V; ++k) d.v[k] = y.v[k] > 0.f ? d.v[k] : 0.f;
  }
  return d;
}

// The block's (S1, S2) of channel c over chunk p, summed over its threads, into the partials [2][C][P]
// (parts: the partial layout). Every thread of the block calls it.
__device__ __forceinline__ void store_backward_partial(const Geometry& parts, const BackwardArgs& b, int64_t c, int p,
                                                       float2 acc) {
  const float2 s = block_sum2(acc);
  if (threadIdx.x == 0) {
    const int64_t pc = int64_t(parts.chunks) * parts.C, k = partial_at(parts, p, c);
    b.ws[k] = s.x;
    b.ws[pc + k] = s.y;
  }
}

// grid (C, P): block (c, p) writes (S1, S2) of channel c over chunk p.
template <int V, bool kRelu>
__global__ void __launch_bounds__(kThreads) nchw_backward_reduce_kernel(const Geometry g, const BackwardArgs b) {
  begin_dependent_kernel();
  const int64_t c = blockIdx.x;
  const int p = blockIdx.y;
  const float mean = b.save_mean[c];
  const int64_t begin = int64_t(p) * g.chunk, end = std::min(g.extent, begin + g.chunk);
  float2 acc = make_float2(0.f, 0.f);
  for_chunk<false>(begin, end, threadIdx.x, kThreads, [&](const int64_t (&j)[kUnroll], int valid) {
    Pack<V> xs[kUnroll] = {}, ds[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < valid) {
        const int64_t at = nchw_unit(g, c, j[u]);
        xs[u] = load_keep<V>(b.x, at);
        ds[u] = grad_in<V, kRelu>(b, at, false);
      }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < valid)
#pragma unroll
        for (int k = 0; k < V; ++k) {
          acc.x += ds[u].v[k];
          acc.y = fmaf(ds[u].v[k], xs[u].v[k] - mean, acc.y);
        }
  });
  store_backward_partial(g, b, c, p, acc);
}

template <int V, bool kRelu>
__global__ void __launch_bounds__(kThreads) nhwc_backward_reduce_kernel(const Geometry g, const BackwardArgs b) {
  begin_dependent_kernel();
  __shared__ float sm_s1[kThreads * kMaxVec], sm_s2[kThreads * kMaxVec];
  const int t = threadIdx.x, q = t % g.tc, r = t / g.tc;
  const int64_t col = int64_t(blockIdx.x) * g.tc + q;
  const int p = blockIdx.y;
  const bool active = r < g.tr && col < g.cv;
  const int64_t begin = int64_t(p) * g.chunk, end = std::min(g.extent, begin + g.chunk);
  if (active) {
    float mean[V], s1[V] = {}, s2[V] = {};
#pragma unroll
    for (int k = 0; k < V; ++k) mean[k] = b.save_mean[col * V + k];
    for_chunk<false>(begin, end, r, g.tr, [&](const int64_t (&row)[kUnroll], int valid) {
      Pack<V> xs[kUnroll] = {}, ds[kUnroll] = {};
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (u < valid) {
          const int64_t at = row[u] * g.cv + col;
          xs[u] = load_keep<V>(b.x, at);
          ds[u] = grad_in<V, kRelu>(b, at, false);
        }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (u < valid)
#pragma unroll
          for (int k = 0; k < V; ++k) {
            s1[k] += ds[u].v[k];
            s2[k] = fmaf(ds[u].v[k], xs[u].v[k] - mean[k], s2[k]);
          }
    });
#pragma unroll
    for (int k = 0; k < V; ++k) sm_s1[t * V + k] = s1[k], sm_s2[t * V + k] = s2[k];
  }
  __syncthreads();
  for (int s = g.fold; s >= 1; s /= 2) {
    if (active && r < s && r + s < g.tr) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int a = t * V + k, o = (t + s * g.tc) * V + k;
        sm_s1[a] += sm_s1[o];
        sm_s2[a] += sm_s2[o];
      }
    }
    __syncthreads();
  }
  if (active && r == 0) {
    const int64_t pc = int64_t(g.chunks) * g.C;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t idx = partial_at(g, p, col * V + k);
      b.ws[idx] = sm_s1[t * V + k];
      b.ws[pc + idx] = sm_s2[t * V + k];
    }
  }
}

// Laid out as finalize_forward_kernel; writes dgamma/dbeta and, with dx, the apply parameters at params_at.
__global__ void __launch_bounds__(kFinalizeThreads) finalize_backward_kernel(const Geometry g, const BackwardArgs b) {
  begin_dependent_kernel();
  const int64_t c0 = int64_t(blockIdx.x) * kFinalizeChannels;
  const int64_t chain_c = c0 + threadIdx.x / kFinalizeLanes;
  const int lane = threadIdx.x % kFinalizeLanes;
  const float2 chained =
      chain_c < g.C ? chain_backward_partials(g, b.ws, chain_c, lane, kFinalizeLanes) : make_float2(0.f, 0.f);
  const float2 sums = fold_finalize_lanes(
      chained, [](float2 v) { return make_float2(warp_sum(v.x), warp_sum(v.y)); },
      [](float2 u, float2 v) { return make_float2(u.x + v.x, u.y + v.y); });
  const int64_t c = c0 + threadIdx.x;
  if (threadIdx.x < kFinalizeChannels && c < g.C) {
    const BwdParams f = backward_params(b, sums, c, true);
    if (b.dx) {
      float* params = b.ws + params_at(g, 2);
      params[c] = f.center, params[g.C + c] = f.k1, params[2 * g.C + c] = f.mdy, params[3 * g.C + c] = f.a;
    }
  }
}

// grid (C, P), reversed; warp 0 finalizes the channel (blocks p == 0 store dgamma/dbeta).
template <int V, bool kRelu>
__global__ void __launch_bounds__(kThreads) nchw_backward_apply_kernel(const Geometry g, const BackwardArgs b) {
  begin_dependent_kernel();
  const int64_t c = g.C - 1 - int64_t(blockIdx.x);
  const int p = g.chunks - 1 - static_cast<int>(blockIdx.y);
  const BwdParams f = block_backward_params(g, b, c, p);
  const int64_t begin = int64_t(p) * g.chunk, end = std::min(g.extent, begin + g.chunk);
  for_chunk<true>(begin, end, threadIdx.x, kThreads, [&](const int64_t (&j)[kUnroll], int valid) {
    Pack<V> xs[kUnroll] = {}, ds[kUnroll] = {};
    int64_t at[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < valid) {
        at[u] = nchw_unit(g, c, j[u]);
        xs[u] = load_last<V>(b.x, at[u]);
        ds[u] = grad_in<V, kRelu>(b, at[u], true);
      }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < valid) {
#pragma unroll
        for (int k = 0; k < V; ++k) ds[u].v[k] = dx_of(ds[u].v[k], xs[u].v[k], f);
        store_stream<V>(b.dx, at[u], ds[u]);
      }
  });
}

template <int V, bool kRelu>
__global__ void __launch_bounds__(kThreads) nhwc_backward_apply_kernel(const Geometry g, const BackwardArgs b) {
  begin_dependent_kernel();
  const int q = threadIdx.x % g.tc, r = threadIdx.x / g.tc;
  const int64_t col = int64_t(g.groups - 1 - static_cast<int>(blockIdx.x)) * g.tc + q;
  const int p = g.chunks - 1 - static_cast<int>(blockIdx.y);
  if (r >= g.tr || col >= g.cv) return;
  BwdParams f[V];
  const float* params = b.ws + params_at(g, 2);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t c = col * V + k;
    f[k] = {params[c], params[g.C + c], params[2 * g.C + c], params[3 * g.C + c]};
  }
  const int64_t begin = int64_t(p) * g.chunk, end = std::min(g.extent, begin + g.chunk);
  for_chunk<true>(begin, end, r, g.tr, [&](const int64_t (&row)[kUnroll], int valid) {
    Pack<V> xs[kUnroll] = {}, ds[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < valid) {
        const int64_t at = row[u] * g.cv + col;
        xs[u] = load_last<V>(b.x, at);
        ds[u] = grad_in<V, kRelu>(b, at, true);
      }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < valid) {
#pragma unroll
        for (int k = 0; k < V; ++k) ds[u].v[k] = dx_of(ds[u].v[k], xs[u].v[k], f[k]);
        store_stream<V>(b.dx, row[u] * g.cv + col, ds[u]);
      }
  });
}

// ---- fused max-pool (NCHW) ---------------------------------------------------------------------------------
// BatchNorm2d (+ ReLU) then MaxPool2d(window, stride = window) without the full-resolution output: the forward
// normalizes each window of x and writes only its maximum and argmax; the backward's dy' is the pooled
// gradient at the argmax (through the ReLU as pooled y > 0, which is y > 0 there) and 0 elsewhere, so the
// reduction visits the pooled outputs only: S1 = Σ g, S2 = Σ g·(x[argmax] - mean), and the apply writes every
// dx from x and the window that covers it. The statistics pass is the unfused one's.

// Blocks per SM the pooled backward apply is compiled for (<= 48 registers, no spills): the cnn's planes give
// one or two waves of 256-thread blocks, and at its 64 registers only 4 fit an SM. (The forward keeps its
// registers: capped, its finalize spills around the prefetched window.)
constexpr int kPooledMinBlocks = 5;

struct PoolGeometry {
  Geometry parts;      // the backward reduction's partial layout: C, and chunks over the pooled outputs
  int64_t extent = 0;  // pooled outputs per channel: n·P·Q
  int64_t chunk = 0;
  int chunks = 0;
  // The backward apply's cells: the windows' grid extended to cover the plane, ceil(h / window) x
  // ceil(w / window) per plane (cells past P or Q hold elements no window chose).
  int64_t cell_extent = 0;  // n·CH·CW
  int64_t cell_chunk = 0;
  int cell_chunks = 0;
  int h = 0, w = 0, window = 1, p = 0, q = 0, ch = 0, cw = 0;
  FastDivmod by_pq, by_q, by_cells, by_cw;
};

// Pooled output j of channel c (j = img·P·Q + i·Q + jq): its index in y/dy/argmax, and its (h, w) plane's offset in x.
__device__ __forceinline__ void pooled_at(const PoolGeometry& pg, int64_t C, int64_t c, int j, int64_t& out,
                                          int64_t& plane, int& i, int& jq) {
  int img, ij;
  pg.by_pq.divmod(j, img, ij);
  pg.by_q.divmod(ij, i, jq);
  out = (int64_t(img) * C + c) * (int64_t(pg.p) * pg.q) + ij;
  plane = (int64_t(img) * C + c) * (int64_t(pg.h) * pg.w);
}

// x[at] and x[at + 1]; kPairs: one 8-byte load (the launcher checked that every pair it asks is aligned).
template <bool kPairs>
__device__ __forceinline__ float2 load_pair(const float* p) {
  if constexpr (kPairs) return __ldcs(reinterpret_cast<const float2*>(p));
  else return make_float2(__ldcs(p), __ldcs(p + 1));
}
template <bool kPairs>
__device__ __forceinline__ void store_pair(float* p, float2 v) {
  if constexpr (kPairs) __stcs(reinterpret_cast<float2*>(p), v);
  else __stcs(p, v.x), __stcs(p + 1, v.y);
}

// grid (C, P'): block (c, p) writes the maxima and argmax of channel c's pooled outputs [p·L, (p+1)·L).
// kTrain: warp 0 finalizes the channel from the statistics' partials (blocks p == 0 store save_*/running_*),
// else the parameters come from the running statistics. kWindow: the window (0: pg.window at run time);
// 2 reads each window row as a pair (kPairs: 8-byte loads, w even and x 8-byte aligned).
// The window is scanned row-major and an element replaces the best when larger or NaN (maxpool2d's rule).
template <bool kTrain, bool kRelu, int kWindow, bool kPairs>
__global__ void __launch_bounds__(kThreads) nchw_pool_forward_kernel(const Geometry g, const PoolGeometry pg,
                                                                     const ForwardArgs a, int32_t* argmax) {
  begin_dependent_kernel();
  const int64_t c = blockIdx.x;
  const int p = blockIdx.y;
  const int win = kWindow > 0 ? kWindow : pg.window;
  const int64_t begin = int64_t(p) * pg.chunk, end = std::min(pg.extent, begin + pg.chunk);

  // A pooled output's place, and (window 2) its window's two rows, fetched one output ahead: the first
  // fetch is in flight while warp 0 finalizes the channel.
  int64_t out = 0, plane = 0;
  int first = 0;  // the window's top-left element in the plane
  float2 top = make_float2(0.f, 0.f), bottom = top;
  auto fetch = [&](int64_t j) {
    int i, jq;
    pooled_at(pg, g.C, c, static_cast<int>(j), out, plane, i, jq);
    first = i * win * pg.w + jq * win;
    if constexpr (kWindow == 2)
      top = load_pair<kPairs>(a.x + plane + first), bottom = load_pair<kPairs>(a.x + plane + first + pg.w);
  };
  int64_t j = begin + threadIdx.x;
  if (j < end) fetch(j);

  const FwdParams f = block_forward_params<kTrain>(g, a, c, p);

  for (; j < end; j += kThreads) {
    float best = -INFINITY;
    int best_at = first;
    auto consider = [&](float x, int at) {
      const float v = normalize<kRelu>(x, f);
      if (v > best || isnan(v)) best = v, best_at = at;
    };
    if constexpr (kWindow == 2) {
      consider(top.x, first), consider(top.y, first + 1);
      consider(bottom.x, first + pg.w), consider(bottom.y, first + pg.w + 1);
    } else {
      for (int r = 0; r < win; ++r)
        for (int s = 0; s < win; ++s) consider(__ldcs(a.x + plane + first + r * pg.w + s), first + r * pg.w + s);
    }
    __stcs(a.y + out, best);
    __stcs(argmax + out, best_at);
    if (j + kThreads < end) fetch(j + kThreads);
  }
}

// grid (C, P'): block (c, p) writes (S1, S2) of channel c over pooled outputs [p·L, (p+1)·L) (layout pg.parts).
template <bool kRelu>
__global__ void __launch_bounds__(kThreads) nchw_pool_backward_reduce_kernel(const PoolGeometry pg, const BackwardArgs b,
                                                                             const int32_t* argmax) {
  begin_dependent_kernel();
  const int64_t c = blockIdx.x;
  const int p = blockIdx.y;
  const float mean = b.save_mean[c];
  const int64_t begin = int64_t(p) * pg.chunk, end = std::min(pg.extent, begin + pg.chunk);
  float2 acc = make_float2(0.f, 0.f);
  for (int64_t j = begin + threadIdx.x; j < end; j += kThreads) {
    int64_t out, plane;
    int i, jq;
    pooled_at(pg, pg.parts.C, c, static_cast<int>(j), out, plane, i, jq);
    float d = __ldg(b.dy + out);
    if constexpr (kRelu) d = __ldg(b.y + out) > 0.f ? d : 0.f;
    const float x = __ldg(b.x + plane + __ldg(argmax + out));
    acc.x += d;
    acc.y = fmaf(d, x - mean, acc.y);
  }
  store_backward_partial(pg.parts, b, c, p, acc);
}

// grid (C, cell chunks): block (c, p) writes dx over channel c's cells [p·L, (p+1)·L); warp 0 finalizes the
// channel from the pooled partials (blocks p == 0 store dgamma/dbeta). A thread owns a cell: it reads the
// window's argmax, dy (and y) once, then writes dx for each of the cell's elements, the chosen one with the
// window's gradient (through the ReLU) and the others with 0. kWindow, kPairs: as the forward (with pairs,
// w is even, so no cell is cut by the plane's right edge).
template <bool kRelu, int kWindow, bool kPairs>
__global__ void __launch_bounds__(kThreads, kPooledMinBlocks)
    nchw_pool_backward_apply_kernel(const PoolGeometry pg, const BackwardArgs b, const int32_t* argmax) {
  begin_dependent_kernel();
  const int64_t C = pg.parts.C, c = blockIdx.x;
  const int p = blockIdx.y;
  const int win = kWindow > 0 ? kWindow : pg.window;
  const int64_t begin = int64_t(p) * pg.cell_chunk, end = std::min(pg.cell_extent, begin + pg.cell_chunk);

  // A cell's place, its window's choice and gradient, and (pairs) its two rows of x, fetched one cell
  // ahead: the first fetch is in flight while warp 0 finalizes the channel.
  int64_t plane = 0;
  int h0 = 0, w0 = 0, chosen = -1;  // chosen: -1 where no window covers the cell (every dy' is 0)
  float d = 0.f;
  float2 x_top = make_float2(0.f, 0.f), x_bottom = x_top;
  auto fetch = [&](int64_t j) {
    int img, cell, ci, cj;
    pg.by_cells.divmod(static_cast<int>(j), img, cell);
    pg.by_cw.divmod(cell, ci, cj);
    plane = (int64_t(img) * C + c) * (int64_t(pg.h) * pg.w);
    h0 = ci * win, w0 = cj * win, chosen = -1, d = 0.f;
    if (ci < pg.p && cj < pg.q) {
      const int64_t out = (int64_t(img) * C + c) * (int64_t(pg.p) * pg.q) + int64_t(ci) * pg.q + cj;
      chosen = __ldg(argmax + out);
      d = __ldg(b.dy + out);
      if constexpr (kRelu) d = __ldg(b.y + out) > 0.f ? d : 0.f;
    }
    if constexpr (kPairs) {
      x_top = load_pair<true>(b.x + plane + h0 * pg.w + w0);
      if (h0 + 1 < pg.h) x_bottom = load_pair<true>(b.x + plane + (h0 + 1) * pg.w + w0);  // not past an odd plane
    }
  };
  int64_t j = begin + threadIdx.x;
  if (j < end) fetch(j);

  const BwdParams f = block_backward_params(pg.parts, b, c, p);

  for (; j < end; j += kThreads) {
    if constexpr (kPairs) {
      auto store_row = [&](int e, float2 x) {
        store_pair<true>(b.dx + plane + e, make_float2(dx_of(e == chosen ? d : 0.f, x.x, f),
                                                       dx_of(e + 1 == chosen ? d : 0.f, x.y, f)));
      };
      store_row(h0 * pg.w + w0, x_top);
      if (h0 + 1 < pg.h) store_row((h0 + 1) * pg.w + w0, x_bottom);
    } else {
      for (int r = 0; r < win; ++r)
        for (int t = 0; t < win; ++t) {
          const int h = h0 + r, w = w0 + t;
          if (h >= pg.h || w >= pg.w) continue;  // a partial cell at the plane's edge
          const int e = h * pg.w + w;
          __stcs(b.dx + plane + e, dx_of(e == chosen ? d : 0.f, __ldcs(b.x + plane + e), f));
        }
    }
    if (j + kThreads < end) fetch(j + kThreads);
  }
}

// ---- launchers ---------------------------------------------------------------------------------------

// Calls f(std::integral_constant<int, V>, std::bool_constant<relu>) for the run-time choice.
template <class F>
void with_vec_relu(bool vec, bool relu, const F& f) {
  using V4 = std::integral_constant<int, 4>;
  using V1 = std::integral_constant<int, 1>;
  if (vec)
    relu ? f(V4{}, std::true_type{}) : f(V4{}, std::false_type{});
  else
    relu ? f(V1{}, std::true_type{}) : f(V1{}, std::false_type{});
}

dim3 grid_of(const Geometry& g, Layout layout) {
  const int64_t x = layout == Layout::nchw ? g.C : g.groups;
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(g.chunks));
}

dim3 finalize_grid(const Geometry& g) {
  return dim3(static_cast<unsigned>(div_up<int64_t>(g.C, kFinalizeChannels)));
}

// The backward's finalize over the partials laid out as g (writes dgamma/dbeta, and the dx parameters).
void launch_finalize_backward(const Exec& exec, const profile::OpCost& cost, const Geometry& g, const BackwardArgs& b) {
  launch(exec, "batchnorm_backward_finalize", cost, finalize_backward_kernel, finalize_grid(g),
         dim3(kFinalizeThreads), 0, g, b);
}

// The pooled outputs and the cells are chunked as the full-resolution statistics pass (plan_chunks(s,
// kMinElemsPerBlockPooled) chunks per channel, or fewer), so every block reads about the same share of x and the backward's partials fit the
// workspace.
PoolGeometry make_pool_geometry(const BatchNormShape& s, const BatchNormPool& pool) {
  PoolGeometry pg;
  pg.h = pool.h, pg.w = pool.w, pg.window = pool.window, pg.p = pool.p(), pg.q = pool.q();
  pg.ch = static_cast<int>(div_up<int64_t>(pool.h, pool.window)), pg.cw = static_cast<int>(div_up<int64_t>(pool.w, pool.window));
  pg.extent = s.n * pg.p * pg.q;
  pg.cell_extent = s.n * pg.ch * pg.cw;
  NT_CHECK(s.n * s.hw < (int64_t(1) << 31) && s.c < (int64_t(1) << 31), "batchnorm_pool: n·h·w = ", s.n * s.hw,
           " exceeds the kernels' 32-bit index range");
  const int64_t planned = plan_chunks(s, kMinElemsPerBlockPooled);
  pg.chunk = div_up<int64_t>(pg.extent, planned);
  pg.chunks = static_cast<int>(div_up<int64_t>(pg.extent, pg.chunk));
  pg.cell_chunk = div_up<int64_t>(pg.cell_extent, planned);
  pg.cell_chunks = static_cast<int>(div_up<int64_t>(pg.cell_extent, pg.cell_chunk));
  pg.parts.C = s.c, pg.parts.chunks = pg.chunks;
  pg.by_pq = FastDivmod(pg.p * pg.q), pg.by_q = FastDivmod(pg.q);
  pg.by_cells = FastDivmod(pg.ch * pg.cw), pg.by_cw = FastDivmod(pg.cw);
  return pg;
}

dim3 pool_grid(const PoolGeometry& pg) {
  return dim3(static_cast<unsigned>(pg.parts.C), static_cast<unsigned>(pg.chunks));
}
dim3 cell_grid(const PoolGeometry& pg) {
  return dim3(static_cast<unsigned>(pg.parts.C), static_cast<unsigned>(pg.cell_chunks));
}

// Calls f(std::bool_constant<relu>, std::integral_constant<int, 2 or 0 (any window)>, std::bool_constant<pairs>)
// for the run-time choice; pairs only with window 2.
template <class F>
void with_relu_window(bool relu, int window, bool pairs, const F& f) {
  auto go = [&](auto w, auto p) { relu ? f(std::true_type{}, w, p) : f(std::false_type{}, w, p); };
  using W2 = std::integral_constant<int, 2>;
  using W0 = std::integral_constant<int, 0>;
  if (window == 2 && pairs) go(W2{}, std::true_type{});
  else if (window == 2) go(W2{}, std::false_type{});
  else go(W0{}, std::false_type{});
}

bool aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

// The pooled forward (kTrain) or evaluation launch, window rows as 8-byte pairs where w is even and x aligned.
template <bool kTrain>
void launch_pool_forward(const Exec& exec, const char* name, const profile::OpCost& cost, const Geometry& g,
                         const PoolGeometry& pg, const ForwardArgs& a, bool relu, int32_t* argmax) {
  with_relu_window(relu, pg.window, pg.w % 2 == 0 && aligned8(a.x), [&](auto r, auto window, auto pairs) {
    launch(exec, name, cost,
           nchw_pool_forward_kernel<kTrain, decltype(r)::value, decltype(window)::value, decltype(pairs)::value>,
           pool_grid(pg), dim3(kThreads), 0, g, pg, a, argmax);
  });
}

}  // namespace

size_t batchnorm_workspace_floats(const BatchNormShape& s) {
  if (s.c <= 0 || s.n * s.hw <= 0) return 0;
  return static_cast<size_t>(3 * plan_chunks(s) * s.c + 4 * s.c);
}

void batchnorm_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const float* x,
                             const float* gamma, const float* beta, float* y, float* save_mean, float* save_invstd,
                             float* running_mean, float* running_var, int64_t* num_batches_tracked,
                             float* workspace) {
  const int64_t count = s.n * s.hw;
  if (count == 1)
    throw Error(cat("batchnorm_forward_train: expected more than 1 value per channel when training, got n=", s.n,
                    " hw=", s.hw));
  if (s.c == 0 || count == 0) return;
  NT_CHECK(workspace != nullptr, "batchnorm_forward_train needs batchnorm_workspace_floats() of workspace");
  const Layout layout = effective_layout(s);
  const bool vec = (layout == Layout::nchw ? s.hw % 4 == 0 : s.c % 4 == 0) && aligned16(x) && aligned16(y);
  const Geometry g = make_geometry(s, layout, vec ? 4 : 1);
  const ForwardArgs a{x,           gamma,       beta,
                      y,           workspace,   save_mean,
                      save_invstd, running_mean, running_var,
                      num_batches_tracked, nullptr, nullptr,
                      static_cast<float>(h.eps), static_cast<float>(h.momentum), static_cast<float>(count),
                      static_cast<float>(count - 1)};
  const double elems = double(count) * double(s.c);
  const profile::OpCost stats_cost{elems * 4, elems * 3};
  const profile::OpCost apply_cost{elems * 8, elems * 3};
  const profile::OpCost finalize_cost{double(g.chunks) * double(s.c) * 12, double(g.chunks) * double(s.c) * 10};
  with_vec_relu(vec, h.relu, [&](auto v, auto relu) {
    constexpr int V = decltype(v)::value;
    constexpr bool kRelu = decltype(relu)::value;
    if (layout == Layout::nchw) {
      launch(exec, "batchnorm_stats_nchw", stats_cost, nchw_stats_kernel<V>, grid_of(g, layout), dim3(kThreads), 0,
             g, x, workspace);
      launch(exec, "batchnorm_forward_nchw", apply_cost, nchw_forward_apply_kernel<V, true, kRelu>,
             grid_of(g, layout), dim3(kThreads), 0, g, a);
    } else {
      launch(exec, "batchnorm_stats_nhwc", stats_cost, nhwc_stats_kernel<V>, grid_of(g, layout), dim3(kThreads), 0,
             g, x, workspace);
      launch(exec, "batchnorm_finalize", finalize_cost, finalize_forward_kernel, finalize_grid(g),
             dim3(kFinalizeThreads), 0, g, a);
      launch(exec, "batchnorm_forward_nhwc", apply_cost, nhwc_forward_apply_kernel<V, true, kRelu>,
             grid_of(g, layout), dim3(kThreads), 0, g, a);
    }
  });
}

void batchnorm_forward_eval(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const float* x,
                            const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, float* y) {
  const int64_t count = s.n * s.hw;
  if (s.c == 0 || count == 0) return;
  const Layout layout = effective_layout(s);
  const bool vec = (layout == Layout::nchw ? s.hw % 4 == 0 : s.c % 4 == 0) && aligned16(x) && aligned16(y);
  const Geometry g = make_geometry(s, layout, vec ? 4 : 1);
  const ForwardArgs a{x,       gamma,   beta,         y,           nullptr,      nullptr, nullptr, nullptr,
                      nullptr, nullptr, running_mean, running_var, static_cast<float>(h.eps), 0.f, 0.f, 0.f};
  const double elems = double(count) * double(s.c);
  const profile::OpCost cost{elems * 8, elems * 3};
  with_vec_relu(vec, h.relu, [&](auto v, auto relu) {
    constexpr int V = decltype(v)::value;
    constexpr bool kRelu = decltype(relu)::value;
    if (layout == Layout::nchw)
      launch(exec, "batchnorm_eval_nchw", cost, nchw_forward_apply_kernel<V, false, kRelu>, grid_of(g, layout),
             dim3(kThreads), 0, g, a);
    else
      launch(exec, "batchnorm_eval_nhwc", cost, nhwc_forward_apply_kernel<V, false, kRelu>, grid_of(g, layout),
             dim3(kThreads), 0, g, a);
  });
}

void batchnorm_backward(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const float* x,
                        const float* y, const float* dy, const float* gamma, const float* save_mean,
                        const float* save_invstd, float* dx, float* dgamma, float* dbeta, float* workspace) {
  const int64_t count = s.n * s.hw;
  if (s.c == 0 || count == 0 || (!dx && !dgamma && !dbeta)) return;
  NT_CHECK(workspace != nullptr, "batchnorm_backward needs batchnorm_workspace_floats() of workspace");
  NT_CHECK(!h.relu || y != nullptr, "batchnorm_backward with relu needs the forward output y");
  const Layout layout = effective_layout(s);
  const bool vec = (layout == Layout::nchw ? s.hw % 4 == 0 : s.c % 4 == 0) && aligned16(x) && aligned16(dy) &&
                   aligned16(dx) && (!h.relu || aligned16(y));
  const Geometry g = make_geometry(s, layout, vec ? 4 : 1);
  const BackwardArgs b{x, h.relu ? y : nullptr, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, workspace,
                       static_cast<float>(count)};
  const double elems = double(count) * double(s.c);
  const double reads = h.relu ? 3 : 2;
  const profile::OpCost reduce_cost{elems * 4 * reads, elems * 4};
  const profile::OpCost apply_cost{elems * 4 * (reads + 1), elems * 5};
  const profile::OpCost finalize_cost{double(g.chunks) * double(s.c) * 8, double(g.chunks) * double(s.c) * 2};
  with_vec_relu(vec, h.relu, [&](auto v, auto relu) {
    constexpr int V = decltype(v)::value;
    constexpr bool kRelu = decltype(relu)::value;
    if (layout == Layout::nchw) {
      launch(exec, "batchnorm_backward_reduce_nchw", reduce_cost, nchw_backward_reduce_kernel<V, kRelu>,
             grid_of(g, layout), dim3(kThreads), 0, g, b);
      if (dx)
        launch(exec, "batchnorm_backward_nchw", apply_cost, nchw_backward_apply_kernel<V, kRelu>, grid_of(g, layout),
               dim3(kThreads), 0, g, b);
      else
        launch_finalize_backward(exec, finalize_cost, g, b);
    } else {
      launch(exec, "batchnorm_backward_reduce_nhwc", reduce_cost, nhwc_backward_reduce_kernel<V, kRelu>,
             grid_of(g, layout), dim3(kThreads), 0, g, b);
      launch_finalize_backward(exec, finalize_cost, g, b);
      if (dx)
        launch(exec, "batchnorm_backward_nhwc", apply_cost, nhwc_backward_apply_kernel<V, kRelu>, grid_of(g, layout),
               dim3(kThreads), 0, g, b);
    }
  });
}

}  // namespace nt::kernels::cuda

// ---- fused max-pool ----------------------------------------------------------------------------------------

namespace nt::kernels::cuda {

size_t batchnorm_pool_workspace_floats(const BatchNormShape& s, const BatchNormPool& pool) {
  check_batchnorm_pool(s, pool);
  if (s.c <= 0 || s.n * s.hw <= 0) return 0;
  return static_cast<size_t>(3 * plan_chunks(s, kMinElemsPerBlockPooled) * s.c);  // the statistics' partials
}

void batchnorm_pool_forward_train(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                                  const BatchNormHyper& h, const float* x, const float* gamma, const float* beta,
                                  float* y, int32_t* argmax, float* save_mean, float* save_invstd, float* running_mean,
                                  float* running_var, int64_t* num_batches_tracked, float* workspace) {
  check_batchnorm_pool(s, pool);
  const int64_t count = s.n * s.hw;
  if (count == 1)
    throw Error(cat("batchnorm_pool_forward_train: expected more than 1 value per channel when training, got n=", s.n,
                    " hw=", s.hw));
  if (s.c == 0 || count == 0) return;
  NT_CHECK(workspace != nullptr, "batchnorm_pool_forward_train needs batchnorm_pool_workspace_floats() of workspace");
  const bool vec = s.hw % 4 == 0 && aligned16(x);
  const Geometry g = make_geometry(s, Layout::nchw, vec ? 4 : 1, kMinElemsPerBlockPooled);
  const PoolGeometry pg = make_pool_geometry(s, pool);
  const ForwardArgs a{x,           gamma,       beta,
                      y,           workspace,   save_mean,
                      save_invstd, running_mean, running_var,
                      num_batches_tracked, nullptr, nullptr,
                      static_cast<float>(h.eps), static_cast<float>(h.momentum), static_cast<float>(count),
                      static_cast<float>(count - 1)};
  const double elems = double(count) * double(s.c), pooled = double(pg.extent) * double(s.c);
  const profile::OpCost stats_cost{elems * 4, elems * 3};
  const profile::OpCost apply_cost{elems * 4 + pooled * 8, elems * 4};
  if (vec)
    launch(exec, "batchnorm_stats_nchw", stats_cost, nchw_stats_kernel<4>, grid_of(g, Layout::nchw), dim3(kThreads), 0,
           g, x, workspace);
  else
    launch(exec, "batchnorm_stats_nchw", stats_cost, nchw_stats_kernel<1>, grid_of(g, Layout::nchw), dim3(kThreads), 0,
           g, x, workspace);
  launch_pool_forward<true>(exec, "batchnorm_pool_forward_nchw", apply_cost, g, pg, a, h.relu, argmax);
}

void batchnorm_pool_forward_eval(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                                 const BatchNormHyper& h, const float* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, float* y, int32_t* argmax,
                                 float*) {
  check_batchnorm_pool(s, pool);
  if (s.c == 0 || s.n * s.hw == 0) return;
  const PoolGeometry pg = make_pool_geometry(s, pool);
  const ForwardArgs a{x,       gamma,   beta,         y,           nullptr,      nullptr, nullptr, nullptr,
                      nullptr, nullptr, running_mean, running_var, static_cast<float>(h.eps), 0.f, 0.f, 0.f};
  const double elems = double(s.n * s.hw) * double(s.c), pooled = double(pg.extent) * double(s.c);
  const profile::OpCost cost{elems * 4 + pooled * 8, elems * 4};
  // Only the channel count of the geometry is read: the parameters come from running_*.
  launch_pool_forward<false>(exec, "batchnorm_pool_eval_nchw", cost, pg.parts, pg, a, h.relu, argmax);
}

void batchnorm_pool_backward(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                             const BatchNormHyper& h, const float* x, const float* y, const float* dy,
                             const int32_t* argmax, const float* gamma, const float* save_mean,
                             const float* save_invstd, float* dx, float* dgamma, float* dbeta, float* workspace) {
  check_batchnorm_pool(s, pool);
  const int64_t count = s.n * s.hw;
  if (s.c == 0 || count == 0 || (!dx && !dgamma && !dbeta)) return;
  NT_CHECK(workspace != nullptr, "batchnorm_pool_backward needs batchnorm_pool_workspace_floats() of workspace");
  NT_CHECK(!h.relu || y != nullptr, "batchnorm_pool_backward with relu needs the pooled forward output y");
  NT_CHECK(argmax != nullptr, "batchnorm_pool_backward needs the forward's argmax");
  const PoolGeometry pg = make_pool_geometry(s, pool);
  const BackwardArgs b{x, h.relu ? y : nullptr, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, workspace,
                       static_cast<float>(count)};
  const double elems = double(count) * double(s.c), pooled = double(pg.extent) * double(s.c);
  const double pooled_reads = h.relu ? 3 : 2;  // dy, argmax (and y) per pooled output
  const profile::OpCost reduce_cost{pooled * 4 * (pooled_reads + 1), pooled * 3};
  const profile::OpCost apply_cost{elems * 8 + pooled * 4 * pooled_reads, elems * 5};
  const profile::OpCost finalize_cost{double(pg.chunks) * double(s.c) * 8, double(pg.chunks) * double(s.c) * 2};
  const bool pairs = pool.w % 2 == 0 && aligned8(x) && aligned8(dx);
  with_relu_window(h.relu, pool.window, pairs, [&](auto relu, auto window, auto pairs_choice) {
    constexpr bool kRelu = decltype(relu)::value;
    launch(exec, "batchnorm_pool_backward_reduce_nchw", reduce_cost, nchw_pool_backward_reduce_kernel<kRelu>,
           pool_grid(pg), dim3(kThreads), 0, pg, b, argmax);
    if (dx)
      launch(exec, "batchnorm_pool_backward_nchw", apply_cost,
             nchw_pool_backward_apply_kernel<kRelu, decltype(window)::value, decltype(pairs_choice)::value>,
             cell_grid(pg), dim3(kThreads), 0, pg, b, argmax);
    else
      launch_finalize_backward(exec, finalize_cost, pg.parts, b);
  });
}

}  // namespace nt::kernels::cuda

// ---- fused convolution stem (NCHW) -------------------------------------------------------------------------
// The pooled BatchNorm whose input is conv2d_forward(x, w) of a first layer with few taps, never written: each
// kernel recomputes a value from x's C·R·S taps where the pooled kernels above would read it. Block (g, p) serves
// channels [g·Kb, (g+1)·Kb) (Kb = stem_channels: 4 for up to 9 taps, else 1) over images [p·I, (p+1)·I)
// (StemGeometry): it stages those images of x in shared memory, zero-padded (and rounded to TF32 under
// Exec::tf32, as the direct convolution rounds its operands), keeps its channels' filters in registers, and
// for each conv output position loads the taps once and runs Kb dot products on them. Each sum is the direct
// forward kernel's chain (conv.cu: fmaf over taps t = (c·R + r)·S + s ascending, from 0).
//
// Patch moments. Let v be the T = C·R·S taps of one output position (padding included as zeros), so channel
// k's conv value there is w_k·v. Every sum over all count = n·P·Q positions that the BatchNorm needs, other than
// those at the argmax positions, is a moment of v, the same for every channel:
//   mean_k = w_k·X / count            X_t = Σ v_t
//   M2_k   = w_k^T Cm w_k             Cm_tu = Σ (v_t - v̄_t)(v_u - v̄_u)
//   dw_k,t = Σ dconv·v_t = k1·(P_t - mdy·X_t - a·((Cm w_k)_t + (mean_k - center)·X_t))
// with dconv = k1·(dy' - mdy - (conv - center)·a) (dx_of) and P_t = Σ dy'·v_t, which runs over the argmax
// positions only (dy' is 0 at every other position). So the statistics cost T + T(T+1)/2 moments per position
// instead of K dot products, and the weight gradient needs no pass over all positions at all: the backward's
// reduce adds P_t beside S1 and S2 at the argmax positions, and a small kernel applies the formula (in double).
// The moments are sums of v - K with K = x's first value (inside the data: a large mean does not swamp the
// spread), kept per chunk of images in double: s_t = Σ (v_t - K), s_tu = Σ (v_t - K)(v_u - K), from which
// X_t = s_t + count·K and Cm_tu = s_tu - s_t·s_u / count.
// With TF32 the taps and filters are the rounded ones, as in every other pass; dconv itself is not rounded
// (the direct weight-gradient kernel rounds it as an operand): the formula never forms the products.
//
// Launches:
//   forward_train  stem_moments (a block per image group: the group's moments, kept in the workspace for the
//                  backward, and from them each channel's (mean, M2) partial in the pooled statistics'
//                  [field][k][p] layout) → stem_pool (normalize each window, write its maximum and argmax);
//                  forward_eval: stem_pool alone.
//   backward       stem_pool_backward_reduce (S1, S2 and P_t over the pooled outputs: one value at each argmax)
//                  → stem_weight (a warp per channel: dgamma, dbeta and dw from the sums and the moments).
// Unfused, the conv's output (4·n·K·P·Q bytes) is written once and read three times; here only x (n·C·H·W
// floats) is read, from L2, once per channel group. Deterministic: fixed orders, no atomics.
namespace nt::kernels::cuda {

namespace {

constexpr int kStemStageFloats = kConvBatchNormPoolMaxImage;  // a block's staged images, at most (32 KB)

// Channels per block: a position's taps, loaded once, serve Kb dot products. With many taps one: the filters,
// the taps and (backward) the dw sums of Kb channels would not fit the registers.
constexpr int stem_channels(int taps) { return taps <= 9 ? 4 : 1; }

struct StemConv {
  const float* x;        // (n, C, H, W)
  const float* filters;  // (K, C·R·S)
  int channels, in_h, in_w, r, s, stride, pad, taps;
  int padded_h, padded_w;  // H + 2·pad, W + 2·pad: a staged plane
  FastDivmod by_in_plane, by_in_w;  // x's H·W and W: element -> (image·C + c, h, w)
  bool tf32;
};

struct StemGeometry {
  Geometry parts;      // C = K and chunks = image groups: the layout of the statistics' and backward sums' partials
  int images = 0;      // n
  int per_block = 1;   // I: images per block
  int p = 0, q = 0;    // the conv's output plane
  int window = 1, pooled_p = 0, pooled_q = 0;  // MaxPool2d(window, stride window): (P/window, Q/window)
  int cell_p = 0, cell_q = 0;                  // cells per plane: ceil(P/window) x ceil(Q/window)
  FastDivmod by_plane, by_q, by_pooled, by_pooled_q, by_cells, by_cell_q;
  __device__ int block_images(int chunk) const { return min(per_block, images - chunk * per_block); }
  // Pooled output (image, ij) of channel k in a block of chunk `chunk`: its index in y / dy / argmax.
  __device__ int64_t pooled_at(int chunk, int image, int64_t k, int ij) const {
    return (int64_t(chunk * per_block + image) * parts.C + k) * (int64_t(pooled_p) * pooled_q) + ij;
  }
};

// Every thread of the block: the block's images of x into `staged` ([image][c][padded_h][padded_w], zeros in the
// padding), rounded to TF32 with tf32. First the whole area is zeroed, then x's values (consecutive, so the loads
// coalesce; kUnroll in flight per thread) land inside it. The caller synchronizes.
__device__ void stage_images(const StemConv& cv, int first_image, int images, float* staged) {
  const int padded_plane = cv.padded_h * cv.padded_w, area = images * cv.channels * padded_plane;
  for (int i = threadIdx.x; i < area; i += kThreads) staged[i] = 0.f;
  __syncthreads();
  const int count = images * cv.channels * cv.in_h * cv.in_w;
  const float* x = cv.x + int64_t(first_image) * cv.channels * cv.in_h * cv.in_w;
  for (int i0 = threadIdx.x; i0 < count; i0 += kUnroll * kThreads) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = i0 + u * kThreads < count ? __ldg(x + i0 + u * kThreads) : 0.f;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * kThreads;
      if (i >= count) break;
      int plane, e, h, w;
      cv.by_in_plane.divmod(i, plane, e);
      cv.by_in_w.divmod(e, h, w);
      staged[plane * padded_plane + (h + cv.pad) * cv.padded_w + w + cv.pad] = cv.tf32 ? round_to_tf32(v[u]) : v[u];
    }
  }
}

// Taps: C·R·S exactly, or kConvBatchNormPoolMaxTaps with a guard for any smaller count.
template <int Taps>
__device__ __forceinline__ bool tap_in_use(int t, int taps) {
  return Taps != kConvBatchNormPoolMaxTaps || t < taps;
}

// The block's channels' filters (TF32 with tf32; 0 past K) and each tap's offset in a staged image: loaded once
// per block into shared memory (fill_filters), then copied into every thread's registers; each thread loading
// and rounding its own copy took about 700 instructions, as many as its share of the work.
template <int Taps>
struct StemFilters {
  static constexpr int kChannels = stem_channels(Taps);
  float weight[kChannels][Taps];
  int offset[Taps];  // c·padded_h·padded_w + r·padded_w + s
};

// Every thread of the block: the filters into `table` (threads i < Kb·Taps load one weight each, threads t < taps
// one offset each), then, after the caller's barrier, each thread copies the table into its registers.
template <int Taps>
__device__ __forceinline__ void fill_filters(const StemConv& cv, int64_t k0, int64_t K, StemFilters<Taps>& table) {
  constexpr int Kb = StemFilters<Taps>::kChannels;
  for (int i = threadIdx.x; i < Kb * Taps; i += kThreads) {
    const int j = i / Taps, t = i % Taps;
    const float v = tap_in_use<Taps>(t, cv.taps) && k0 + j < K ? __ldg(cv.filters + (k0 + j) * cv.taps + t) : 0.f;
    table.weight[j][t] = cv.tf32 ? round_to_tf32(v) : v;
  }
  for (int t = threadIdx.x; t < Taps; t += kThreads) {
    const int rs = cv.r * cv.s, c = t / rs, r = t % rs / cv.s, s = t % cv.s;
    table.offset[t] = tap_in_use<Taps>(t, cv.taps) ? (c * cv.padded_h + r) * cv.padded_w + s : 0;
  }
}

// The taps of output (oh, ow) of staged image `image`.
template <int Taps>
__device__ __forceinline__ void load_taps(const StemConv& cv, const float* staged, const StemFilters<Taps>& f,
                                          int image, int oh, int ow, float (&v)[Taps]) {
  const float* corner = staged + (image * cv.channels * cv.padded_h + oh * cv.stride) * cv.padded_w + ow * cv.stride;
#pragma unroll
  for (int t = 0; t < Taps; ++t) v[t] = tap_in_use<Taps>(t, cv.taps) ? corner[f.offset[t]] : 0.f;
}

// The block's channel j's conv value from the taps v.
template <int Taps>
__device__ __forceinline__ float dot(const StemFilters<Taps>& f, int j, const float (&v)[Taps]) {
  float acc = 0.f;
#pragma unroll
  for (int t = 0; t < Taps; ++t) acc = fmaf(f.weight[j][t], v[t], acc);
  return acc;
}

// The block's staged images (dynamic shared memory), its channels' filters, and its share of the work.
template <int Taps>
struct StemBlock {
  static constexpr int kChannels = stem_channels(Taps);
  float* staged;
  StemFilters<Taps> filters;
  int64_t k0;  // the first channel
  int chunk, images;
  __device__ bool has(int j, int64_t K) const { return k0 + j < K; }
};

// Every thread of the block, first thing: stages the images and the filters. kEarly: x and w come from kernels
// before this one's predecessor, which had completed when the predecessor passed its own wait and let this
// kernel launch (kernels/cuda/launch.cuh), so the staging overlaps the predecessor's tail and the wait comes
// after it; else (x written by the predecessor: the batch gather before the statistics and the evaluation)
// the wait comes first.
template <int Taps, bool kEarly>
__device__ __forceinline__ StemBlock<Taps> enter_stem_block(const StemConv& cv, const StemGeometry& sg) {
  extern __shared__ float stem_staged[];
  __shared__ StemFilters<Taps> table;
  if constexpr (!kEarly) begin_dependent_kernel();
  StemBlock<Taps> b;
  b.staged = stem_staged;
  b.k0 = int64_t(blockIdx.x) * b.kChannels;
  b.chunk = static_cast<int>(blockIdx.y);
  b.images = sg.block_images(b.chunk);
  fill_filters(cv, b.k0, sg.parts.C, table);
  stage_images(cv, b.chunk * sg.per_block, b.images, b.staged);
  __syncthreads();
  if constexpr (kEarly) begin_dependent_kernel();
  b.filters = table;
  return b;
}

// Warp j < Kb runs finalize(channel k0 + j) (a whole-warp call; lane 0's result counts); every thread of the
// block gets all Kb results. Every thread calls it.
template <int Kb, class Params, class Finalize>
__device__ __forceinline__ void from_warps(int64_t k0, int64_t K, Params (&out)[Kb], const Finalize& finalize) {
  __shared__ Params shared[Kb];
  const int warp = threadIdx.x / kWarpSize;
  if (warp < Kb && k0 + warp < K) {
    const Params r = finalize(k0 + warp);
    if (threadIdx.x % kWarpSize == 0) shared[warp] = r;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < Kb; ++j) out[j] = shared[j];
}

// ---- patch moments

// Entries of one position's moments: the T taps, then the products of taps (t, u), t <= u, row by row.
__host__ __device__ constexpr int moment_entries(int taps) { return taps + taps * (taps + 1) / 2; }
__host__ __device__ constexpr int product_entry(int t, int u, int taps) {  // t <= u
  return taps + t * taps - t * (t - 1) / 2 + (u - t);
}
constexpr int kMomentTile = 64;  // entries a thread sums at once (registers)

// Calls f(e, t, u) for every entry e of the tile [E0, E0 + kMomentTile): u < 0 for the tap t itself. Unrolled, so
// e, t and u are constants and a thread's taps and sums stay in registers.
template <int Taps, int E0, class F>
__device__ __forceinline__ void for_tile_entries(const F& f) {
#pragma unroll
  for (int t = 0; t < Taps; ++t)
    if (t >= E0 && t < E0 + kMomentTile) f(t - E0, t, -1);
#pragma unroll
  for (int t = 0; t < Taps; ++t)
#pragma unroll
    for (int u = t; u < Taps; ++u) {
      const int e = product_entry(t, u, Taps);
      if (e >= E0 && e < E0 + kMomentTile) f(e - E0, t, u);
    }
}

// f(std::integral_constant<int, E0>) for the tiles E0 = 0, kMomentTile, ... in order.
template <class F, int... I>
__device__ __forceinline__ void each_tile(const F& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I * kMomentTile>{}), ...);
}

// The shift K of the moments: x's first value, rounded as the staged taps are.
__device__ __forceinline__ float moment_shift(const StemConv& cv) {
  const float k = __ldg(cv.x);
  return cv.tf32 ? round_to_tf32(k) : k;
}

// Lane l ends with Σ over the warp's 32 lanes of v[l]: at each step a lane keeps one half of its values and
// trades the other half with the lane `half` away, so 31 shuffles sum 32 values (a shuffle-down tree per value
// takes 5 each). A fixed pairing, and a + b == b + a: the same bits every run.
// (One template level per step: every index a constant, so v stays in registers.)
template <int Half = kWarpSize / 2>
__device__ __forceinline__ float warp_transpose_sum(float (&v)[kWarpSize]) {
  const bool upper = threadIdx.x & Half;
#pragma unroll
  for (int i = 0; i < Half; ++i) {
    const float keep = upper ? v[i + Half] : v[i], give = upper ? v[i] : v[i + Half];
    v[i] = keep + __shfl_xor_sync(kFullMask, give, Half);
  }
  if constexpr (Half > 1) return warp_transpose_sum<Half / 2>(v);
  else return v[0];
}

// Every thread of the block passes its V values; totals[i] (shared memory, i < V) gets the block's sum of value i:
// warp_transpose_sum per 32 values, then the warps' sums in warp order, in double. Every thread calls it; totals
// is ready when it returns.
template <int V>
__device__ void block_sums(const float (&values)[V], double* totals) {
  constexpr int kGroups = (V + kWarpSize - 1) / kWarpSize;
  __shared__ float per_warp[kWarps][kGroups * kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    float v[kWarpSize];
#pragma unroll
    for (int i = 0; i < kWarpSize; ++i) v[i] = g * kWarpSize + i < V ? values[g * kWarpSize + i] : 0.f;
    per_warp[warp][g * kWarpSize + lane] = warp_transpose_sum(v);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < V; i += kThreads) {
    double sum = 0;
    for (int w = 0; w < kWarps; ++w) sum += per_warp[w][i];
    totals[i] = sum;
  }
  __syncthreads();
}

__device__ __forceinline__ double warp_sum_all(double v) {  // every lane gets the sum, the same bits
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Σ_p part[p·stride] for p < count, in p order (double), every load of a batch of kInFlight issued first.
template <int kInFlight, class T>
__device__ __forceinline__ double sum_in_order(const T* part, int64_t stride, int count) {
  double sum = 0;
  for (int p0 = 0; p0 < count; p0 += kInFlight) {
    T v[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) v[i] = p0 + i < count ? part[(p0 + i) * stride] : T(0);
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) sum += v[i];
  }
  return sum;
}

// Every thread of the block: the product entries of the shifted sums s (over `count` positions, entries numbered
// for Taps) become centred comoments, Cm_tu = s_tu - s_t·s_u / count, in place; the tap entries stay the shifted
// sums. Synchronizes before and after.
template <int Taps>
__device__ void centre_moments(double* s, double count) {
  __syncthreads();
  const double inv = 1.0 / count;
  for (int q = threadIdx.x; q < Taps * (Taps + 1) / 2; q += kThreads) {
    int t = 0, row = Taps;  // q -> (t, u): row t holds Taps - t products
    for (int left = q; left >= row; left -= row, --row) ++t;
    const int u = t + (Taps + q - product_entry(t, t, Taps));
    s[Taps + q] -= s[t] * s[u] * inv;
  }
  __syncthreads();
}

// Every thread of the block: s[e] = Σ_p moments[p·E + e] over the chunks (double), centred. The chunks split into
// kParts runs, a thread per (run, entry) adding its run in order, then the runs in order: one round trip to L2
// with 8 loads in flight per thread (a thread per entry holding all 32 chunks' doubles took 20 more registers,
// which stem_pool's blocks cannot spare).
template <int Taps>
__device__ void total_moments(const double* moments, int chunks, double count, double* s) {
  constexpr int E = moment_entries(Taps), kParts = E >= kThreads ? 1 : kThreads / E;
  __shared__ double runs[kParts][E];
  const int per = div_up(chunks, kParts);
  for (int i = threadIdx.x; i < kParts * E; i += kThreads) {
    const int h = i / E, e = i % E, first = min(chunks, h * per);
    runs[h][e] = sum_in_order<8>(moments + int64_t(first) * E + e, E, min(chunks, first + per) - first);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += kThreads) {
    double sum = 0;
    for (int h = 0; h < kParts; ++h) sum += runs[h][e];
    s[e] = sum;
  }
  centre_moments<Taps>(s, count);
}

// Channel k's filter as the convolution uses it (TF32 with tf32), 0 past taps.
template <int Taps>
__device__ __forceinline__ void load_filter(const StemConv& cv, int64_t k, float (&w)[Taps]) {
#pragma unroll
  for (int t = 0; t < Taps; ++t) {
    const float v = tap_in_use<Taps>(t, cv.taps) ? __ldg(cv.filters + k * cv.taps + t) : 0.f;
    w[t] = cv.tf32 ? round_to_tf32(v) : v;
  }
}

// (Cm w)_t from centred moments s (centre_moments), for a filter w: a row of the comoments times w.
template <int Taps>
__device__ __forceinline__ double comoment_row(const double* s, const float (&w)[Taps], int t) {
  double row = 0;
#pragma unroll
  for (int u = 0; u < Taps; ++u) row += double(w[u]) * s[product_entry(min(t, u), max(t, u), Taps)];
  return row;
}

// The exact mean w·X / count of the conv values, from the shifted tap sums s_t: K·Σw + Σ w_t·s_t / count.
template <int Taps>
__device__ __forceinline__ double conv_mean(const double* s, const float (&w)[Taps], double shift, double count) {
  double ws = 0, wsum = 0;
#pragma unroll
  for (int t = 0; t < Taps; ++t) ws += double(w[t]) * s[t], wsum += w[t];
  return shift * wsum + ws / count;
}

// grid (1, chunks): block p sums its images' moments (entries numbered for the compiled Taps: the taps past
// cv.taps are 0) and stores them in double at moments[p·E + e]. It stages images like every stem kernel
// (enter_stem_block); of the filter table it uses the tap offsets.
template <int Taps>
__global__ void __launch_bounds__(kThreads) stem_moments_kernel(const StemGeometry sg, const StemConv cv,
                                                                double* __restrict__ moments) {
  const StemBlock<Taps> b = enter_stem_block<Taps, false>(cv, sg);  // x: the gather just before
  constexpr int E = moment_entries(Taps), kTiles = (E + kMomentTile - 1) / kMomentTile;
  __shared__ double s[kTiles * kMomentTile];
  const float shift = moment_shift(cv);
  const int positions = b.images * sg.p * sg.q;
  auto tile = [&](auto e0) {
    constexpr int E0 = decltype(e0)::value;
    float acc[kMomentTile];
#pragma unroll
    for (int i = 0; i < kMomentTile; ++i) acc[i] = 0.f;
    for (int j = threadIdx.x; j < positions; j += kThreads) {
      int image, at, oh, ow;
      sg.by_plane.divmod(j, image, at);
      sg.by_q.divmod(at, oh, ow);
      float v[Taps];
      load_taps(cv, b.staged, b.filters, image, oh, ow, v);
#pragma unroll
      for (int t = 0; t < Taps; ++t) v[t] = tap_in_use<Taps>(t, cv.taps) ? v[t] - shift : 0.f;
      for_tile_entries<Taps, E0>([&](int i, int t, int u) { acc[i] = u < 0 ? acc[i] + v[t] : fmaf(v[t], v[u], acc[i]); });
    }
    block_sums(acc, s + E0);
  };
  each_tile(tile, std::make_integer_sequence<int, kTiles>{});
  for (int e = threadIdx.x; e < E; e += kThreads) moments[int64_t(b.chunk) * E + e] = s[e];
}

// Every thread of the block (a training stem_pool block): its channels' parameters from the batch's moments,
// and blocks of chunk 0 store save_*, running_* (forward_params). Warp j < Kb serves channel k0 + j, lane t tap t,
// with the filter in shared memory: the block's registers hold its filters for the pass that follows (100 or so
// per thread, and two blocks of 256 threads per SM need at most 128).
template <int Taps>
__device__ void stem_forward_params(const StemGeometry& sg, const ForwardArgs& a, const StemConv& cv,
                                    const StemBlock<Taps>& b, const double* moments,
                                    FwdParams (&out)[StemBlock<Taps>::kChannels]) {
  constexpr int Kb = StemBlock<Taps>::kChannels;
  __shared__ double s[moment_entries(Taps)];
  __shared__ float w[Kb][Taps];
  __shared__ FwdParams shared[Kb];
  for (int i = threadIdx.x; i < Kb * Taps; i += kThreads) {
    const int j = i / Taps, t = i % Taps;
    float v = b.has(j, sg.parts.C) && t < cv.taps ? __ldg(cv.filters + (b.k0 + j) * cv.taps + t) : 0.f;
    w[j][t] = cv.tf32 ? round_to_tf32(v) : v;
  }
  total_moments<Taps>(moments, sg.parts.chunks, a.count, s);  // its barriers also publish w
  const int j = threadIdx.x / kWarpSize, t = threadIdx.x % kWarpSize;
  if (j < Kb && b.has(j, sg.parts.C)) {
    double row = 0;  // (Cm w)_t
    for (int u = 0; u < cv.taps; ++u)
      if (t < cv.taps) row += double(w[j][u]) * s[product_entry(min(t, u), max(t, u), Taps)];
    const double w_t = t < cv.taps ? w[j][t] : 0.f;
    const double m2 = warp_sum_all(w_t * row), ws = warp_sum_all(w_t * (t < cv.taps ? s[t] : 0.0));
    const double mean = double(moment_shift(cv)) * warp_sum_all(w_t) + ws / a.count;
    if (t == 0)
      shared[j] = forward_params(a, Stat{static_cast<float>(mean), static_cast<float>(fmax(m2, 0.0)), a.count},
                                 b.k0 + j, b.chunk == 0);
  }
  __syncthreads();
#pragma unroll
  for (int c = 0; c < Kb; ++c) out[c] = shared[c];
}

// grid (K / Kb, chunks): nchw_pool_forward_kernel's work on recomputed values (training: the statistics from the
// moments, stem_forward_params).
template <bool kTrain, bool kRelu, int Taps>
__global__ void __launch_bounds__(kThreads) stem_pool_forward_kernel(const StemGeometry sg, const ForwardArgs a,
                                                                     const StemConv cv, const double* moments,
                                                                     int32_t* argmax) {
  const StemBlock<Taps> b = enter_stem_block<Taps, kTrain>(cv, sg);  // evaluation: x from the gather just before
  constexpr int Kb = StemBlock<Taps>::kChannels;
  FwdParams params[Kb];
  if constexpr (kTrain) stem_forward_params(sg, a, cv, b, moments, params);
  else from_warps<Kb>(b.k0, sg.parts.C, params, [&](int64_t c) { return eval_params(a, c); });
  const int win = sg.window;
  for (int j = threadIdx.x; j < b.images * sg.pooled_p * sg.pooled_q; j += kThreads) {
    int image, ij, i, jq;
    sg.by_pooled.divmod(j, image, ij);
    sg.by_pooled_q.divmod(ij, i, jq);
    float best[Kb];
    int best_at[Kb];
#pragma unroll
    for (int c = 0; c < Kb; ++c) best[c] = -INFINITY, best_at[c] = i * win * sg.q + jq * win;
    for (int dr = 0; dr < win; ++dr)
      for (int ds = 0; ds < win; ++ds) {
        const int oh = i * win + dr, ow = jq * win + ds;
        float v[Taps];
        load_taps(cv, b.staged, b.filters, image, oh, ow, v);
#pragma unroll
        for (int c = 0; c < Kb; ++c) {
          const float y = normalize<kRelu>(dot(b.filters, c, v), params[c]);
          if (y > best[c] || isnan(y)) best[c] = y, best_at[c] = oh * sg.q + ow;  // maxpool2d's rule, row-major
        }
      }
#pragma unroll
    for (int c = 0; c < Kb; ++c)
      if (b.has(c, sg.parts.C)) {
        const int64_t out = sg.pooled_at(b.chunk, image, b.k0 + c, ij);
        __stcs(a.y + out, best[c]);
        __stcs(argmax + out, best_at[c]);
      }
  }
}

// grid (K / Kb, chunks): nchw_pool_backward_reduce_kernel's sums with the value at each argmax recomputed, and
// beside them P_t = Σ dy'·v_t over the same positions. Fields [0] S1, [1] S2, [2 + t] P_t of the partials
// [field][k][p].
template <bool kRelu, int Taps>
__global__ void __launch_bounds__(kThreads) stem_pool_backward_reduce_kernel(const StemGeometry sg,
                                                                             const BackwardArgs b, const StemConv cv,
                                                                             const int32_t* argmax) {
  const StemBlock<Taps> blk = enter_stem_block<Taps, true>(cv, sg);
  constexpr int Kb = StemBlock<Taps>::kChannels, kFields = 2 + Taps;
  float acc[Kb * kFields];
#pragma unroll
  for (int i = 0; i < Kb * kFields; ++i) acc[i] = 0.f;
  float mean[Kb];
#pragma unroll
  for (int c = 0; c < Kb; ++c) mean[c] = blk.has(c, sg.parts.C) ? b.save_mean[blk.k0 + c] : 0.f;
  for (int j = threadIdx.x; j < blk.images * sg.pooled_p * sg.pooled_q; j += kThreads) {
    int image, ij;
    sg.by_pooled.divmod(j, image, ij);
#pragma unroll
    for (int c = 0; c < Kb; ++c) {
      if (!blk.has(c, sg.parts.C)) continue;
      const int64_t out = sg.pooled_at(blk.chunk, image, blk.k0 + c, ij);
      float d = __ldg(b.dy + out);
      if constexpr (kRelu) d = __ldg(b.y + out) > 0.f ? d : 0.f;
      int oh, ow;
      sg.by_q.divmod(__ldg(argmax + out), oh, ow);
      float v[Taps];
      load_taps(cv, blk.staged, blk.filters, image, oh, ow, v);
      float* sums = acc + c * kFields;
      sums[0] += d;
      sums[1] = fmaf(d, dot(blk.filters, c, v) - mean[c], sums[1]);
#pragma unroll
      for (int t = 0; t < Taps; ++t) sums[2 + t] = fmaf(d, v[t], sums[2 + t]);
    }
  }
  __shared__ double totals[Kb * kFields];
  block_sums(acc, totals);
  const int64_t pc = int64_t(sg.parts.chunks) * sg.parts.C;
  for (int i = threadIdx.x; i < Kb * kFields; i += kThreads) {
    const int c = i / kFields, field = i % kFields;
    if (field < 2 + cv.taps && blk.has(c, sg.parts.C))
      b.ws[field * pc + partial_at(sg.parts, blk.chunk, blk.k0 + c)] = static_cast<float>(totals[i]);
  }
}

// grid (K / kWarps): warp w of block g finishes channel k = g·kWarps + w. Lane t < taps adds its P_t over the chunks
// (chunk order, double) and the block the chunks' moments (total_moments); then the warp combines S1, S2
// (finalize_backward, which stores dgamma and dbeta) and lane t writes dw[k][t] by the formula at the top of the
// section.
template <int Taps>
__global__ void __launch_bounds__(kThreads) stem_weight_kernel(const StemGeometry sg, const BackwardArgs b,
                                                               const StemConv cv, const double* __restrict__ moments,
                                                               float* __restrict__ dw) {
  begin_dependent_kernel();
  __shared__ double s[moment_entries(Taps)];
  const int chunks = sg.parts.chunks;
  const int64_t k = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  const int t = threadIdx.x % kWarpSize;
  const bool mine = k < sg.parts.C && t < cv.taps;
  const int64_t pc = int64_t(chunks) * sg.parts.C;
  // P_t: field 2 + t, chunk p at [p].
  const double p_sum = mine ? sum_in_order<32>(b.ws + (2 + t) * pc + partial_at(sg.parts, 0, k), 1, chunks) : 0.0;
  const double n = b.count;
  total_moments<Taps>(moments, chunks, n, s);
  if (k >= sg.parts.C) return;  // a whole warp; no barrier follows
  BwdParams bp = finalize_backward(sg.parts, b, k, true);
  bp.center = __shfl_sync(kFullMask, bp.center, 0), bp.k1 = __shfl_sync(kFullMask, bp.k1, 0);
  bp.mdy = __shfl_sync(kFullMask, bp.mdy, 0), bp.a = __shfl_sync(kFullMask, bp.a, 0);
  if (!mine) return;
  float w[Taps];
  load_filter(cv, k, w);
  const double shift = moment_shift(cv), mean = conv_mean(s, w, shift, n);  // the exact mean w·X/count
  const double x_sum = s[t] + n * shift;
  const double g = comoment_row(s, w, t) + (mean - double(bp.center)) * x_sum;  // Σ (conv - center)·v_t
  dw[k * cv.taps + t] = static_cast<float>(double(bp.k1) * (p_sum - double(bp.mdy) * x_sum - double(bp.a) * g));
}

// ---- stem plan and launchers

int64_t padded_image_floats(const Conv2dShape& cs) { return int64_t(cs.c) * (cs.h + 2 * cs.pad) * (cs.w + 2 * cs.pad); }

// Images per block: about kStemTargetBlocks blocks in all, as many images as the staging area holds at most.
// Fewer blocks than the other kernels' one full wave: each block stages its images and loads its filters
// first, and more positions per thread amortize that. The cnn at batch 64 on the H100 (--tf32): 2 images per
// block, 256 blocks, 39.4 us of stem kernels per step and 145.7 ms per epoch; at 192 target blocks 47.9 us and
// 151.0 ms.
constexpr int64_t kStemTargetBlocks = 256;
int stem_images_per_block(const Conv2dShape& cs) {
  const int64_t most = std::max<int64_t>(1, kStemStageFloats / padded_image_floats(cs));
  const int64_t groups = div_up<int64_t>(cs.k, stem_channels(cs.c * cs.r * cs.s));
  return static_cast<int>(std::clamp<int64_t>(div_up<int64_t>(int64_t(cs.n) * groups, kStemTargetBlocks), 1, most));
}
int stem_chunks(const Conv2dShape& cs) { return static_cast<int>(div_up<int64_t>(cs.n, stem_images_per_block(cs))); }

// The most chunks of any batch up to cs.n (a planned workspace serves every smaller batch).
int64_t most_stem_chunks(Conv2dShape cs) {
  int64_t most = 0;
  for (int n = 1, last = cs.n; n <= last; ++n) cs.n = n, most = std::max<int64_t>(most, stem_chunks(cs));
  return most;
}

struct Stem {
  StemGeometry sg;
  StemConv cv;
  size_t smem;  // bytes of staged images
  double values, pooled, x_bytes;  // for the launches' costs
};

Stem make_stem(const Exec& exec, const ConvBatchNormPoolShape& shape, const ConvBatchNormPoolTensors<float>& t) {
  const Conv2dShape& cs = shape.conv;
  NT_CHECK(conv_batchnorm_pool_fits(cs), "conv_batchnorm_pool: ", shape.taps(), " taps and a padded image of ",
           padded_image_floats(cs), " values exceed ", kConvBatchNormPoolMaxTaps, " and ", kConvBatchNormPoolMaxImage);
  NT_CHECK(cs.x_size() < (size_t(1) << 31) && cs.y_size() < (size_t(1) << 31),
           "conv_batchnorm_pool: the tensors exceed the kernels' 32-bit index range");
  const BatchNormShape bn = shape.batchnorm();
  const BatchNormPool pool = shape.pool();
  check_batchnorm_pool(bn, pool);
  Stem st;
  StemGeometry& sg = st.sg;
  sg.images = cs.n, sg.per_block = stem_images_per_block(cs);
  sg.parts.C = cs.k, sg.parts.chunks = stem_chunks(cs);
  sg.p = cs.p(), sg.q = cs.q(), sg.window = pool.window, sg.pooled_p = pool.p(), sg.pooled_q = pool.q();
  sg.cell_p = static_cast<int>(div_up(sg.p, sg.window)), sg.cell_q = static_cast<int>(div_up(sg.q, sg.window));
  sg.by_plane = FastDivmod(sg.p * sg.q), sg.by_q = FastDivmod(sg.q);
  sg.by_pooled = FastDivmod(sg.pooled_p * sg.pooled_q), sg.by_pooled_q = FastDivmod(sg.pooled_q);
  sg.by_cells = FastDivmod(sg.cell_p * sg.cell_q), sg.by_cell_q = FastDivmod(sg.cell_q);
  const int padded_h = cs.h + 2 * cs.pad, padded_w = cs.w + 2 * cs.pad;
  st.cv = {t.x, t.w, cs.c, cs.h, cs.w, cs.r, cs.s, cs.stride, cs.pad, shape.taps(), padded_h, padded_w,
           FastDivmod(cs.h * cs.w), FastDivmod(cs.w), exec.tf32};
  st.smem = size_t(sg.per_block) * padded_image_floats(cs) * sizeof(float);
  st.values = double(bn.n * bn.hw) * double(bn.c);
  st.pooled = double(bn.n) * bn.c * pool.p() * pool.q();
  st.x_bytes = double(cs.x_size()) * 4;
  return st;
}

dim3 stem_grid(const StemGeometry& sg, int taps) {
  return dim3(static_cast<unsigned>(div_up<int64_t>(sg.parts.C, stem_channels(taps))),
              static_cast<unsigned>(sg.parts.chunks));
}

// The kernels compiled for `taps`: 9 exactly, or any count up to kConvBatchNormPoolMaxTaps.
int stem_compiled_taps(int taps) { return taps == 9 ? 9 : kConvBatchNormPoolMaxTaps; }

// Calls f(std::bool_constant<relu>, std::integral_constant<int, Taps>) for the run-time choice.
template <class F>
void with_relu_taps(bool relu, int taps, const F& f) {
  using Nine = std::integral_constant<int, 9>;
  using Any = std::integral_constant<int, kConvBatchNormPoolMaxTaps>;
  auto go = [&](auto t) { relu ? f(std::true_type{}, t) : f(std::false_type{}, t); };
  if (stem_compiled_taps(taps) == 9) go(Nine{});
  else go(Any{});
}

// moments: the training forward's (nullptr in evaluation).
template <bool kTrain>
void launch_stem_pool(const Exec& exec, const char* name, const Stem& st, const ForwardArgs& a, bool relu,
                      const double* moments, int32_t* argmax) {
  const profile::OpCost cost{st.x_bytes + st.pooled * 8, st.values * (2.0 * st.cv.taps + 4)};
  with_relu_taps(relu, st.cv.taps, [&](auto r, auto taps) {
    launch(exec, name, cost, stem_pool_forward_kernel<kTrain, decltype(r)::value, decltype(taps)::value>,
           stem_grid(st.sg, st.cv.taps), dim3(kThreads), st.smem, st.sg, a, st.cv, moments, argmax);
  });
}

// Workspace (floats): the moments, chunks·E doubles (E for the compiled taps), which the training forward leaves
// for the backward; then the backward's partials [field][k][p], 2 + taps fields.
struct StemWorkspace {
  double* moments;
  float* partials;
};
int64_t stem_moment_floats(const Conv2dShape& cs, int64_t chunks) {
  return 2 * chunks * moment_entries(stem_compiled_taps(cs.c * cs.r * cs.s));
}
StemWorkspace stem_workspace(const Stem& st, const ConvBatchNormPoolShape& shape, float* ws) {
  NT_CHECK(reinterpret_cast<uintptr_t>(ws) % alignof(double) == 0, "conv_batchnorm_pool: the workspace is not 8-byte aligned");
  return {reinterpret_cast<double*>(ws), ws + stem_moment_floats(shape.conv, st.sg.parts.chunks)};
}

}  // namespace

size_t conv_batchnorm_pool_workspace_floats(const ConvBatchNormPoolShape& s) {
  const BatchNormShape bn = s.batchnorm();
  check_batchnorm_pool(bn, s.pool());
  if (bn.c <= 0 || bn.n * bn.hw <= 0) return 0;
  const int64_t chunks = most_stem_chunks(s.conv);
  return static_cast<size_t>(stem_moment_floats(s.conv, chunks) + (2 + s.taps()) * chunks * bn.c);
}

void conv_batchnorm_pool_forward_train(const Exec& exec, const ConvBatchNormPoolShape& shape, const BatchNormHyper& h,
                                       const ConvBatchNormPoolTensors<float>& t) {
  const BatchNormShape bn = shape.batchnorm();
  const int64_t count = bn.n * bn.hw;
  if (count == 1)
    throw Error(cat("conv_batchnorm_pool_forward_train: expected more than 1 value per channel when training, got n=",
                    bn.n, " hw=", bn.hw));
  if (bn.c == 0 || count == 0) return;
  const Stem st = make_stem(exec, shape, t);
  NT_CHECK(t.workspace != nullptr, "conv_batchnorm_pool_forward_train needs conv_batchnorm_pool_workspace_floats()");
  const StemWorkspace ws = stem_workspace(st, shape, t.workspace);
  const ForwardArgs a{nullptr,        t.gamma,       t.beta,
                      t.y,            nullptr,       t.save_mean,
                      t.save_invstd,  t.running_mean, t.running_var,
                      t.num_batches_tracked, nullptr, nullptr,
                      static_cast<float>(h.eps), static_cast<float>(h.momentum), static_cast<float>(count),
                      static_cast<float>(count - 1)};
  const int entries = moment_entries(stem_compiled_taps(st.cv.taps));
  const double positions = double(bn.n * bn.hw);
  const profile::OpCost moments_cost{st.x_bytes + double(st.sg.parts.chunks) * entries * 8, positions * 2.0 * entries};
  with_relu_taps(false, st.cv.taps, [&](auto, auto taps) {
    launch(exec, "conv_batchnorm_moments", moments_cost, stem_moments_kernel<decltype(taps)::value>,
           dim3(1, static_cast<unsigned>(st.sg.parts.chunks)), dim3(kThreads), st.smem, st.sg, st.cv, ws.moments);
  });
  launch_stem_pool<true>(exec, "conv_batchnorm_pool_forward", st, a, h.relu, ws.moments, t.argmax);
}

void conv_batchnorm_pool_forward_eval(const Exec& exec, const ConvBatchNormPoolShape& shape, const BatchNormHyper& h,
                                      const ConvBatchNormPoolTensors<float>& t) {
  const BatchNormShape bn = shape.batchnorm();
  if (bn.c == 0 || bn.n * bn.hw == 0) return;
  const Stem st = make_stem(exec, shape, t);
  const ForwardArgs a{nullptr, t.gamma, t.beta,         t.y,           nullptr,      nullptr, nullptr, nullptr,
                      nullptr, nullptr, t.running_mean, t.running_var, static_cast<float>(h.eps), 0.f, 0.f, 0.f};
  launch_stem_pool<false>(exec, "conv_batchnorm_pool_eval", st, a, h.relu, nullptr, t.argmax);
}

void conv_batchnorm_pool_backward(const Exec& exec, const ConvBatchNormPoolShape& shape, const BatchNormHyper& h,
                                  const ConvBatchNormPoolTensors<float>& t) {
  const BatchNormShape bn = shape.batchnorm();
  const int64_t count = bn.n * bn.hw;
  if (bn.c == 0 || count == 0) return;
  const Stem st = make_stem(exec, shape, t);
  NT_CHECK(t.workspace != nullptr, "conv_batchnorm_pool_backward needs conv_batchnorm_pool_workspace_floats()");
  NT_CHECK(!h.relu || t.y != nullptr, "conv_batchnorm_pool_backward with relu needs the pooled forward output y");
  NT_CHECK(t.argmax != nullptr && t.dw != nullptr, "conv_batchnorm_pool_backward needs the forward's argmax and dw");
  const StemWorkspace ws = stem_workspace(st, shape, t.workspace);
  const BackwardArgs b{nullptr, h.relu ? t.y : nullptr, t.dy, t.gamma, t.save_mean, t.save_invstd, nullptr,
                       t.dgamma, t.dbeta, ws.partials, static_cast<float>(count)};
  const int chunks = st.sg.parts.chunks, taps = st.cv.taps, entries = moment_entries(stem_compiled_taps(taps));
  const double pooled_reads = h.relu ? 3 : 2;  // dy, argmax (and y) per pooled output
  const profile::OpCost reduce_cost{st.x_bytes + st.pooled * 4 * pooled_reads + double(chunks) * bn.c * (2 + taps) * 4,
                                    st.pooled * (4.0 * taps + 3)};
  const profile::OpCost weight_cost{double(chunks) * (entries * 8 + bn.c * (2 + taps) * 4) + double(bn.c) * taps * 4,
                                    double(chunks) * entries + double(bn.c) * taps * (2.0 * taps + 8)};
  with_relu_taps(h.relu, taps, [&](auto relu, auto compiled) {
    constexpr bool kRelu = decltype(relu)::value;
    constexpr int Taps = decltype(compiled)::value;
    launch(exec, "conv_batchnorm_pool_backward_reduce", reduce_cost, stem_pool_backward_reduce_kernel<kRelu, Taps>,
           stem_grid(st.sg, taps), dim3(kThreads), st.smem, st.sg, b, st.cv, t.argmax);
    launch(exec, "conv_batchnorm_pool_backward_weight", weight_cost, stem_weight_kernel<Taps>,
           dim3(static_cast<unsigned>(div_up<int64_t>(bn.c, kWarps))), dim3(kThreads), 0, st.sg, b, st.cv,
           ws.moments, t.dw);
  });
}

}  // namespace nt::kernels::cuda
