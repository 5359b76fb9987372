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
//   with the convolution before it fused in too (conv_batchnorm_pool_*, conv_batchnorm_pool.cu): the same passes on
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

#include "kernels/batchnorm.h"
#include "kernels/cuda/batchnorm_params.cuh"
#include "kernels/cuda/fast_divmod.cuh"
#include "kernels/cuda/launch.cuh"

namespace nt::kernels::cuda {

namespace {

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

// ---- plan ----------------------------------------------------------------------------------------


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

// The partials' layout: the statistics pass's (g), or the given ones' chunk count.
Geometry given_parts(const Geometry& g, const ChannelPartials& given) {
  Geometry parts = g;
  if (given.chunks > 0) parts.chunks = given.chunks;
  return parts;
}

// ---- statistics helpers ---------------------------------------------------------------------------

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

// Many partials (a convolution's epilogue gives one per tile of pixels: 392 per channel for the cnn's conv2 at
// batch 64), combined by one full warp without a division per partial: lane l adds partials p = l, l + 32, ...
// as sums shifted by K = partial 0's mean, n = Σ n_p, s1 = Σ n_p·(mean_p − K), s2 = Σ M2_p + n_p·(mean_p − K)²,
// and the warp's totals (warp_sum, lane 0) give mean = K + s1/n and M2 = max(s2 − s1²/n, 0): the exact split of
// M2 into within- and between-partial parts, and K, a mean of the data, keeps s2 from swamping M2 when |mean| ≫
// std. Chan's combination (chain_forward_partials) spends a division and a dependent chain on each partial: with
// every block of the pooled forward finalizing its channel, that took 2.4 µs more than 12 partials did.
constexpr int kShiftedInFlight = 16;  // partials a lane loads before it adds any: the cnn's 392 in one round

__device__ Stat shifted_sum_partials(const Geometry& g, const float* ws, int64_t c, int lane) {
  const float shift = ws[partial_at(g, 0, c)];
  float n = 0.f, s1 = 0.f, s2 = 0.f;
  for_each_partial<kShiftedInFlight>(
      g, c, lane, kWarpSize, [&](int64_t k, bool present) { return forward_partial(g, ws, k, present); },
      [&](const Stat& part) {  // an empty partial (count 0) adds 0
        const float d = part.mean - shift, nd = part.n * d;
        n += part.n, s1 += nd, s2 += part.m2 + nd * d;
      });
  n = warp_sum(n), s1 = warp_sum(s1), s2 = warp_sum(s2);
  const float d = s1 / n;
  return {shift + d, fmaxf(s2 - s1 * d, 0.f), n};
}

// Channel c's forward parameters in a block of chunk p (kTrain: from the partials laid out as `parts`, blocks
// p == 0 also store save_*/running_*; else from the running statistics): up to kMaxChunksNchw partials by
// block_forward_params (warp 0, Chan's combination); more by shifted_sum_partials (warp 0). Every thread calls it.
template <bool kTrain>
__device__ FwdParams channel_forward_params(const Geometry& parts, const ForwardArgs& a, int64_t c, int p) {
  if (!kTrain || parts.chunks <= kMaxChunksNchw) return block_forward_params<kTrain>(parts, a, c, p);
  return from_warp0<FwdParams>([&] {
    const Stat s = shifted_sum_partials(parts, a.ws, c, threadIdx.x % kWarpSize);
    return threadIdx.x == 0 ? forward_params(a, s, c, p == 0) : FwdParams{0.f, 0.f, 0.f};
  });
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

// grid (C, P), reversed: block (C-1-bx, P-1-by). kTrain: the block finalizes the channel from the partials laid
// out as `parts` (g itself, or those a convolution gave) (blocks p == 0 also store save_*/running_*), else the
// parameters come from the running statistics.
template <int V, bool kTrain, bool kRelu>
__global__ void __launch_bounds__(kThreads) nchw_forward_apply_kernel(const Geometry g, const Geometry parts,
                                                                      const ForwardArgs a) {
  begin_dependent_kernel();
  const int64_t c = g.C - 1 - int64_t(blockIdx.x);
  const int p = g.chunks - 1 - static_cast<int>(blockIdx.y);
  const FwdParams f = channel_forward_params<kTrain>(parts, a, c, p);
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
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr int kPooledMinBlocks = 4;  // Turing holds 1024 threads per SM: four such blocks at most
#else
constexpr int kPooledMinBlocks = 5;
#endif

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

  const FwdParams f = channel_forward_params<kTrain>(g, a, c, p);

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
                             float* workspace, const ChannelPartials& given) {
  const int64_t count = s.n * s.hw;
  if (count == 1)
    throw Error(cat("batchnorm_forward_train: expected more than 1 value per channel when training, got n=", s.n,
                    " hw=", s.hw));
  if (s.c == 0 || count == 0) return;
  NT_CHECK(workspace != nullptr, "batchnorm_forward_train needs batchnorm_workspace_floats() of workspace");
  const Layout layout = effective_layout(s);
  NT_CHECK(given.chunks == 0 || layout == Layout::nchw, "batchnorm_forward_train: given statistics need NCHW");
  const bool vec = (layout == Layout::nchw ? s.hw % 4 == 0 : s.c % 4 == 0) && aligned16(x) && aligned16(y);
  const Geometry g = make_geometry(s, layout, vec ? 4 : 1);
  const Geometry parts = given_parts(g, given);
  const ForwardArgs a{x,           gamma,       beta,
                      y,           given.chunks > 0 ? given.data : workspace,   save_mean,
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
      if (given.chunks == 0)
        launch(exec, "batchnorm_stats_nchw", stats_cost, nchw_stats_kernel<V>, grid_of(g, layout), dim3(kThreads), 0,
               g, x, workspace);
      launch(exec, "batchnorm_forward_nchw", apply_cost, nchw_forward_apply_kernel<V, true, kRelu>,
             grid_of(g, layout), dim3(kThreads), 0, g, parts, a);
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
             dim3(kThreads), 0, g, g, a);
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
                                  float* running_var, int64_t* num_batches_tracked, float* workspace,
                                  const ChannelPartials& given) {
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
                      y,           given.chunks > 0 ? given.data : workspace,   save_mean,
                      save_invstd, running_mean, running_var,
                      num_batches_tracked, nullptr, nullptr,
                      static_cast<float>(h.eps), static_cast<float>(h.momentum), static_cast<float>(count),
                      static_cast<float>(count - 1)};
  const double elems = double(count) * double(s.c), pooled = double(pg.extent) * double(s.c);
  const profile::OpCost stats_cost{elems * 4, elems * 3};
  const profile::OpCost apply_cost{elems * 4 + pooled * 8, elems * 4};
  if (given.chunks == 0)
    launch(exec, "batchnorm_stats_nchw", stats_cost, vec ? nchw_stats_kernel<4> : nchw_stats_kernel<1>,
           grid_of(g, Layout::nchw), dim3(kThreads), 0, g, x, workspace);
  launch_pool_forward<true>(exec, "batchnorm_pool_forward_nchw", apply_cost, given_parts(g, given), pg, a, h.relu,
                            argmax);
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
