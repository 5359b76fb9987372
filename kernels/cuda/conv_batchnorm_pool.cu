// The fused convolution stem on the GPU (contract in kernels/conv_batchnorm_pool.h; CPU twin in
// kernels/cpu/conv_batchnorm_pool.cpp), NCHW.
//
// The pooled BatchNorm whose input is conv2d_forward(x, w) of a first layer with few taps, never written: each
// kernel recomputes a value from x's C·R·S taps where batchnorm_pool.cu's kernels would read it. Block (g, p) serves
// channels [g·Kb, (g+1)·Kb) (Kb = stem_channels: 4 for up to 9 taps, else 1) over images [p·I, (p+1)·I)
// (StemGeometry): it stages those images of x in shared memory, zero-padded (and rounded to TF32 or BF16 under
// Exec::math, as the direct convolution rounds its operands), keeps its channels' filters in registers, and
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
// With TF32 or BF16 the taps and filters are the rounded ones, as in every other pass; dconv itself is not rounded
// (the direct weight-gradient kernel rounds it as an operand): the formula never forms the products.
//
// Launches:
//   forward_train  stem_moments (a block per image group: the group's moments, kept in the workspace for the
//                  backward, and from them each channel's (mean, M2) partial in the pooled statistics'
//                  [field][k][p] layout) → stem_pool (normalize each window, write its maximum and argmax;
//                  with y_staged the maximum goes there instead, channels-last in BF16 or TF32, a thread's 4
//                  channels in one 8- or 16-byte store: staged_activation.cuh); forward_eval: stem_pool alone.
//                  moments launches stem_moments alone, ahead; a forward_train with moments_ready then
//                  launches stem_pool alone. With y_staged, stem_pool also stages the next convolution's filters
//                  (next_filters), so that its forward launches no stage kernel.
//   backward       stem_pool_backward_reduce (S1, S2 and P_t over the pooled outputs: one value at each argmax)
//                  → stem_weight (a warp per channel: dgamma, dbeta and dw from the sums and the moments).
// Unfused, the conv's output (4·n·K·P·Q bytes) is written once and read three times; here only x (n·C·H·W
// floats) is read, from L2, once per channel group. Deterministic: fixed orders, no atomics.
// Over ~700 lines on purpose: its four kernels share the image staging, the filters in registers and the plan
// (StemGeometry, make_stem), file-local; a split would move most of the file into a header.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/conv_batchnorm_pool.h"
#include "kernels/cuda/batchnorm_params.cuh"
#include "kernels/cuda/fast_divmod.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/staged_activation.cuh"
#include "kernels/operand.h"

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
  int padded_h, padded_w;           // H + 2·pad, W + 2·pad: a staged plane
  FastDivmod by_in_plane, by_in_w;  // x's H·W and W: element -> (image·C + c, h, w)
  Math math;                        // the operands' rounding (kernels/operand.h)
};

struct StemGeometry {
  Geometry parts;     // C = K and chunks = image groups: the layout of the statistics' and backward sums' partials
  int images = 0;     // n
  int per_block = 1;  // I: images per block
  int p = 0, q = 0;   // the conv's output plane
  int window = 1, pooled_p = 0, pooled_q = 0;  // MaxPool2d(window, stride window): (P/window, Q/window)
  int cell_p = 0, cell_q = 0;                  // cells per plane: ceil(P/window) x ceil(Q/window)
  FastDivmod by_plane, by_q, by_pooled, by_pooled_q, by_cells, by_cell_q;
  __device__ int block_images(int chunk) const { return min(per_block, images - chunk * per_block); }
  // Pooled output (image, ij) of channel k in a block of chunk `chunk`: its index in y / dy / argmax.
  __device__ int64_t pooled_at(int chunk, int image, int64_t k, int ij) const {
    return (int64_t(chunk * per_block + image) * parts.C + k) * (int64_t(pooled_p) * pooled_q) + ij;
  }
  // The same output's index in the channels-last staged y (n, pooled_p, pooled_q, K).
  __device__ int64_t staged_at(int chunk, int image, int64_t k, int ij) const {
    return (int64_t(chunk * per_block + image) * (int64_t(pooled_p) * pooled_q) + ij) * parts.C + k;
  }
};

