// BatchNorm on the GPU, fp32 (contract in kernels/batchnorm.h; CPU twin kernels/cpu/batchnorm.cpp). What this
// file and batchnorm_pool.cu share (the plan, the NCHW statistics pass, the finalizing helpers): batchnorm_passes.cuh.
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
//   with a fused max-pool (NCHW, batchnorm_pool_*): batchnorm_pool.cu, on this file's statistics pass; with the
//                 convolution before it fused in too (conv_batchnorm_pool_*): conv_batchnorm_pool.cu.
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
// 3·P·C + 4·C with P the shape's chunk count (P_actual <= P for either vector width); synchronized, then the
// exchange's sync_floats (batchnorm_passes.cuh).
//
// Synchronized (kernels/batchnorm.h): the forward's partials (its own or given) are combined per channel, gathered
// from every rank and interleaved (gather_statistics), and the apply (NCHW) or finalize (NHWC) combines the W
// ranks' statistics as given partials, in rank order, with count·W; the backward all_reduce_means its partial sums
// [2][C][P] between the reduce and the pass that uses them (every rank has the same plan).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/batchnorm.h"
#include "kernels/cuda/batchnorm_params.cuh"
#include "kernels/cuda/batchnorm_passes.cuh"
#include "kernels/cuda/launch.cuh"

