// BatchNorm's pieces shared by the plain and pooled kernels (batchnorm.cu, batchnorm_pool.cu) and the fused
// convolution stem (conv_batchnorm_pool.cu): the launch shape, the partials' layout, the (count, mean, M2)
// statistics and their Chan combination, and each channel's forward and backward parameters from its combined sums.
// The math and the reduction orders are stated at the top of batchnorm.cu. (The passes that only the plain and
// pooled ops share: batchnorm_passes.cuh.)
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.cuh"

namespace nt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarpSize = 32;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kUnroll = 4;  // independent loads in flight per thread
constexpr unsigned kFullMask = 0xffffffffu;

// The partials' layout and a pass's work split (batchnorm.cu's plan fills the rest).
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

// ---- per-channel parameters ------------------------------------------------------------------------

// The kernels' own view of an op's arguments (passed by value to every kernel): filled by name, and what an op does
// not use stays null / 0.
struct ForwardArgs {
  const float* x = nullptr;
  const float* gamma = nullptr;  // nullable
  const float* beta = nullptr;   // nullable
  float* y = nullptr;
  float* ws = nullptr;      // partials [3][C][P] (the statistics pass's, or given)
  float* params = nullptr;  // NHWC training: the per-channel parameters [3][C] the finalize writes, the apply reads
  float* save_mean = nullptr;
  float* save_invstd = nullptr;
  float* running_mean = nullptr;           // nullable
  float* running_var = nullptr;            // nullable
  int64_t* num_batches_tracked = nullptr;  // nullable
  const float* eval_mean = nullptr;        // forward_eval: running statistics, read only
  const float* eval_var = nullptr;
  float eps = 0.f, momentum = 0.f, count = 0.f, count_m1 = 0.f;
};

struct BackwardArgs {
  const float* x = nullptr;
  const float* y = nullptr;  // forward output; read only with relu
  const float* dy = nullptr;
  const float* gamma = nullptr;  // nullable
  const float* save_mean = nullptr;
  const float* save_invstd = nullptr;
  float* dx = nullptr;      // nullable (then no apply pass)
  float* dgamma = nullptr;  // nullable
  float* dbeta = nullptr;   // nullable
  float* ws = nullptr;      // partials [2][C][P], then (NHWC) parameters [4][C]
  float count = 0.f;
};

struct FwdParams {
  float center, scale, offset;  // y = (x - center)·scale + offset
};
struct BwdParams {
  float center, k1, mdy, a;  // dx = k1·(dy' - mdy - (x - center)·a)
};

__host__ __device__ __forceinline__ int64_t params_at(const Geometry& g, int fields) {
  return fields * int64_t(g.chunks) * g.C;
}

// Partial p of channel c within a field of the partials: [field][c][p], so a warp that combines one channel's
// partials reads consecutive floats.
__device__ __forceinline__ int64_t partial_at(const Geometry& g, int p, int64_t c) { return c * g.chunks + p; }

// Partials a finalizing lane loads before combining any: they come from L2, and a chain that waited for
// each load in turn was slow for the 32 per lane of the NHWC plan (docs/batchnorm.md, 'Floors and
// predictions'). The combination order (p = lane, lane + lanes, ...) is the same as one at a time.
constexpr int kPartialsInFlight = 8;

// Lane `lane` of `lanes` visits channel c's partials p = lane, lane + lanes, ... in that order, issuing kInFlight
// loads before it uses any: load(k, present) reads the partial whose first field is at k (present: p < chunks;
// else it returns an empty partial, which changes no sum), use(partial) takes it in.
template <int kInFlight, class Load, class Use>
__device__ __forceinline__ void for_each_partial(const Geometry& g, int64_t c, int lane, int lanes, const Load& load,
                                                 const Use& use) {
  for (int p0 = lane; p0 < g.chunks; p0 += kInFlight * lanes) {
    decltype(load(int64_t(0), true)) part[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int p = p0 + i * lanes;
      part[i] = load(partial_at(g, p, c), p < g.chunks);
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) use(part[i]);
  }
}

// The forward's partial (mean, M2, count) whose mean is at ws[k]; empty (count 0) where not present.
__device__ __forceinline__ Stat forward_partial(const Geometry& g, const float* ws, int64_t k, bool present) {
  const int64_t pc = int64_t(g.chunks) * g.C;
  return present ? Stat{ws[k], ws[pc + k], ws[2 * pc + k]} : Stat{0.f, 0.f, 0.f};
}

// Lane `lane` of `lanes` combines channel c's partials p = lane, lane + lanes, ... in that order (Chan).
__device__ Stat chain_forward_partials(const Geometry& g, const float* ws, int64_t c, int lane, int lanes) {
  Stat s{0.f, 0.f, 0.f};
  for_each_partial<kPartialsInFlight>(
      g, c, lane, lanes, [&](int64_t k, bool present) { return forward_partial(g, ws, k, present); },
      [&](const Stat& part) { s = combine(s, part); });  // an empty partial changes nothing
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
  for_each_partial<kPartialsInFlight>(
      g, c, lane, lanes,
      [&](int64_t k, bool present) { return present ? make_float2(ws[k], ws[pc + k]) : make_float2(0.f, 0.f); },
      [&](const float2& part) { s.x += part.x, s.y += part.y; });  // + 0 changes nothing
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
  if constexpr (kTrain)
    return from_warp0<FwdParams>([&] { return finalize_forward(g, a, c, p == 0); });
  else
    return eval_params(a, c);
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

}  // namespace

}  // namespace nt::kernels::cuda