// Every thread of the block: the block's images of x into `staged` ([image][c][padded_h][padded_w], zeros in the
// padding), rounded as math says. First the whole area is zeroed, then x's values (consecutive, so the loads
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
      staged[plane * padded_plane + (h + cv.pad) * cv.padded_w + w + cv.pad] = round_operand(v[u], cv.math);
    }
  }
}

// Taps: C·R·S exactly, or kConvBatchNormPoolMaxTaps with a guard for any smaller count.
template <int Taps>
__device__ __forceinline__ bool tap_in_use(int t, int taps) {
  return Taps != kConvBatchNormPoolMaxTaps || t < taps;
}

// The block's channels' filters (rounded as math says; 0 past K) and each tap's offset in a staged image: loaded once
// per block into shared memory (fill_filters), then copied into every thread's registers; each thread loading
// and rounding its own copy cost as much as its share of the work (docs/batchnorm.md, 'Before the moments').
template <int Taps>
struct StemFilters {
  static constexpr int kChannels = stem_channels(Taps);
  float weight[kChannels][Taps];
  int offset[Taps];  // c·padded_h·padded_w + r·padded_w + s
};

// Tap t < taps of channel k's filter as the convolution uses it (rounded as math says).
__device__ __forceinline__ float filter_tap(const StemConv& cv, int64_t k, int t) {
  const float v = __ldg(cv.filters + k * cv.taps + t);
  return round_operand(v, cv.math);
}

