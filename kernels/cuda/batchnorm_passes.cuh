// The passes and plan that the plain BatchNorm (batchnorm.cu) and the one with a fused max-pool (batchnorm_pool.cu)
// share: the chunk plan (plan_chunks, make_geometry), the NCHW statistics pass (nchw_stats_kernel) and the
// combination of its partials in the apply blocks (channel_forward_params), the memory helpers, the backward's
// partial store and finalize kernel, and the kernels' argument structs filled from BatchNormArgs. The math, the
// layouts and the reduction orders are stated at the top of batchnorm.cu; the lower-level pieces that the fused
// convolution stem shares too are in batchnorm_params.cuh. File-local (an anonymous namespace): each .cu that
// includes it compiles its own copy of these kernels, the same code.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/batchnorm.h"
#include "kernels/channel_partials.h"
#include "kernels/collective.h"
#include "kernels/cuda/batchnorm_params.cuh"
#include "kernels/cuda/launch.cuh"

namespace nt::kernels::cuda {

namespace {

constexpr int kMaxVec = 4;                   // float4
constexpr int64_t kTargetBlocks = 1024;      // ~8 blocks per SM of an H100 (132 SMs): one wave, all resident
constexpr int64_t kMinElemsPerBlock = 4096;  // 16 KB: below this a block is mostly launch and reduction
// With a fused max-pool (the cnn's 64x32x28x28 and 64x64x14x14): 4 KB, so these latency-bound launches get
// 32 and 12 chunks per channel instead of 12 and 3 (a shorter statistics pass in the cnn's step). The
// unfused kernels keep 16 KB: at 4 KB the NHWC plans of those shapes reach 1024 chunks, which the finalize
// kernel then combines per channel, slower (docs/batchnorm.md, 'Fused max-pool (NCHW)').
constexpr int64_t kMinElemsPerBlockPooled = 1024;
constexpr int64_t kMaxChunksNchw = 128;           // partials a fused finalizing warp combines (4 per lane at most)
constexpr int64_t kMaxChunksNhwc = 1024;          // partials the finalize kernel's warp combines (32 per lane)
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
// std. Chan's combination (chain_forward_partials) spends a division and a dependent chain on each partial, which
// slowed the pooled forward (docs/batchnorm.md, 'Statistics given by the convolution before').
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
__global__ void __launch_bounds__(kThreads)
    nchw_stats_kernel(const Geometry g, const float* __restrict__ x, float* __restrict__ ws, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int64_t c = blockIdx.x;
  const int p = blockIdx.y;
  const int64_t begin = int64_t(p) * g.chunk, end = std::min(g.extent, begin + g.chunk);
  Shifted acc;
  int n = 0;
  if (begin + threadIdx.x < end) acc.shift = load_keep<V>(x, nchw_unit(g, c, begin + threadIdx.x)).v[0];
  for_chunk<false>(begin, end, threadIdx.x, kThreads, [&](const int64_t(&j)[kUnroll], int valid) {
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

// ---- forward: finalize and apply ---------------------------------------------------------------------

// The finalize kernels (NHWC, and the backward without dx): grid ceil(C / kFinalizeChannels) blocks of
// kFinalizeThreads; block b serves channels c0 = kFinalizeChannels·b + j, j < kFinalizeChannels. Thread t is
// channel j = t / kFinalizeLanes, lane r = t % kFinalizeLanes: it chains partials p = r, r + kFinalizeLanes, ...
// (a warp reads 32 consecutive partials of its channel: one 128-byte line per field). Then each warp folds
// its 32 lanes by a shuffle-down tree, and thread j < kFinalizeChannels adds channel j's 4 warps in order.
// Why so many lanes: a combination is a few dozen dependent instructions, and with a warp per channel
// chaining 1024 partials (32 per lane, the partials then stored [p][c], 32 sectors per warp load) the kernel
// was slower than with 128 lanes per channel, which ran the same with the lanes folded in shared memory or
// with a 2-ulp division in the combination (docs/batchnorm.md, 'Floors and predictions').
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

// Laid out as finalize_forward_kernel; writes dgamma/dbeta and, with dx, the apply parameters at params_at.
__global__ void __launch_bounds__(kFinalizeThreads)
    finalize_backward_kernel(const Geometry g, const BackwardArgs b, StampRing stamps) {
  begin_dependent_kernel(stamps);
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

// ---- launch helpers --------------------------------------------------------------------------------

dim3 grid_of(const Geometry& g, Layout layout) {
  const int64_t x = layout == Layout::nchw ? g.C : g.groups;
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(g.chunks));
}

dim3 finalize_grid(const Geometry& g) { return dim3(static_cast<unsigned>(div_up<int64_t>(g.C, kFinalizeChannels))); }

// The backward's finalize over the partials laid out as g (writes dgamma/dbeta, and the dx parameters).
void launch_finalize_backward(const Exec& exec, const profile::OpCost& cost, const Geometry& g, const BackwardArgs& b) {
  launch(exec, "batchnorm_backward_finalize", cost, finalize_backward_kernel, finalize_grid(g), dim3(kFinalizeThreads),
         0, g, b);
}

// ---- synchronized BatchNorm (kernels/batchnorm.h) -----------------------------------------------------
// The forward's exchange: this rank's partials combined per channel (combine_partials_kernel, as an apply block
// would combine them), every rank's gathered [W][3][C] (ProcessGroup::all_gather), and interleaved into [3][C][W]
// (kernels/channel_partials.h), which the apply (NCHW) or the finalize (NHWC) then combines as given partials: rank
// 0's first, the same order on every rank. Two small launches and an all-gather of 12·C bytes from each rank.

// The exchange's floats after the op's own: this rank's [3][C], the gathered [W][3][C], the interleaved [3][C][W].
size_t sync_floats(const BatchNormShape& s, int ranks) { return ranks > 1 ? size_t(3 * s.c * (1 + 2 * ranks)) : 0; }

bool synchronized(const BatchNormArgs<float>& a) { return a.group != nullptr && a.group->world() > 1; }

// Warp w of block b combines channel c = b·kWarps + w's partials (laid out as parts) into out[field·C + c].
__global__ void __launch_bounds__(kThreads) combine_partials_kernel(const Geometry parts, const float* __restrict__ ws,
                                                                    float* __restrict__ out, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int64_t c = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  if (c >= parts.C) return;  // a whole warp
  const int lane = threadIdx.x % kWarpSize;
  const Stat s = parts.chunks <= kMaxChunksNchw ? warp_combine(chain_forward_partials(parts, ws, c, lane, kWarpSize))
                                                : shifted_sum_partials(parts, ws, c, lane);
  if (lane == 0) out[c] = s.mean, out[parts.C + c] = s.m2, out[2 * parts.C + c] = s.n;
}

// Every rank's statistics of x as partials, one per rank in rank order, from this rank's (laid out as `parts` at
// `partials`), through sync_ws (sync_floats of workspace).
ChannelPartials gather_statistics(const Exec& exec, ProcessGroup& group, const Geometry& parts, const float* partials,
                                  float* sync_ws) {
  const int64_t C = parts.C;
  const int world = group.world();
  float* local = sync_ws;
  float* gathered = local + 3 * C;
  float* interleaved = gathered + 3 * C * world;
  const double combined = double(parts.chunks) * double(C);
  launch(exec, "batchnorm_combine_partials", {combined * 12 + double(C) * 12, combined * 10}, combine_partials_kernel,
         dim3(static_cast<unsigned>(div_up<int64_t>(C, kWarps))), dim3(kThreads), 0, parts, partials, local);
  group.all_gather(exec, local, gathered, size_t(3 * C));
  cuda::interleave_rank_partials(  // qualified: the dispatching entry of the same name is found too
      exec, {.gathered = gathered, .out = interleaved, .ranks = world, .fields = 3, .channels = C, .chunks = 1});
  return {interleaved, world};
}

// ---- the kernels' arguments -----------------------------------------------------------------------

// A training forward's: the statistics' partials in ws (the workspace's, given, or every rank's).
ForwardArgs train_args(const BatchNormArgs<float>& in, float* ws) {
  const int64_t count = in.shape.n * in.shape.hw;
  const int64_t world = synchronized(in) ? in.group->world() : 1;  // the statistics are over every rank's values
  return {.x = in.x,
          .gamma = in.gamma,
          .beta = in.beta,
          .y = in.y,
          .ws = ws,
          .save_mean = in.save_mean,
          .save_invstd = in.save_invstd,
          .running_mean = in.running_mean,
          .running_var = in.running_var,
          .num_batches_tracked = in.num_batches_tracked,
          .eps = static_cast<float>(in.hyper.eps),
          .momentum = static_cast<float>(in.hyper.momentum),
          .count = static_cast<float>(count * world),
          .count_m1 = static_cast<float>(count * world - 1)};
}

// An evaluation's: the running statistics, read only.
ForwardArgs eval_args(const BatchNormArgs<float>& in) {
  return {.x = in.x,
          .gamma = in.gamma,
          .beta = in.beta,
          .y = in.y,
          .eval_mean = in.running_mean,
          .eval_var = in.running_var,
          .eps = static_cast<float>(in.hyper.eps)};
}

// A backward's: y is read only through the ReLU.
BackwardArgs backward_args(const BatchNormArgs<float>& in) {
  return {.x = in.x,
          .y = in.hyper.relu ? in.y : nullptr,
          .dy = in.dy,
          .gamma = in.gamma,
          .save_mean = in.save_mean,
          .save_invstd = in.save_invstd,
          .dx = in.dx,
          .dgamma = in.dgamma,
          .dbeta = in.dbeta,
          .ws = in.workspace,
          .count = static_cast<float>(in.shape.n * in.shape.hw)};
}

}  // namespace

}  // namespace nt::kernels::cuda
