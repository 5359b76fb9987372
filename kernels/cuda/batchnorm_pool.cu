// BatchNorm2d with a fused max-pool on the GPU, fp32, NCHW (contract in kernels/batchnorm.h, batchnorm_pool_*; CPU
// twin kernels/cpu/batchnorm.cpp): BatchNorm2d (+ ReLU) then MaxPool2d(window, stride = window) without the
// full-resolution output. The forward normalizes each window of x and writes only its maximum and argmax; the
// backward's dy' is the pooled gradient at the argmax (through the ReLU as pooled y > 0, which is y > 0 there) and 0
// elsewhere, so the reduction visits the pooled outputs only: S1 = Σ g, S2 = Σ g·(x[argmax] - mean), and the apply
// writes every dx from x and the window that covers it. Everything is written with `=`.
//
// The statistics are the unfused op's (batchnorm.cu, whose top comment states the math, the numerics and the
// reduction orders): the same nchw_stats_kernel (batchnorm_passes.cuh), planned with kMinElemsPerBlockPooled.
// Passes (launches):
//   forward_train  stats → pool (the pool block's warp 0 first combines its channel's partials, blocks p == 0 write
//                  save_*, running_* and num_batches_tracked; then each thread normalizes windows and writes their
//                  maximum and argmax); with given statistics, pool alone.
//   forward_eval   pool, from the running statistics.
//   backward       reduce over the pooled outputs → apply over the windows' cells (warp 0 finalizes the channel);
//                  with a staged dx (BF16 channels-last, for a convolution before it under --bf16), reduce → the
//                  staged apply (8 channels a block, through shared memory); without dx, reduce → finalize.
// A window is scanned row-major and an element replaces the best when larger or NaN (maxpool2d's rule).
// Workspace (floats): the statistics' partials, 3·P·C with P = plan_chunks(s, kMinElemsPerBlockPooled); the
// backward's 2·P'·C partials (P' <= P chunks of pooled outputs) fit in it. Synchronized, then the exchange's
// sync_floats: the forward gathers every rank's statistics and the backward averages its partial sums over the
// ranks, as the unfused op does (batchnorm.cu).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/batchnorm.h"
#include "kernels/cuda/batchnorm_params.cuh"
#include "kernels/cuda/batchnorm_passes.cuh"
#include "kernels/cuda/fast_divmod.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/staged_activation.cuh"