// Every thread of the block: the filters into `table` (threads i < Kb·Taps load one weight each, threads t < taps
// one offset each), then, after the caller's barrier, each thread copies the table into its registers.
template <int Taps>
__device__ __forceinline__ void fill_filters(const StemConv& cv, int64_t k0, int64_t K, StemFilters<Taps>& table) {
  constexpr int Kb = StemFilters<Taps>::kChannels;
  for (int i = threadIdx.x; i < Kb * Taps; i += kThreads) {
    const int j = i / Taps, t = i % Taps;
    table.weight[j][t] = tap_in_use<Taps>(t, cv.taps) && k0 + j < K ? filter_tap(cv, k0 + j, t) : 0.f;
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
  const StemFilters<Taps>* table;  // the same filters in shared memory
  int64_t k0;                      // the first channel
  int chunk, images;
  __device__ bool has(int j, int64_t K) const { return k0 + j < K; }
};

// What a stem kernel stages before its wait for the kernel launched just before it (kernels/cuda/launch.cuh): what
// comes from kernels before that one, which had completed when it passed its own wait and let this kernel launch,
// so that the staging overlaps its tail.
enum class Early {
  nothing,  // x written by the kernel before: the batch gather before the moments and the evaluation
  x,        // w written by it: the optimizer's update before a training forward whose moments ran ahead
  x_and_w,  // the training forward after its own moments pass, the backward's reduce
};

// Every thread of the block, first thing: stages the images and the filters, `early` of them before its wait (beside:
// no wait here at all, the kernel runs beside its predecessor and calls end_kernel(true) before its stores).
template <int Taps>
__device__ __forceinline__ StemBlock<Taps> enter_stem_block(const StemConv& cv, const StemGeometry& sg,
                                                            const StampRing& stamps, Early early, bool beside = false) {
  extern __shared__ float stem_staged[];
  __shared__ StemFilters<Taps> table;
  if (early == Early::nothing) begin_dependent_kernel(stamps);
  StemBlock<Taps> b;
  b.staged = stem_staged;
  b.k0 = int64_t(blockIdx.x) * b.kChannels;
  b.chunk = static_cast<int>(blockIdx.y);
  b.images = sg.block_images(b.chunk);
  stage_images(cv, b.chunk * sg.per_block, b.images, b.staged);
  if (early == Early::x) begin_dependent_kernel(stamps);
  fill_filters(cv, b.k0, sg.parts.C, table);
  __syncthreads();
  if (early == Early::x_and_w) begin_kernel(beside, stamps);
  b.filters = table;
  b.table = &table;
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
  return round_operand(k, cv.math);
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
  if constexpr (Half > 1)
    return warp_transpose_sum<Half / 2>(v);
  else
    return v[0];
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
// with 8 loads in flight per thread (a thread per entry holding all 32 chunks' doubles took more registers,
// which stem_pool's blocks cannot spare: docs/batchnorm.md, 'Statistics and weight gradient from patch moments').
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

// Channel k's filter (filter_tap), 0 past taps.
template <int Taps>
__device__ __forceinline__ void load_filter(const StemConv& cv, int64_t k, float (&w)[Taps]) {
#pragma unroll
  for (int t = 0; t < Taps; ++t) w[t] = tap_in_use<Taps>(t, cv.taps) ? filter_tap(cv, k, t) : 0.f;
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
__global__ void __launch_bounds__(kThreads)
    stem_moments_kernel(const StemGeometry sg, const StemConv cv, double* __restrict__ moments, StampRing stamps) {
  const StemBlock<Taps> b = enter_stem_block<Taps>(cv, sg, stamps, Early::nothing);  // x: the gather just before
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
      for_tile_entries<Taps, E0>(
          [&](int i, int t, int u) { acc[i] = u < 0 ? acc[i] + v[t] : fmaf(v[t], v[u], acc[i]); });
    }
    block_sums(acc, s + E0);
  };
  each_tile(tile, std::make_integer_sequence<int, kTiles>{});
  for (int e = threadIdx.x; e < E; e += kThreads) moments[int64_t(b.chunk) * E + e] = s[e];
}

// Every thread of the block (a training stem_pool block): its channels' parameters from the batch's moments,
// and blocks of chunk 0 store save_*, running_* (forward_params). Warp j < Kb serves channel k0 + j, lane t its row
// of (Cm w), with the filter from the block's shared table: the registers hold the block's filters for the pass
// that follows (about 100 per thread, and two blocks of 256 threads per SM need at most 128).
template <int Taps>
__device__ void stem_forward_params(const StemGeometry& sg, const ForwardArgs& a, const StemConv& cv,
                                    const StemBlock<Taps>& b, const double* moments,
                                    FwdParams (&out)[StemBlock<Taps>::kChannels]) {
  constexpr int Kb = StemBlock<Taps>::kChannels;
  __shared__ double s[moment_entries(Taps)];
  __shared__ FwdParams shared[Kb];
  total_moments<Taps>(moments, sg.parts.chunks, a.count, s);
  const int j = threadIdx.x / kWarpSize, t = threadIdx.x % kWarpSize;
  if (j < Kb && b.has(j, sg.parts.C)) {
    const float(&w)[Taps] = b.table->weight[j];
    const double m2 = warp_sum_all(t < cv.taps ? double(w[t]) * comoment_row(s, w, t) : 0.0);
    if (t == 0) {
      const Stat st{static_cast<float>(conv_mean(s, w, moment_shift(cv), a.count)), static_cast<float>(fmax(m2, 0.0)),
                    a.count};
      shared[j] = forward_params(a, st, b.k0 + j, b.chunk == 0);
    }
  }
  __syncthreads();
#pragma unroll
  for (int c = 0; c < Kb; ++c) out[c] = shared[c];
}

// The next convolution's filters in their staged form (kernels/conv.h, Conv2dFilterStage), a value a thread over the
// whole grid: the stem's blocks, past their wait, are that convolution's predecessor, so its forward then launches
// no stage kernel of its own. Rounded as the channels-last stage rounds them (store_staged): the same bits. (Loading
// a thread's value as the kernel starts and storing it as the kernel ends, behind the pooled work, measured 0.2 ms an
// epoch slower in the cnn at batch 64.)
template <class Staged>
__device__ __forceinline__ void stage_next_filters(const Conv2dFilterStage& next, Staged* filters) {
  const int threads = gridDim.x * gridDim.y * blockDim.x;
  const int elements = next.k * next.c * next.r * next.s;
  for (int e = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x; e < elements; e += threads) {
    const float v[1] = {__ldg(next.w + staged_filter_source(e, next.k, next.c, next.r, next.s, false))};
    store_staged<1>(filters + e, v);
  }
}

// grid (K / Kb, chunks): nchw_pool_forward_kernel's work on recomputed values (training: the statistics from the
// moments, stem_forward_params). early: enter_stem_block's. next: the next convolution's filters to stage, if any.
template <bool kTrain, bool kRelu, int Taps, class Staged>
__global__ void __launch_bounds__(kThreads)
    stem_pool_forward_kernel(const StemGeometry sg, const ForwardArgs a, const StemConv cv, const double* moments,
                             int32_t* argmax, Staged* y_staged, Conv2dFilterStage next, Early early, StampRing stamps) {
  const StemBlock<Taps> b = enter_stem_block<Taps>(cv, sg, stamps, early);
  if (next.filters) stage_next_filters(next, static_cast<Staged*>(next.filters));
  constexpr int Kb = StemBlock<Taps>::kChannels;
  FwdParams params[Kb];
  if constexpr (kTrain)
    stem_forward_params(sg, a, cv, b, moments, params);
  else
    from_warps<Kb>(b.k0, sg.parts.C, params, [&](int64_t c) { return eval_params(a, c); });
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
        if (a.y) __stcs(a.y + out, best[c]);
        __stcs(argmax + out, best_at[c]);
      }
    if (y_staged) store_staged<Kb>(y_staged + sg.staged_at(b.chunk, image, b.k0, ij), best);  // K % 8 == 0: all Kb
  }
}