namespace nt::kernels::cuda {

namespace {

// grid (groups, P): block (grp, p) writes the partials of its tc·V channels over rows chunk p.
template <int V>
__global__ void __launch_bounds__(kThreads)
    nhwc_stats_kernel(const Geometry g, const float* __restrict__ x, float* __restrict__ ws, StampRing stamps) {
  begin_dependent_kernel(stamps);
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
    for_chunk<false>(begin, end, r, g.tr, [&](const int64_t(&row)[kUnroll], int valid) {
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

__global__ void __launch_bounds__(kFinalizeThreads)
    finalize_forward_kernel(const Geometry g, const ForwardArgs a, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int64_t c0 = int64_t(blockIdx.x) * kFinalizeChannels;
  const int64_t chain_c = c0 + threadIdx.x / kFinalizeLanes;  // the channel whose partials this thread chains
  const int lane = threadIdx.x % kFinalizeLanes;
  const Stat chained = chain_c < g.C ? chain_forward_partials(g, a.ws, chain_c, lane, kFinalizeLanes) : Stat{};
  const Stat s = fold_finalize_lanes(
      chained, [](const Stat& v) { return warp_combine(v); }, combine);
  const int64_t c = c0 + threadIdx.x;  // threads < kFinalizeChannels: the channel whose combination s is
  if (threadIdx.x < kFinalizeChannels && c < g.C) {
    const FwdParams f = forward_params(a, s, c, true);
    a.params[c] = f.center, a.params[g.C + c] = f.scale, a.params[2 * g.C + c] = f.offset;
  }
}

// grid (C, P), reversed: block (C-1-bx, P-1-by). kTrain: the block finalizes the channel from the partials laid
// out as `parts` (g itself, or those a convolution gave) (blocks p == 0 also store save_*/running_*), else the
// parameters come from the running statistics.
template <int V, bool kTrain, bool kRelu>
__global__ void __launch_bounds__(kThreads)
    nchw_forward_apply_kernel(const Geometry g, const Geometry parts, const ForwardArgs a, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int64_t c = g.C - 1 - int64_t(blockIdx.x);
  const int p = g.chunks - 1 - static_cast<int>(blockIdx.y);
  const FwdParams f = channel_forward_params<kTrain>(parts, a, c, p);
  const int64_t begin = int64_t(p) * g.chunk, end = std::min(g.extent, begin + g.chunk);
  for_chunk<true>(begin, end, threadIdx.x, kThreads, [&](const int64_t(&j)[kUnroll], int valid) {
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
__global__ void __launch_bounds__(kThreads)
    nhwc_forward_apply_kernel(const Geometry g, const ForwardArgs a, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int q = threadIdx.x % g.tc, r = threadIdx.x / g.tc;
  const int64_t col = int64_t(g.groups - 1 - static_cast<int>(blockIdx.x)) * g.tc + q;
  const int p = g.chunks - 1 - static_cast<int>(blockIdx.y);
  if (r >= g.tr || col >= g.cv) return;
  FwdParams f[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t c = col * V + k;
    if constexpr (kTrain) {
      f[k] = {a.params[c], a.params[g.C + c], a.params[2 * g.C + c]};
    } else {
      f[k] = eval_params(a, c);
    }
  }
  const int64_t begin = int64_t(p) * g.chunk, end = std::min(g.extent, begin + g.chunk);
  for_chunk<true>(begin, end, r, g.tr, [&](const int64_t(&row)[kUnroll], int valid) {
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

// grid (C, P): block (c, p) writes (S1, S2) of channel c over chunk p.
template <int V, bool kRelu>
__global__ void __launch_bounds__(kThreads)
    nchw_backward_reduce_kernel(const Geometry g, const BackwardArgs b, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int64_t c = blockIdx.x;
  const int p = blockIdx.y;
  const float mean = b.save_mean[c];
  const int64_t begin = int64_t(p) * g.chunk, end = std::min(g.extent, begin + g.chunk);
  float2 acc = make_float2(0.f, 0.f);
  for_chunk<false>(begin, end, threadIdx.x, kThreads, [&](const int64_t(&j)[kUnroll], int valid) {
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
__global__ void __launch_bounds__(kThreads)
    nhwc_backward_reduce_kernel(const Geometry g, const BackwardArgs b, StampRing stamps) {
  begin_dependent_kernel(stamps);
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
    for_chunk<false>(begin, end, r, g.tr, [&](const int64_t(&row)[kUnroll], int valid) {
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

// grid (C, P), reversed; warp 0 finalizes the channel (blocks p == 0 store dgamma/dbeta).
template <int V, bool kRelu>
__global__ void __launch_bounds__(kThreads)
    nchw_backward_apply_kernel(const Geometry g, const BackwardArgs b, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int64_t c = g.C - 1 - int64_t(blockIdx.x);
  const int p = g.chunks - 1 - static_cast<int>(blockIdx.y);
  const BwdParams f = block_backward_params(g, b, c, p);
  const int64_t begin = int64_t(p) * g.chunk, end = std::min(g.extent, begin + g.chunk);
  for_chunk<true>(begin, end, threadIdx.x, kThreads, [&](const int64_t(&j)[kUnroll], int valid) {
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
__global__ void __launch_bounds__(kThreads)
    nhwc_backward_apply_kernel(const Geometry g, const BackwardArgs b, StampRing stamps) {
  begin_dependent_kernel(stamps);
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
  for_chunk<true>(begin, end, r, g.tr, [&](const int64_t(&row)[kUnroll], int valid) {
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

}  // namespace

size_t batchnorm_workspace_floats(const BatchNormShape& s, int ranks) {
  if (s.c <= 0 || s.n * s.hw <= 0) return 0;
  return static_cast<size_t>(3 * plan_chunks(s) * s.c + 4 * s.c) + sync_floats(s, ranks);
}

void batchnorm_forward_train(const Exec& exec, const BatchNormArgs<float>& args) {
  const BatchNormShape& s = args.shape;
  const int64_t count = s.n * s.hw;
  if (count == 1)
    throw Error(cat("batchnorm_forward_train: expected more than 1 value per channel when training, got n=", s.n,
                    " hw=", s.hw));
  if (s.c == 0 || count == 0) return;
  NT_CHECK(args.workspace != nullptr, "batchnorm_forward_train needs batchnorm_workspace_floats() of workspace");
  const Layout layout = effective_layout(s);
  NT_CHECK(args.given.chunks == 0 || layout == Layout::nchw, "batchnorm_forward_train: given statistics need NCHW");
  const bool vec = (layout == Layout::nchw ? s.hw % 4 == 0 : s.c % 4 == 0) && aligned16(args.x) && aligned16(args.y);
  const Geometry g = make_geometry(s, layout, vec ? 4 : 1);
  const double elems = double(count) * double(s.c);
  const profile::OpCost stats_cost{elems * 4, elems * 3};
  const profile::OpCost apply_cost{elems * 8, elems * 3};
  // The statistics' partials: given, or the statistics pass's in the workspace; synchronized, every rank's.
  ChannelPartials stats = args.given;
  if (stats.chunks == 0) {
    const auto kernel = layout == Layout::nchw ? (vec ? nchw_stats_kernel<4> : nchw_stats_kernel<1>)
                                               : (vec ? nhwc_stats_kernel<4> : nhwc_stats_kernel<1>);
    launch(exec, layout == Layout::nchw ? "batchnorm_stats_nchw" : "batchnorm_stats_nhwc", stats_cost, kernel,
           grid_of(g, layout), dim3(kThreads), 0, g, args.x, args.workspace);
    stats = {args.workspace, g.chunks};
  }
  if (synchronized(args))
    stats = gather_statistics(exec, *args.group, given_parts(g, stats), stats.data,
                              args.workspace + batchnorm_workspace_floats(s, 1));
  const Geometry parts = given_parts(g, stats);
  ForwardArgs a = train_args(args, stats.data);
  a.params = args.workspace + params_at(g, 3);
  const profile::OpCost finalize_cost{double(parts.chunks) * double(s.c) * 12, double(parts.chunks) * double(s.c) * 10};
  with_vec_relu(vec, args.hyper.relu, [&](auto v, auto relu) {
    constexpr int V = decltype(v)::value;
    constexpr bool kRelu = decltype(relu)::value;
    if (layout == Layout::nchw) {
      launch(exec, "batchnorm_forward_nchw", apply_cost, nchw_forward_apply_kernel<V, true, kRelu>, grid_of(g, layout),
             dim3(kThreads), 0, g, parts, a);
    } else {
      launch(exec, "batchnorm_finalize", finalize_cost, finalize_forward_kernel, finalize_grid(parts),
             dim3(kFinalizeThreads), 0, parts, a);
      launch(exec, "batchnorm_forward_nhwc", apply_cost, nhwc_forward_apply_kernel<V, true, kRelu>, grid_of(g, layout),
             dim3(kThreads), 0, g, a);
    }
  });
}

void batchnorm_forward_eval(const Exec& exec, const BatchNormArgs<float>& args) {
  const BatchNormShape& s = args.shape;
  const int64_t count = s.n * s.hw;
  if (s.c == 0 || count == 0) return;
  const Layout layout = effective_layout(s);
  const bool vec = (layout == Layout::nchw ? s.hw % 4 == 0 : s.c % 4 == 0) && aligned16(args.x) && aligned16(args.y);
  const Geometry g = make_geometry(s, layout, vec ? 4 : 1);
  const ForwardArgs a = eval_args(args);
  const double elems = double(count) * double(s.c);
  const profile::OpCost cost{elems * 8, elems * 3};
  with_vec_relu(vec, args.hyper.relu, [&](auto v, auto relu) {
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

void batchnorm_backward(const Exec& exec, const BatchNormArgs<float>& args) {
  const BatchNormShape& s = args.shape;
  const bool with_relu = args.hyper.relu;
  const int64_t count = s.n * s.hw;
  if (s.c == 0 || count == 0 || (!args.dx && !args.dgamma && !args.dbeta)) return;
  NT_CHECK(args.workspace != nullptr, "batchnorm_backward needs batchnorm_workspace_floats() of workspace");
  NT_CHECK(!with_relu || args.y != nullptr, "batchnorm_backward with relu needs the forward output y");
  const Layout layout = effective_layout(s);
  const bool vec = (layout == Layout::nchw ? s.hw % 4 == 0 : s.c % 4 == 0) && aligned16(args.x) && aligned16(args.dy) &&
                   aligned16(args.dx) && (!with_relu || aligned16(args.y));
  const Geometry g = make_geometry(s, layout, vec ? 4 : 1);
  const BackwardArgs b = backward_args(args);
  const double elems = double(count) * double(s.c);
  const double reads = with_relu ? 3 : 2;
  const profile::OpCost reduce_cost{elems * 4 * reads, elems * 4};
  const profile::OpCost apply_cost{elems * 4 * (reads + 1), elems * 5};
  const profile::OpCost finalize_cost{double(g.chunks) * double(s.c) * 8, double(g.chunks) * double(s.c) * 2};
  with_vec_relu(vec, with_relu, [&](auto v, auto relu) {
    constexpr int V = decltype(v)::value;
    constexpr bool kRelu = decltype(relu)::value;
    if (layout == Layout::nchw) {
      launch(exec, "batchnorm_backward_reduce_nchw", reduce_cost, nchw_backward_reduce_kernel<V, kRelu>,
             grid_of(g, layout), dim3(kThreads), 0, g, b);
      if (synchronized(args)) args.group->all_reduce_mean(exec, args.workspace, size_t(2 * g.chunks * s.c));
      if (args.dx)
        launch(exec, "batchnorm_backward_nchw", apply_cost, nchw_backward_apply_kernel<V, kRelu>, grid_of(g, layout),
               dim3(kThreads), 0, g, b);
      else
        launch_finalize_backward(exec, finalize_cost, g, b);
    } else {
      launch(exec, "batchnorm_backward_reduce_nhwc", reduce_cost, nhwc_backward_reduce_kernel<V, kRelu>,
             grid_of(g, layout), dim3(kThreads), 0, g, b);
      if (synchronized(args)) args.group->all_reduce_mean(exec, args.workspace, size_t(2 * g.chunks * s.c));
      launch_finalize_backward(exec, finalize_cost, g, b);
      if (args.dx)
        launch(exec, "batchnorm_backward_nhwc", apply_cost, nhwc_backward_apply_kernel<V, kRelu>, grid_of(g, layout),
               dim3(kThreads), 0, g, b);
    }
  });
}

}  // namespace nt::kernels::cuda