namespace nt::kernels::cuda {

namespace {

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
  // The forward's chunks of the same outputs: it writes no partials, so its launcher plans its grid alone
  // (one_wave_chunks); the same as the backward's until then.
  int64_t forward_chunk = 0;
  int forward_chunks = 0;
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
  if constexpr (kPairs)
    return __ldcs(reinterpret_cast<const float2*>(p));
  else
    return make_float2(__ldcs(p), __ldcs(p + 1));
}
template <bool kPairs>
__device__ __forceinline__ void store_pair(float* p, float2 v) {
  if constexpr (kPairs)
    __stcs(reinterpret_cast<float2*>(p), v);
  else
    __stcs(p, v.x), __stcs(p + 1, v.y);
}

// Pooled outputs a forward thread fetches before it normalizes them: the first round is in flight while warp 0
// finalizes the channel, and the loads of a round overlap one another.
constexpr int kForwardAhead = 4;

// grid (C, forward chunks): block (c, p) writes the maxima and argmax of channel c's pooled outputs
// [p·L, (p+1)·L), L = pg.forward_chunk. kTrain: warp 0 finalizes the channel from the statistics' partials (blocks
// p == 0 store save_*/running_*), else the parameters come from the running statistics. kWindow: the window (0:
// pg.window at run time); 2 reads each window row as a pair (kPairs: 8-byte loads, w even and x 8-byte aligned).
// A thread takes outputs j, j + kThreads, ... in rounds of kForwardAhead, each round's windows fetched together.
// The window is scanned row-major and an element replaces the best when larger or NaN (maxpool2d's rule).
template <bool kTrain, bool kRelu, int kWindow, bool kPairs>
__global__ void __launch_bounds__(kThreads)
    nchw_pool_forward_kernel(const Geometry g, const PoolGeometry pg, const ForwardArgs a, int32_t* argmax,
                             StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int64_t c = blockIdx.x;
  const int p = blockIdx.y;
  const int win = kWindow > 0 ? kWindow : pg.window;
  const int64_t begin = int64_t(p) * pg.forward_chunk, end = std::min(pg.extent, begin + pg.forward_chunk);

  // A pooled output's place and (window 2) its window's two rows.
  struct Window {
    int64_t out = 0, plane = 0;
    int first = 0;  // the window's top-left element in the plane
    float2 top = make_float2(0.f, 0.f), bottom = make_float2(0.f, 0.f);
  };
  Window ahead[kForwardAhead];
  auto fetch_round = [&](int64_t j0) {
#pragma unroll
    for (int k = 0; k < kForwardAhead; ++k) {
      const int64_t j = j0 + int64_t(k) * kThreads;
      if (j >= end) break;
      Window& at = ahead[k];
      int i, jq;
      pooled_at(pg, g.C, c, static_cast<int>(j), at.out, at.plane, i, jq);
      at.first = i * win * pg.w + jq * win;
      if constexpr (kWindow == 2) {
        at.top = load_pair<kPairs>(a.x + at.plane + at.first);
        at.bottom = load_pair<kPairs>(a.x + at.plane + at.first + pg.w);
      }
    }
  };
  int64_t j0 = begin + threadIdx.x;
  fetch_round(j0);

  const FwdParams f = channel_forward_params<kTrain>(g, a, c, p);

  for (; j0 < end; j0 += int64_t(kForwardAhead) * kThreads) {
#pragma unroll
    for (int k = 0; k < kForwardAhead; ++k) {
      if (j0 + int64_t(k) * kThreads >= end) break;
      const Window& at = ahead[k];
      float best = -INFINITY;
      int best_at = at.first;
      auto consider = [&](float x, int e) {
        const float v = normalize<kRelu>(x, f);
        if (v > best || isnan(v)) best = v, best_at = e;
      };
      if constexpr (kWindow == 2) {
        consider(at.top.x, at.first), consider(at.top.y, at.first + 1);
        consider(at.bottom.x, at.first + pg.w), consider(at.bottom.y, at.first + pg.w + 1);
      } else {
        for (int r = 0; r < win; ++r)
          for (int s = 0; s < win; ++s)
            consider(__ldcs(a.x + at.plane + at.first + r * pg.w + s), at.first + r * pg.w + s);
      }
      __stcs(a.y + at.out, best);
      __stcs(argmax + at.out, best_at);
    }
    fetch_round(j0 + int64_t(kForwardAhead) * kThreads);
  }
}

// grid (C, P'): block (c, p) writes (S1, S2) of channel c over pooled outputs [p·L, (p+1)·L) (layout pg.parts).
template <bool kRelu>
__global__ void __launch_bounds__(kThreads)
    nchw_pool_backward_reduce_kernel(const PoolGeometry pg, const BackwardArgs b, const int32_t* argmax,
                                     StampRing stamps) {
  begin_dependent_kernel(stamps);
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
    nchw_pool_backward_apply_kernel(const PoolGeometry pg, const BackwardArgs b, const int32_t* argmax,
                                    StampRing stamps) {
  begin_dependent_kernel(stamps);
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
        store_pair<true>(b.dx + plane + e,
                         make_float2(dx_of(e == chosen ? d : 0.f, x.x, f), dx_of(e + 1 == chosen ? d : 0.f, x.y, f)));
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

// The backward's dx staged for the convolution before (BatchNormArgs::dx_staged: channels-last in TF32 or BF16,
// kernels/conv.h 'Staged operands'): nchw_pool_backward_apply_kernel's values, transposed through shared memory so that
// the NCHW reads and the channels-last stores both coalesce. The work is items of (image, band of cell rows) and groups
// of kStagedChannels channels; grid (item ranges, channel groups). A block first finalizes its channels (warp j channel
// c0 + j, as the apply kernel's warp 0 does; the blocks of item range 0 store dgamma/dbeta), then for each item:
//   1. a thread per (channel, cell), cells fastest (reads along x's rows, as the apply kernel's): the window's argmax,
//      dy (and y) once, then dx of each of the cell's elements into tile[element][channel];
//   2. a thread per element: its 8 channels in one 16-byte store of BF16, or two of TF32 (staged_activation.cuh).
// Eight channels a block, not more: a block of 32 (a warp finalizing four in turn, four times fewer blocks) took
// 17.6 µs at the cnn's batch 64 on an H200, against 4.4 for the apply kernel it replaces (docs/bf16.md).
constexpr int kStagedChannels = 8;        // 16 bytes of BF16, 32 of TF32; a warp of the block finalizes each
constexpr int kStagedTileFloats = 4096;   // 16 KB: the cnn's 14x14 plane in one band, 28x28 in two
constexpr int kStagedTargetBlocks = 528;  // four blocks an SM of a 132-SM H100/H200
struct StagedGeometry {
  int band_cells = 0;  // cell rows of a band
  int bands = 0;       // bands of a plane
  int per_block = 0;   // items of a block
  int64_t items = 0;   // images x bands
};

template <bool kRelu, int kWindow, class Staged>
__global__ void __launch_bounds__(kThreads)
    nchw_pool_backward_staged_kernel(const PoolGeometry pg, const StagedGeometry sg, const BackwardArgs b,
                                     const int32_t* argmax, Staged* dx_staged, StampRing stamps) {
  begin_dependent_kernel(stamps);
  static_assert(kThreads / kWarpSize == kStagedChannels, "a warp finalizes each channel");
  constexpr int cb = kStagedChannels, ld = cb + 1;  // the tile's row stride: conflict-free column writes
  __shared__ float tile[kStagedTileFloats];         // [element of the band][channel]
  __shared__ BwdParams params[kStagedChannels];
  const int64_t C = pg.parts.C, c0 = int64_t(blockIdx.y) * cb;
  const int win = kWindow > 0 ? kWindow : pg.window;
  {
    const int k = threadIdx.x / kWarpSize;
    const BwdParams f = finalize_backward(pg.parts, b, c0 + k, blockIdx.x == 0);
    if (threadIdx.x % kWarpSize == 0) params[k] = f;
  }
  __syncthreads();
  const int64_t plane = int64_t(pg.h) * pg.w, pooled_plane = int64_t(pg.p) * pg.q;
  const int64_t first = int64_t(blockIdx.x) * sg.per_block, last = std::min(sg.items, first + sg.per_block);
  for (int64_t item = first; item < last; ++item) {
    const int64_t img = item / sg.bands;
    const int ci0 = static_cast<int>(item % sg.bands) * sg.band_cells, cells_h = min(sg.band_cells, pg.ch - ci0);
    const int h0 = ci0 * win, elements = min(pg.h - h0, cells_h * win) * pg.w, cells = cells_h * pg.cw;
    for (int i = threadIdx.x; i < cb * cells; i += kThreads) {
      const int k = i / cells, cell = i % cells, ci = ci0 + cell / pg.cw, cj = cell % pg.cw;
      const int64_t c = c0 + k;
      int chosen = -1;  // where no window covers the cell, every dy' is 0
      float d = 0.f;
      if (ci < pg.p && cj < pg.q) {
        const int64_t out = (img * C + c) * pooled_plane + int64_t(ci) * pg.q + cj;
        chosen = __ldg(argmax + out);
        d = __ldg(b.dy + out);
        if constexpr (kRelu) d = __ldg(b.y + out) > 0.f ? d : 0.f;
      }
      const float* x = b.x + (img * C + c) * plane;
      for (int r = 0; r < win; ++r)
        for (int t = 0; t < win; ++t) {
          const int h = ci * win + r, w = cj * win + t;
          if (h >= pg.h || w >= pg.w) continue;  // a partial cell at the plane's edge
          const int e = h * pg.w + w;
          tile[((h - h0) * pg.w + w) * ld + k] = dx_of(e == chosen ? d : 0.f, __ldcs(x + e), params[k]);
        }
    }
    __syncthreads();
    Staged* to = dx_staged + (img * plane + int64_t(h0) * pg.w) * C + c0;
    for (int e = threadIdx.x; e < elements; e += kThreads) {
      const float* from = tile + e * ld;
      float v[cb];
#pragma unroll
      for (int j = 0; j < cb; ++j) v[j] = from[j];
      store_staged<cb>(to + int64_t(e) * C, v);
    }
    __syncthreads();  // the tile is read before the next item writes it
  }
}

StagedGeometry make_staged_geometry(const BatchNormShape& s, const PoolGeometry& pg) {
  StagedGeometry sg;
  const int cell_row_floats = pg.window * pg.w * (kStagedChannels + 1);
  NT_CHECK(cell_row_floats <= kStagedTileFloats, "batchnorm_pool_backward: a staged dx of ", pg.w,
           "-wide planes exceeds the kernel's tile");
  sg.band_cells = std::min(pg.ch, kStagedTileFloats / cell_row_floats);
  sg.bands = static_cast<int>(div_up<int64_t>(pg.ch, sg.band_cells));
  sg.items = s.n * sg.bands;
  const int64_t groups = s.c / kStagedChannels;
  sg.per_block = static_cast<int>(div_up<int64_t>(sg.items, std::max<int64_t>(1, kStagedTargetBlocks / groups)));
  return sg;
}

// ---- launchers ---------------------------------------------------------------------------------------

// `extent` items in at most `chunks` chunks of equal length: the length, and how many chunks that makes.
void cut(int64_t extent, int64_t chunks, int64_t& chunk, int& count) {
  chunk = div_up<int64_t>(extent, std::max<int64_t>(1, chunks));
  count = static_cast<int>(div_up<int64_t>(extent, chunk));
}

// The pooled outputs and the cells are chunked as the full-resolution statistics pass (plan_chunks(s,
// kMinElemsPerBlockPooled) chunks per channel, or fewer), so every block reads about the same share of x and the
// backward's partials fit the workspace.
PoolGeometry make_pool_geometry(const BatchNormShape& s, const BatchNormPool& pool) {
  PoolGeometry pg;
  pg.h = pool.h, pg.w = pool.w, pg.window = pool.window, pg.p = pool.p(), pg.q = pool.q();
  pg.ch = static_cast<int>(div_up<int64_t>(pool.h, pool.window)),
  pg.cw = static_cast<int>(div_up<int64_t>(pool.w, pool.window));
  pg.extent = s.n * pg.p * pg.q;
  pg.cell_extent = s.n * pg.ch * pg.cw;
  NT_CHECK(s.n * s.hw < (int64_t(1) << 31) && s.c < (int64_t(1) << 31), "batchnorm_pool: n·h·w = ", s.n * s.hw,
           " exceeds the kernels' 32-bit index range");
  const int64_t planned = plan_chunks(s, kMinElemsPerBlockPooled);
  cut(pg.extent, planned, pg.chunk, pg.chunks);
  cut(pg.extent, planned, pg.forward_chunk, pg.forward_chunks);
  cut(pg.cell_extent, planned, pg.cell_chunk, pg.cell_chunks);
  pg.parts.C = s.c, pg.parts.chunks = pg.chunks;
  pg.by_pq = FastDivmod(pg.p * pg.q), pg.by_q = FastDivmod(pg.q);
  pg.by_cells = FastDivmod(pg.ch * pg.cw), pg.by_cw = FastDivmod(pg.cw);
  return pg;
}

dim3 pool_grid(const PoolGeometry& pg) {
  return dim3(static_cast<unsigned>(pg.parts.C), static_cast<unsigned>(pg.chunks));
}
dim3 forward_grid(const PoolGeometry& pg) {
  return dim3(static_cast<unsigned>(pg.parts.C), static_cast<unsigned>(pg.forward_chunks));
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
  if (window == 2 && pairs)
    go(W2{}, std::true_type{});
  else if (window == 2)
    go(W2{}, std::false_type{});
  else
    go(W0{}, std::false_type{});
}

bool aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

// The forward's chunks of a channel's `extent` pooled outputs (it writes no partials, so any grid serves): one wave of
// its blocks over the C channels, since each block first finalizes its channel, a fixed cost that a second wave
// would pay again; and no block with fewer outputs than threads. H200, the cnn's second BatchNorm at batch 64: the
// partials' grid, 768 blocks of one output a thread (1.45 waves), took 6.2 µs; one wave of 256 blocks, 3.8. The
// backward apply on the same plan (its 768 blocks to 640) moved nothing, 4.43 µs either way, and keeps its grid.
int one_wave_chunks(int64_t extent, int64_t channels, int resident) {
  const int64_t wave = std::max<int64_t>(1, resident / std::max<int64_t>(1, channels));
  return static_cast<int>(std::max<int64_t>(1, std::min(wave, extent / kThreads)));
}

// The pooled forward (kTrain) or evaluation launch, window rows as 8-byte pairs where w is even and x aligned.
template <bool kTrain>
void launch_pool_forward(const Exec& exec, const char* name, const profile::OpCost& cost, const Geometry& g,
                         const PoolGeometry& pg, const ForwardArgs& a, bool relu, int32_t* argmax) {
  with_relu_window(relu, pg.window, pg.w % 2 == 0 && aligned8(a.x), [&](auto r, auto window, auto pairs) {
    const auto kernel =
        nchw_pool_forward_kernel<kTrain, decltype(r)::value, decltype(window)::value, decltype(pairs)::value>;
    PoolGeometry planned = pg;
    const int chunks =
        one_wave_chunks(pg.extent, pg.parts.C, resident_blocks(reinterpret_cast<const void*>(kernel), kThreads));
    cut(pg.extent, chunks, planned.forward_chunk, planned.forward_chunks);
    launch(exec, name, cost, kernel, forward_grid(planned), dim3(kThreads), 0, g, planned, a, argmax);
  });
}

}  // namespace

size_t batchnorm_pool_workspace_floats(const BatchNormShape& s, const BatchNormPool& pool, int ranks) {
  check_batchnorm_pool(s, pool);
  if (s.c <= 0 || s.n * s.hw <= 0) return 0;
  // The statistics' partials, then a synchronized call's exchange.
  return static_cast<size_t>(3 * plan_chunks(s, kMinElemsPerBlockPooled) * s.c) + sync_floats(s, ranks);
}

void batchnorm_pool_forward_train(const Exec& exec, const BatchNormArgs<float>& args) {
  const BatchNormShape& s = args.shape;
  const ChannelPartials& given = args.given;
  check_batchnorm_pool(s, args.pool);
  const int64_t count = s.n * s.hw;
  if (count == 1)
    throw Error(cat("batchnorm_pool_forward_train: expected more than 1 value per channel when training, got n=", s.n,
                    " hw=", s.hw));
  if (s.c == 0 || count == 0) return;
  NT_CHECK(args.workspace != nullptr,
           "batchnorm_pool_forward_train needs batchnorm_pool_workspace_floats() of workspace");
  const bool vec = s.hw % 4 == 0 && aligned16(args.x);
  const Geometry g = make_geometry(s, Layout::nchw, vec ? 4 : 1, kMinElemsPerBlockPooled);
  const PoolGeometry pg = make_pool_geometry(s, args.pool);
  const double elems = double(count) * double(s.c), pooled = double(pg.extent) * double(s.c);
  const profile::OpCost stats_cost{elems * 4, elems * 3};
  const profile::OpCost apply_cost{elems * 4 + pooled * 8, elems * 4};
  // The statistics' partials: given, or the statistics pass's in the workspace; synchronized, every rank's.
  ChannelPartials stats = given;
  if (stats.chunks == 0) {
    launch(exec, "batchnorm_stats_nchw", stats_cost, vec ? nchw_stats_kernel<4> : nchw_stats_kernel<1>,
           grid_of(g, Layout::nchw), dim3(kThreads), 0, g, args.x, args.workspace);
    stats = {args.workspace, g.chunks};
  }
  if (synchronized(args))
    stats = gather_statistics(exec, *args.group, given_parts(g, stats), stats.data,
                              args.workspace + batchnorm_pool_workspace_floats(s, args.pool, 1));
  launch_pool_forward<true>(exec, "batchnorm_pool_forward_nchw", apply_cost, given_parts(g, stats), pg,
                            train_args(args, stats.data), args.hyper.relu, args.argmax);
}

void batchnorm_pool_forward_eval(const Exec& exec, const BatchNormArgs<float>& args) {
  const BatchNormShape& s = args.shape;
  check_batchnorm_pool(s, args.pool);
  if (s.c == 0 || s.n * s.hw == 0) return;
  const PoolGeometry pg = make_pool_geometry(s, args.pool);
  const ForwardArgs a = eval_args(args);
  const double elems = double(s.n * s.hw) * double(s.c), pooled = double(pg.extent) * double(s.c);
  const profile::OpCost cost{elems * 4 + pooled * 8, elems * 4};
  // Only the channel count of the geometry is read: the parameters come from running_*.
  launch_pool_forward<false>(exec, "batchnorm_pool_eval_nchw", cost, pg.parts, pg, a, args.hyper.relu, args.argmax);
}

void batchnorm_pool_backward(const Exec& exec, const BatchNormArgs<float>& args) {
  const BatchNormShape& s = args.shape;
  const BatchNormPool& pool = args.pool;
  const bool with_relu = args.hyper.relu;
  const int32_t* argmax = args.argmax;  // read only here
  check_batchnorm_pool(s, pool);
  const int64_t count = s.n * s.hw;
  if (s.c == 0 || count == 0 || (!args.dx && !args.dx_staged && !args.dgamma && !args.dbeta)) return;
  NT_CHECK(args.workspace != nullptr, "batchnorm_pool_backward needs batchnorm_pool_workspace_floats() of workspace");
  NT_CHECK(!with_relu || args.y != nullptr, "batchnorm_pool_backward with relu needs the pooled forward output y");
  NT_CHECK(argmax != nullptr, "batchnorm_pool_backward needs the forward's argmax");
  NT_CHECK(!args.dx_staged || stages_activations(exec.math),
           "batchnorm_pool_backward: a staged dx needs TF32 or BF16 math (fp32 stages nothing)");
  NT_CHECK(!args.dx_staged || (s.c % 8 == 0 && aligned16(args.dx_staged)),
           "batchnorm_pool_backward: a staged dx needs channels a multiple of 8 and 16-byte aligned memory, got ", s.c,
           " channels");
  const PoolGeometry pg = make_pool_geometry(s, pool);
  const BackwardArgs b = backward_args(args);
  const double elems = double(count) * double(s.c), pooled = double(pg.extent) * double(s.c);
  const double pooled_reads = with_relu ? 3 : 2;  // dy, argmax (and y) per pooled output
  const profile::OpCost reduce_cost{pooled * 4 * (pooled_reads + 1), pooled * 3};
  const profile::OpCost apply_cost{elems * 8 + pooled * 4 * pooled_reads, elems * 5};
  const double staged_bytes = args.dx_staged ? double(staged_element_bytes(exec.math)) : 0.0;
  const profile::OpCost staged_cost{elems * (4 + staged_bytes) + pooled * 4 * pooled_reads, elems * 5};
  const profile::OpCost finalize_cost{double(pg.chunks) * double(s.c) * 8, double(pg.chunks) * double(s.c) * 2};
  const bool pairs = pool.w % 2 == 0 && aligned8(args.x) && aligned8(args.dx);
  with_relu_window(with_relu, pool.window, pairs, [&](auto relu, auto window, auto pairs_choice) {
    constexpr bool kRelu = decltype(relu)::value;
    launch(exec, "batchnorm_pool_backward_reduce_nchw", reduce_cost, nchw_pool_backward_reduce_kernel<kRelu>,
           pool_grid(pg), dim3(kThreads), 0, pg, b, argmax);
    if (synchronized(args)) args.group->all_reduce_mean(exec, args.workspace, size_t(2 * pg.chunks * s.c));
    if (args.dx_staged) {
      const StagedGeometry sg = make_staged_geometry(s, pg);
      with_staged_element(exec.math, args.dx_staged, [&](auto* staged) {
        launch(
            exec, "batchnorm_pool_backward_staged", staged_cost,
            nchw_pool_backward_staged_kernel<kRelu, decltype(window)::value, std::remove_pointer_t<decltype(staged)>>,
            dim3(static_cast<unsigned>(div_up<int64_t>(sg.items, sg.per_block)),
                 static_cast<unsigned>(s.c / kStagedChannels)),
            dim3(kThreads), 0, pg, sg, b, argmax, staged);
      });
    } else if (args.dx) {
      launch(exec, "batchnorm_pool_backward_nchw", apply_cost,
             nchw_pool_backward_apply_kernel<kRelu, decltype(window)::value, decltype(pairs_choice)::value>,
             cell_grid(pg), dim3(kThreads), 0, pg, b, argmax);
    } else {
      launch_finalize_backward(exec, finalize_cost, pg.parts, b);
    }
  });
}

}  // namespace nt::kernels::cuda