// grid (K / Kb, chunks): nchw_pool_backward_reduce_kernel's sums with the value at each argmax recomputed, and
// beside them P_t = Σ dy'·v_t over the same positions. Fields [0] S1, [1] S2, [2 + t] P_t of the partials
// [field][k][p]. beside: it runs beside its predecessor (ConvBatchNormPoolArgs::overlaps_previous: a kernel that reads
// only its own layer's workspace and writes only that layer's gradients), since everything it reads comes from
// kernels before that one.
template <bool kRelu, int Taps, class Staged>
__global__ void __launch_bounds__(kThreads)
    stem_pool_backward_reduce_kernel(const StemGeometry sg, const BackwardArgs b, const StemConv cv,
                                     const int32_t* argmax, const Staged* y_staged, bool beside, StampRing stamps) {
  const StemBlock<Taps> blk = enter_stem_block<Taps>(cv, sg, stamps, Early::x_and_w, beside);
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
      if constexpr (kRelu) {
        const float y =
            y_staged ? staged_value(y_staged[sg.staged_at(blk.chunk, image, blk.k0 + c, ij)]) : __ldg(b.y + out);
        d = y > 0.f ? d : 0.f;
      }
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
  end_kernel(beside, stamps);
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
__global__ void __launch_bounds__(kThreads)
    stem_weight_kernel(const StemGeometry sg, const BackwardArgs b, const StemConv cv,
                       const double* __restrict__ moments, float* __restrict__ dw, StampRing stamps) {
  begin_dependent_kernel(stamps);
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
// first, and more positions per thread amortize that. The cnn at batch 64: 2 images per block, 256 blocks; a
// target of 192 blocks made the stem kernels and the epoch slower (docs/batchnorm.md, 'Fused convolution stem
// (NCHW)').
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
  size_t smem;                     // bytes of staged images
  double values, pooled, x_bytes;  // for the launches' costs
};

Stem make_stem(const Exec& exec, const ConvBatchNormPoolArgs<float>& t) {
  const ConvBatchNormPoolShape& shape = t.shape;
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
  st.cv = {t.x,
           t.w,
           cs.c,
           cs.h,
           cs.w,
           cs.r,
           cs.s,
           cs.stride,
           cs.pad,
           shape.taps(),
           padded_h,
           padded_w,
           FastDivmod(cs.h * cs.w),
           FastDivmod(cs.w),
           exec.math};
  st.smem = size_t(sg.per_block) * padded_image_floats(cs) * sizeof(float);
  st.values = double(bn.n * bn.hw) * double(bn.c);
  st.pooled = double(bn.n) * bn.c * pool.p() * pool.q();
  st.x_bytes = double(cs.x_size()) * 4;
  NT_CHECK(t.y_staged == nullptr || stages_activations(exec.math),
           "conv_batchnorm_pool: a staged output needs TF32 or BF16 math (fp32 stages nothing)");
  NT_CHECK(t.y_staged == nullptr || cs.k % 8 == 0, "conv_batchnorm_pool: a staged output needs channels a multiple ",
           "of 8, got ", cs.k);
  NT_CHECK(t.y_staged == nullptr || reinterpret_cast<uintptr_t>(t.y_staged) % 16 == 0,
           "conv_batchnorm_pool: the staged output is not 16-byte aligned");
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
  if (stem_compiled_taps(taps) == 9)
    go(Nine{});
  else
    go(Any{});
}

// moments: the training forward's (nullptr in evaluation). early: what the blocks stage before their wait
// (enter_stem_block), beside the predecessor's tail.
template <bool kTrain>
void launch_stem_pool(const Exec& exec, const char* name, const Stem& st, const ForwardArgs& a, bool relu,
                      const double* moments, int32_t* argmax, void* y_staged, const Conv2dFilterStage& next,
                      Early early) {
  NT_CHECK(next.filters == nullptr || (y_staged != nullptr && next.w != nullptr), name,
           ": the next convolution's filters are staged beside its staged input only");
  NT_CHECK(a.y != nullptr || y_staged != nullptr, name, ": no output (y or y_staged)");
  const double staged_bytes = y_staged ? double(staged_element_bytes(exec.math)) : 0.0;
  const double y_bytes = (a.y ? 4.0 : 0.0) + staged_bytes;
  const double filter_bytes = next.filters ? double(next.k) * next.c * next.r * next.s * (4 + staged_bytes) : 0.0;
  const profile::OpCost cost{.bytes = st.x_bytes + st.pooled * (4 + y_bytes) + filter_bytes,
                             .flops = st.values * (2.0 * st.cv.taps + 4),
                             .overlaps_previous = early != Early::nothing};
  with_relu_taps(relu, st.cv.taps, [&](auto r, auto taps) {
    with_staged_element(exec.math, y_staged, [&](auto* staged) {
      using Staged = std::remove_pointer_t<decltype(staged)>;
      launch(exec, name, cost, stem_pool_forward_kernel<kTrain, decltype(r)::value, decltype(taps)::value, Staged>,
             stem_grid(st.sg, st.cv.taps), dim3(kThreads), st.smem, st.sg, a, st.cv, moments, argmax, staged, next,
             early);
    });
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
  NT_CHECK(reinterpret_cast<uintptr_t>(ws) % alignof(double) == 0,
           "conv_batchnorm_pool: the workspace is not 8-byte aligned");
  return {reinterpret_cast<double*>(ws), ws + stem_moment_floats(shape.conv, st.sg.parts.chunks)};
}

// The training forward's first pass: x's patch moments into ws.moments. Its wait comes first (x: the batch gather
// just before).
void launch_stem_moments(const Exec& exec, const Stem& st, const ConvBatchNormPoolShape& shape,
                         const StemWorkspace& ws) {
  const int entries = moment_entries(stem_compiled_taps(st.cv.taps));
  const BatchNormShape bn = shape.batchnorm();
  const double positions = double(bn.n * bn.hw);
  const profile::OpCost cost{st.x_bytes + double(st.sg.parts.chunks) * entries * 8, positions * 2.0 * entries};
  with_relu_taps(false, st.cv.taps, [&](auto, auto taps) {
    launch(exec, "conv_batchnorm_moments", cost, stem_moments_kernel<decltype(taps)::value>,
           dim3(1, static_cast<unsigned>(st.sg.parts.chunks)), dim3(kThreads), st.smem, st.sg, st.cv, ws.moments);
  });
}

}  // namespace

size_t conv_batchnorm_pool_workspace_floats(const ConvBatchNormPoolShape& s) {
  const BatchNormShape bn = s.batchnorm();
  check_batchnorm_pool(bn, s.pool());
  if (bn.c <= 0 || bn.n * bn.hw <= 0) return 0;
  const int64_t chunks = most_stem_chunks(s.conv);
  return static_cast<size_t>(stem_moment_floats(s.conv, chunks) + (2 + s.taps()) * chunks * bn.c);
}

void conv_batchnorm_pool_forward_train(const Exec& exec, const ConvBatchNormPoolArgs<float>& t) {
  const ConvBatchNormPoolShape& shape = t.shape;
  const BatchNormHyper& h = t.hyper;
  const BatchNormShape bn = shape.batchnorm();
  const int64_t count = bn.n * bn.hw;
  if (count == 1)
    throw Error(cat("conv_batchnorm_pool_forward_train: expected more than 1 value per channel when training, got n=",
                    bn.n, " hw=", bn.hw));
  if (bn.c == 0 || count == 0) return;
  const Stem st = make_stem(exec, t);
  NT_CHECK(t.workspace != nullptr, "conv_batchnorm_pool_forward_train needs conv_batchnorm_pool_workspace_floats()");
  const StemWorkspace ws = stem_workspace(st, shape, t.workspace);
  // No x or ws: the stem's kernels read x through StemConv and take the statistics from the moments.
  const ForwardArgs a{.gamma = t.gamma,
                      .beta = t.beta,
                      .y = t.y,
                      .save_mean = t.save_mean,
                      .save_invstd = t.save_invstd,
                      .running_mean = t.running_mean,
                      .running_var = t.running_var,
                      .num_batches_tracked = t.num_batches_tracked,
                      .eps = static_cast<float>(h.eps),
                      .momentum = static_cast<float>(h.momentum),
                      .count = static_cast<float>(count),
                      .count_m1 = static_cast<float>(count - 1)};
  if (!t.moments_ready) launch_stem_moments(exec, st, shape, ws);
  launch_stem_pool<true>(exec, "conv_batchnorm_pool_forward", st, a, h.relu, ws.moments, t.argmax, t.y_staged,
                         t.next_filters, t.moments_ready ? Early::x : Early::x_and_w);
}

void conv_batchnorm_pool_moments(const Exec& exec, const ConvBatchNormPoolArgs<float>& t) {
  const BatchNormShape bn = t.shape.batchnorm();
  if (bn.c == 0 || bn.n * bn.hw == 0) return;
  const Stem st = make_stem(exec, t);
  NT_CHECK(t.workspace != nullptr, "conv_batchnorm_pool_moments needs conv_batchnorm_pool_workspace_floats()");
  launch_stem_moments(exec, st, t.shape, stem_workspace(st, t.shape, t.workspace));
}

void conv_batchnorm_pool_forward_eval(const Exec& exec, const ConvBatchNormPoolArgs<float>& t) {
  const BatchNormHyper& h = t.hyper;
  const BatchNormShape bn = t.shape.batchnorm();
  if (bn.c == 0 || bn.n * bn.hw == 0) return;
  const Stem st = make_stem(exec, t);
  const ForwardArgs a{.gamma = t.gamma,
                      .beta = t.beta,
                      .y = t.y,
                      .eval_mean = t.running_mean,
                      .eval_var = t.running_var,
                      .eps = static_cast<float>(h.eps)};
  launch_stem_pool<false>(exec, "conv_batchnorm_pool_eval", st, a, h.relu, nullptr, t.argmax, t.y_staged,
                          t.next_filters, Early::nothing);
}

void conv_batchnorm_pool_backward(const Exec& exec, const ConvBatchNormPoolArgs<float>& t) {
  const ConvBatchNormPoolShape& shape = t.shape;
  const BatchNormHyper& h = t.hyper;
  const BatchNormShape bn = shape.batchnorm();
  const int64_t count = bn.n * bn.hw;
  if (bn.c == 0 || count == 0) return;
  const Stem st = make_stem(exec, t);
  NT_CHECK(t.workspace != nullptr, "conv_batchnorm_pool_backward needs conv_batchnorm_pool_workspace_floats()");
  NT_CHECK(!h.relu || t.y != nullptr || t.y_staged != nullptr,
           "conv_batchnorm_pool_backward with relu needs the pooled forward output y");
  NT_CHECK(t.argmax != nullptr && t.dw != nullptr, "conv_batchnorm_pool_backward needs the forward's argmax and dw");
  const StemWorkspace ws = stem_workspace(st, shape, t.workspace);
  const BackwardArgs b{.y = h.relu ? t.y : nullptr,
                       .dy = t.dy,
                       .gamma = t.gamma,
                       .save_mean = t.save_mean,
                       .save_invstd = t.save_invstd,
                       .dgamma = t.dgamma,
                       .dbeta = t.dbeta,
                       .ws = ws.partials,
                       .count = static_cast<float>(count)};
  const int chunks = st.sg.parts.chunks, taps = st.cv.taps, entries = moment_entries(stem_compiled_taps(taps));
  const double y_bytes = t.y ? 4.0 : double(staged_element_bytes(exec.math));
  const double pooled_bytes = 8 + (h.relu ? y_bytes : 0);  // dy, argmax (and y) per pooled output
  const bool beside = exec.programmatic_launch && t.overlaps_previous;
  const profile::OpCost reduce_cost{
      .bytes = st.x_bytes + st.pooled * pooled_bytes + double(chunks) * bn.c * (2 + taps) * 4,
      .flops = st.pooled * (4.0 * taps + 3),
      .overlaps_previous = beside};
  const profile::OpCost weight_cost{double(chunks) * (entries * 8 + bn.c * (2 + taps) * 4) + double(bn.c) * taps * 4,
                                    double(chunks) * entries + double(bn.c) * taps * (2.0 * taps + 8)};
  // Beside the kernel before (`beside`, above) where that one is declared to touch only its own layer's workspace
  // and gradients (overlaps_previous: the cnn's conv2 ends its backward with dW's split-K reduction).
  with_relu_taps(h.relu, taps, [&](auto relu, auto compiled) {
    constexpr bool kRelu = decltype(relu)::value;
    constexpr int Taps = decltype(compiled)::value;
    with_staged_element(exec.math, h.relu && !t.y ? t.y_staged : nullptr, [&](auto* staged) {
      using Staged = std::remove_pointer_t<decltype(staged)>;
      launch(exec, "conv_batchnorm_pool_backward_reduce", reduce_cost,
             stem_pool_backward_reduce_kernel<kRelu, Taps, Staged>, stem_grid(st.sg, taps), dim3(kThreads), st.smem,
             st.sg, b, st.cv, t.argmax, static_cast<const Staged*>(staged), beside);
    });
    launch(exec, "conv_batchnorm_pool_backward_weight", weight_cost, stem_weight_kernel<Taps>,
           dim3(static_cast<unsigned>(div_up<int64_t>(bn.c, kWarps))), dim3(kThreads), 0, st.sg, b, st.cv, ws.moments,
           t.dw);
  });
}

}  // namespace nt::kernels::cuda
