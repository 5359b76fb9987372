// The forward convolution's epilogue through shared memory, shared by the implicit-GEMM kernels of
// kernels/cuda/conv.cu and the channels-last kernel of kernels/cuda/conv_channels_last.cu: the finished tile is
// staged, y is written from there a row of pixels per store instruction, and with a statistics buffer each block
// also writes its channels' BatchNorm partials.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/conv_passes.cuh"
#include "kernels/cuda/mma_tf32.cuh"

namespace nt::kernels::cuda::conv_epilogue {

// ---- the epilogue through shared memory, and BatchNorm statistics there ------------------------------------
// A forward without a split stages its finished tile (bias added: the values stored) in shared memory, row
// stride kStagedLd, and writes y from there a row of pixels per store instruction
// (store_staged, faster in the cnn's step: docs/conv.md, 'The forward's epilogue: y through shared memory'). With
// a.stats a block also writes, for each of its output channels (tile rows), (mean, M2, count) of y over its
// tile's pixels (valid columns) as the partial of chunk blockIdx.x (kernels/conv.h, ChannelPartials): the
// BatchNorm after the convolution then combines gridDim.x partials per channel instead of reading y once more.
// L = the largest power of two <= threads / BM threads share a row, each a run of BN / L columns, summed shifted
// by the row's first value K (s1 = Σ(v − K), s2 = Σ(v − K)²: K lies among the values, so s2 does not swamp M2),
// their shares joined by an xor butterfly; lane 0 of the row writes mean = K + s1/n and M2 = max(s2 − s1²/n, 0).
// Fixed orders: deterministic.

// The staged tile's row stride: BN + 1, so the L threads of 32 / L consecutive rows read distinct banks.
template <int BN>
constexpr int kStagedLd = BN + 1;

template <int BM, int BN, int kThreads>
__device__ void store_tile_statistics(const ConvArgs& a, const float* tile, int m0, int n0) {
  constexpr int kLanes = kThreads / BM >= 4 ? 4 : kThreads / BM >= 2 ? 2 : 1;  // per row, a power of two
  constexpr int kRun = BN / kLanes, kLd = kStagedLd<BN>;
  static_assert(BN % kLanes == 0 && (BM * kLanes) % 32 == 0, "tile statistics: whole warps, whole runs");
  if (threadIdx.x >= BM * kLanes) return;  // whole warps
  const int row = threadIdx.x / kLanes, first = (threadIdx.x % kLanes) * kRun;
  const int valid = min(BN, a.N - n0);
  const float* v = tile + row * kLd;
  const float shift = v[0];
  float s1 = 0.f, s2 = 0.f;
#pragma unroll
  for (int c = first; c < first + kRun; ++c) {
    const float d = c < valid ? v[c] - shift : 0.f;
    s1 += d, s2 = fmaf(d, d, s2);
  }
#pragma unroll
  for (int o = kLanes / 2; o >= 1; o /= 2)
    s1 += __shfl_xor_sync(0xffffffffu, s1, o), s2 += __shfl_xor_sync(0xffffffffu, s2, o);
  const int m = m0 + row;
  if (first == 0 && m < a.M) {
    const float n = static_cast<float>(valid), d = s1 / n;
    const size_t chunks = gridDim.x, at = static_cast<size_t>(m) * chunks + blockIdx.x, field = chunks * a.M;
    a.stats[at] = shift + d, a.stats[field + at] = fmaxf(s2 - s1 * d, 0.f), a.stats[2 * field + at] = n;
  }
}

// A finished tile (Pass::kStaged: the forward), staged in shared memory (row stride kStagedLd), to its NCHW place:
// warp w stores tile rows (channels) w, w + warps, ..., lane l columns (pixels) l, l + 32, ...: each store
// instruction writes 32 consecutive pixels of one channel (an image boundary splits it in two), where the
// accumulators' own layout writes 8 channels' scattered pairs, half of each 32-byte sector. Every thread calls it.
template <class Pass, int BM, int BN, int kThreads>
__device__ void store_staged(const ConvArgs& a, const float* tile, int m0, int n0, const int4* columns) {
  constexpr int kAllWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, plane = Pass::plane(a);
  for (int r = threadIdx.x / 32; r < BM && m0 + r < a.M; r += kAllWarps)
#pragma unroll
    for (int cl = lane; cl < BN; cl += 32)
      if (n0 + cl < a.N) a.out[columns[cl].w + (m0 + r) * plane] = tile[r * kStagedLd<BN> + cl];
}

// C(row, col) of the tile, finished, into the staged tile (rows past M take row M-1's bias: never stored).
template <class Pass, int BN>
__device__ __forceinline__ void stage(const ConvArgs& a, float* tile, int m0, int row, int col, float v) {
  tile[row * kStagedLd<BN> + col] = Pass::finish(a, min(m0 + row, a.M - 1), v);
}

// A warp's MMA accumulators (the m16n8 C fragments of mma_tf32.cuh, which the BF16 MMA shares), its piece at (wm, wn)
// of the block tile, finished into the staged tile.
template <class Pass, int BN, int kTilesM, int kTilesN>
__device__ __forceinline__ void stage_accumulators(const ConvArgs& a, float* tile, int m0, int wm, int wn,
                                                   const float (&acc)[kTilesM][kTilesN][4]) {
#pragma unroll
  for (int i = 0; i < kTilesM; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
      for (int j = 0; j < kTilesN; ++j)
        stage<Pass, BN>(a, tile, m0, wm + 16 * i + mma_tf32::row_of(e), wn + 8 * j + mma_tf32::col_of(e), acc[i][j][e]);
}

// After every thread has staged its part of the tile: y from the staged tile, and with a.stats its statistics.
template <class Pass, int BM, int BN, int kThreads>
__device__ __forceinline__ void write_staged(const ConvArgs& a, const float* tile, int m0, int n0,
                                             const int4* columns) {
  __syncthreads();
  store_staged<Pass, BM, BN, kThreads>(a, tile, m0, n0, columns);
  if (a.stats) store_tile_statistics<BM, BN, kThreads>(a, tile, m0, n0);  // forward only (a.stats)
}

}  // namespace nt::kernels::cuda::conv_epilogue
