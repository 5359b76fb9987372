// The persistent mlp step on the GPU (kernels/persistent_mlp.h), design B of docs/persistent-mlp.md: one cooperative
// launch of `groups` clusters of kClusterBlocks blocks (one block an SM) runs every step. Each cluster holds a whole
// copy of the weights in its blocks' shared memory and runs one group of the batch's rows through every layer; once a
// step the groups' gradients are summed in a fixed order and every weight takes its step.
//
// Ownership. Block k of a cluster owns hidden layer l's neurons [k·own(l), min(N, (k+1)·own(l))), N = w[l+1],
// own(l) = ceil(N / kClusterBlocks): their rows of W[l] and b[l], and the same columns of W[l+1] when layer l+1 is
// hidden too (a second copy, refreshed from the same tensor). Every block holds the whole head W[L-1], b[L-1]
// (C ≤ 32 rows). Cluster q runs the batch's rows [q·chunk, min(B, (q+1)·chunk)) (persistent_mlp_chunk). Shared memory,
// in floats (chunk rows where the batch appears):
//   rows W[l] (own·w[l]), b[l]        columns of W[l+1] as [i][n] (own(l)·w[l+2])        head W[L-1], b[L-1]
//   dlogits (chunk·C)   mine (chunk·own_max): the gradient at the block's own neurons   own_act (chunk·own_max): theirs
//   pixel_lut (256 a plane)   batch_row, batch_label (kWindowSteps·chunk each: the group's rows of 16 steps)
//   batch_pixels (2 × chunk·D bytes where they fit: this step's images, and the next's arriving)
//   stage (the rest, up to chunk·stage_width)
// The optimizer's state (velocities, or Adam's moments) stays in the engine's tensors: only the update touches it.
// Activations a[l] and the gradients d[l] at hidden outputs go through the workspace (L2): each block writes its own
// columns of its cluster's rows, and after a cluster barrier (release and acquire at cluster scope) every block of
// the cluster reads whole rows with ld.global.cg (another SM wrote them; this SM's L1 may hold an older line). The wide
// dot products run in dot16's order as 16-lane register tiles (tiled_dots), the weight gradients as tiles of outputs
// × four k (add_gradient_partial).
//
// A step of cluster q, L = layers:
//   forward l = 0..L-2  stage the group's rows of a[l] (l = 0: gather and normalize); own outputs  cluster barrier
//   head                every block the same bits: logits, softmax, d at own neurons of layer L-2; rank 0 writes the
//                       rows' losses, the last rank the head's partial gradient; every block its rows' partial of
//                       layer L-2                                                        cluster barrier if L > 2
//   back l = L-2..1     d[l-1] at own neurons from the column copy of W[l]; the rows' partial of layer l-1
//                                                                                        cluster barrier if l > 1
//                                                                                        grid barrier
//   sum and update      every parameter in a block's share: Σ_q partial[q] (q increasing), its SGD or Adam step,
//                       into the engine's tensors; the last block adds the batch's losses   grid barrier
//   reload              every block its rows, columns and head from the tensors (after every step but the last)
// Each gradient comes from the weights before the step (the tensors change only in the update), in
// kernels/persistent_mlp_math.h's order: within a group the chain in increasing b runs in one thread (its partial in
// the workspace is carried from one staged slice of rows to the next by the same thread), across groups the update's
// sum.
//
// The loss: the last block adds the batch's row losses in double, in increasing b, to *loss_sum, and the hits to
// *correct.
#include <cooperative_groups.h>

#include <algorithm>
#include <iterator>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/grid_barrier.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/persistent_mlp.h"
#include "kernels/persistent_mlp_math.h"
#include "profile/phase_stamps.h"

namespace nt::kernels::cuda {

namespace {

namespace cg = cooperative_groups;
using persistent::dot4;
using persistent::fma_rn;
using persistent::ParamStep;

constexpr int kThreads = 512;
// Blocks a cluster: 16, a non-portable size the kernel opts into (device_plan). Against the portable 8, each block
// holds and computes half as much, and the H100 runs 7 groups instead of 13, so fewer weight copies cross L2 a step:
// 47.4 ms an epoch's steps at batch 64 against 52.8 (docs/persistent-mlp.md, "Design B").
constexpr int kClusterBlocks = 16;
constexpr int kMinStageRows = 8;
constexpr int kWindowSteps = 16;  // steps whose rows and labels are loaded at once
constexpr int kMaxLayers = kPersistentMaxLayers;

// Offsets into the block's shared memory, in floats; -1: none. Computed once on the host (plan()).
struct Layout {
  int rows_w[kMaxLayers], rows_b[kMaxLayers];  // hidden layers
  int cols_w[kMaxLayers];                      // of W[l] for l in [1, L-2]: the columns of the own neurons of l-1
  int head_w, head_b;
  int dlogits, mine, own_act, pixel_lut, stage;
  int batch_row, batch_label;  // the group's rows of the data set and their labels, kWindowSteps steps of chunk ints
  int batch_pixels;            // two buffers of the group's images as uint8 (pixel_floats each) where they fit; or -1
  int total;
};

struct Plan {
  int groups = 0;            // clusters; 0: does not run
  int chunk = 0;             // rows of a group (the last may have fewer)
  int own[kMaxLayers] = {};  // neurons per block of hidden layer l's output
  int own_max = 0;
  int stage_floats = 0;  // the stage's size: rows of a K-wide input are staged stage_floats / K at a time
  int stage_width = 0;   // the widest staged row
  int pixel_floats = 0;  // one buffer of the group's images (chunk·D bytes, rounded up to 16)
  Layout at{};
};

struct Params {
  PersistentMlpArgs a;
  Plan p;
  GridBarrier barrier;
  PersistentMlpWorkspace ws;    // activation[l]: layer l's input for l >= 1; gradient[l]: d at hidden layer l's output
  profile::PhaseStamps phases;  // kPhaseNames, marked by thread 0 of block 0 (empty unless a profiler asks)
};

Plan plan(const int* width, int layers, int B, int groups) {
  Plan p;
  p.groups = groups;
  p.chunk = persistent_mlp_chunk(B, groups);
  const int L = layers, C = width[L], S = kClusterBlocks;
  for (int l = 0; l + 1 < L; ++l) p.own[l] = (width[l + 1] + S - 1) / S, p.own_max = std::max(p.own_max, p.own[l]);
  for (int l = 0; l < L; ++l) p.stage_width = std::max(p.stage_width, width[l]);
  for (int l = 1; l + 1 < L; ++l) p.stage_width = std::max(p.stage_width, width[l + 1]);  // d[l] rows
  int at = 0;
  auto take = [&](int floats) {
    const int here = at;
    at += (floats + 3) / 4 * 4;  // 16-byte aligned slices
    return here;
  };
  Layout& s = p.at;
  for (int l = 0; l < kMaxLayers; ++l) s.rows_w[l] = s.rows_b[l] = s.cols_w[l] = -1;
  for (int l = 0; l + 1 < L; ++l) {
    s.rows_w[l] = take(p.own[l] * width[l]);
    s.rows_b[l] = take(p.own[l]);
  }
  for (int l = 1; l + 1 < L; ++l) s.cols_w[l] = take(p.own[l - 1] * width[l + 1]);
  s.head_w = take(C * width[L - 1]);
  s.head_b = take(C);
  s.dlogits = take(p.chunk * C);
  s.mine = take(p.chunk * p.own_max);
  s.own_act = take(p.chunk * p.own_max);
  s.pixel_lut = take(kMaxBatchChannels * 256);
  s.batch_row = take(kWindowSteps * p.chunk);
  s.batch_label = take(kWindowSteps * p.chunk);
  s.batch_pixels = -1;
  s.stage = -1;
  s.total = at;
  return p;
}

// The phases the kernel reports to the profiler (profile/phase_stamps.h), as block 0 sees them: its share of each
// phase's work, then its waits at the barriers (the slowest block's lag and the barrier itself).
enum Phase : uint32_t {
  kLoad,
  kBatch,
  kForward,
  kHead,
  kPartial,
  kBackward,
  kClusterBarrier,
  kGridBarrier,
  kUpdate,
  kReload
};
constexpr const char* kPhaseNames[] = {"load weights",      "batch",         "forward",         "head",
                                       "gradient partials", "backward",      "cluster barrier", "grid barrier",
                                       "sum and update",    "reload weights"};

// The device code below runs on sm_90 only (clusters): passes for older GPUs compile the kernel as a stub.
#if NT_CLUSTERS

__device__ __forceinline__ void mark_phase(const Params& q, Phase phase) {
  if (blockIdx.x == 0 && threadIdx.x == 0) q.phases.mark(phase);
}

// A barrier that reports its wait: the block's threads meet first, so the mark follows the block's own work.
__device__ __forceinline__ void phase_grid_barrier(const Params& q, Phase next) {
  if (q.phases.slots) {
    __syncthreads();
    mark_phase(q, kGridBarrier);
  }
  grid_barrier(q.barrier);
  mark_phase(q, next);
}
__device__ __forceinline__ void phase_cluster_barrier(const Params& q, Phase next) {
  if (q.phases.slots) {
    __syncthreads();
    mark_phase(q, kClusterBarrier);
  }
#if NT_CLUSTERS
  cg::this_cluster().sync();
#endif
  mark_phase(q, next);
}

// The group's rows of the data set and their labels for steps [s0, s0 + kWindowSteps) (those before a.steps): the
// order's positions first + s·B + b0 + r, r < bc, into the window (kWindowSteps × chunk). kWindowLoads rows in flight a
// thread. Followed by __syncthreads.
constexpr int kWindowLoads = 4;
__device__ void load_window(const Params& q, float* smem, int s0, int b0, int bc) {
  const BatchSource& src = q.a.src;
  const Layout& s = q.p.at;
  int* rows = reinterpret_cast<int*>(smem + s.batch_row);
  int* labels = reinterpret_cast<int*>(smem + s.batch_label);
  const int total = min(kWindowSteps, q.a.steps - s0) * bc;
  for (int base = threadIdx.x; base < total; base += kThreads * kWindowLoads) {
    int64_t row[kWindowLoads];
#pragma unroll
    for (int u = 0; u < kWindowLoads; ++u) {
      const int i = base + u * kThreads;
      if (i < total) row[u] = src.perm[q.a.first + int64_t(s0 + i / bc) * q.a.B + b0 + i % bc];
    }
#pragma unroll
    for (int u = 0; u < kWindowLoads; ++u) {
      const int i = base + u * kThreads;
      if (i >= total) break;
      const int at = i / bc * q.p.chunk + i % bc;
      rows[at] = static_cast<int>(row[u]);
      labels[at] = src.labels[row[u]];
    }
  }
  __syncthreads();
}

// Step `step`'s row r of the group (its index in the data set), from the window.
__device__ __forceinline__ int batch_row(const Params& q, const float* smem, int step, int r) {
  return reinterpret_cast<const int*>(smem + q.p.at.batch_row)[step % kWindowSteps * q.p.chunk + r];
}

// Where the plan keeps the images in shared memory (batch_pixels), step `step`'s into buffer step % 2 by cp.async
// (16-byte copies where rows are whole ones, else 4-byte or, for rows of odd length, plain loads), so that they land
// while the block works on: issued a step ahead, waited for by wait_pixels(). The window holds the step's rows.
__device__ void fetch_pixels(const Params& q, float* smem, int step, int bc) {
  const BatchSource& src = q.a.src;
  const int D = src.D;
  uint8_t* pixels = reinterpret_cast<uint8_t*>(smem + q.p.at.batch_pixels + step % 2 * q.p.pixel_floats);
  const int vector = D % 16 == 0 ? 16 : D % 4 == 0 ? 4 : 1;
  if (vector == 1) {
    for (int i = threadIdx.x; i < bc * D; i += kThreads)
      pixels[i] = src.images[int64_t(batch_row(q, smem, step, i / D)) * D + i % D];
    return;
  }
  const int per_row = D / vector, total = bc * per_row;
  for (int i = threadIdx.x; i < total; i += kThreads) {
    const uint8_t* from = src.images + int64_t(batch_row(q, smem, step, i / per_row)) * D + (i % per_row) * vector;
    if (vector == 16)
      cp_async::copy16_or_zero(pixels + i * vector, from);
    else
      cp_async::copy4_or_zero(pixels + i * vector, from);
  }
  cp_async::commit();
}
__device__ __forceinline__ void wait_pixels() {
  cp_async::wait_all();
  __syncthreads();
}

// Rows [r0, r0 + rows) of the group's batch into stage (rows × D), normalized (kernels/batch.h) through pixel_lut:
// each plane's 256 values computed once by normalize_pixel, the same bits without two divisions a pixel. From the
// uint8 images in shared memory where the plan keeps them, else from L2, four pixels a load where rows are whole
// words and kStageLoads loads in flight a thread.
constexpr int kStageLoads = 4;
__device__ void stage_batch(const Params& q, const float* smem, int step, int r0, int rows, float* stage) {
  const BatchSource& src = q.a.src;
  const Layout& s = q.p.at;
  const float* pixel_lut = smem + s.pixel_lut;
  const int* batch_row = reinterpret_cast<const int*>(smem + s.batch_row) + step % kWindowSteps * q.p.chunk;
  const int D = src.D;
  const int P = src.height > 0 && src.width > 0 ? src.height * src.width : D;
  auto plane = [&](int k) { return P == D ? 0 : k / P; };
  if (s.batch_pixels >= 0) {
    const uint8_t* pixels =
        reinterpret_cast<const uint8_t*>(smem + s.batch_pixels + step % 2 * q.p.pixel_floats) + int64_t(r0) * D;
    for (int i = threadIdx.x; i < rows * D; i += kThreads) stage[i] = pixel_lut[plane(i % D) * 256 + pixels[i]];
    return;
  }
  if (D % 4 == 0) {
    const int words = D / 4, total = rows * words;
    for (int base = threadIdx.x; base < total; base += kThreads * kStageLoads) {
      uchar4 px[kStageLoads];
#pragma unroll
      for (int u = 0; u < kStageLoads; ++u) {
        const int i = base + u * kThreads;
        if (i < total)
          px[u] =
              __ldg(reinterpret_cast<const uchar4*>(src.images + int64_t(batch_row[r0 + i / words]) * D) + i % words);
      }
#pragma unroll
      for (int u = 0; u < kStageLoads; ++u) {
        const int i = base + u * kThreads;
        if (i >= total) break;
        const int r = i / words, k = 4 * (i % words);
        const uint8_t v[4] = {px[u].x, px[u].y, px[u].z, px[u].w};
        for (int e = 0; e < 4; ++e) stage[r * D + k + e] = pixel_lut[plane(k + e) * 256 + v[e]];
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < rows * D; i += kThreads) {
    const int r = i / D, k = i % D;
    stage[i] = pixel_lut[plane(k) * 256 + src.images[int64_t(batch_row[r0 + r]) * D + k]];
  }
}

// Rows [r0, r0 + rows) of a (B, K) buffer another block wrote, into stage: 16-byte loads from L2 where K is a whole
// number of them (the buffers are 256-byte aligned), kStageLoads in flight a thread.
__device__ void stage_rows(const float* src, int K, int r0, int rows, float* stage) {
  const float* from = src + int64_t(r0) * K;
  if (K % 4 == 0) {
    const int total = rows * K / 4;
    const float4* from4 = reinterpret_cast<const float4*>(from);
    float4* stage4 = reinterpret_cast<float4*>(stage);
    for (int base = threadIdx.x; base < total; base += kThreads * kStageLoads) {
      float4 v[kStageLoads];
#pragma unroll
      for (int u = 0; u < kStageLoads; ++u)
        if (base + u * kThreads < total) v[u] = __ldcg(from4 + base + u * kThreads);
#pragma unroll
      for (int u = 0; u < kStageLoads; ++u)
        if (base + u * kThreads < total) stage4[base + u * kThreads] = v[u];
    }
    return;
  }
  for (int i = threadIdx.x; i < rows * K; i += kThreads) stage[i] = __ldcg(from + i);
}

// out(r, j, dot16(in + r·ld_in, w + j·ld_w, K)) for r in [0, rows), j in [0, cols) (kernels/persistent_mlp_math.h):
// the staged rows of a layer's input against the block's weight rows. 16 lanes a tile of kTileRows × kTileCols dot
// products; lane c runs chain c of each, one group of four k a step (a 16-byte load of each operand row when the rows
// are whole float4s), so each load serves kTileCols or kTileRows FMAs and the 16 lanes read 256 contiguous bytes
// (no bank conflict). The chains are then added by shfl_xor, as dot16's butterfly, and lane 0 calls out. Rows and
// columns past the edge are computed on a clamped copy and not passed out. Every thread of the block calls it.
constexpr int kTileRows = 2, kTileCols = 4, kTileLanes = persistent::kDotChains;
template <class Out>
__device__ void tiled_dots(const float* in, int ld_in, const float* w, int ld_w, int K, int rows, int cols, Out out) {
  const int lane = threadIdx.x % kTileLanes;
  const unsigned tile_mask = 0xFFFFu << (threadIdx.x & 31 & ~(kTileLanes - 1));
  const int row_tiles = (rows + kTileRows - 1) / kTileRows, col_tiles = (cols + kTileCols - 1) / kTileCols;
  const bool whole_float4s = K % 4 == 0 && ld_in % 4 == 0 && ld_w % 4 == 0;
  for (int t = threadIdx.x / kTileLanes; t < row_tiles * col_tiles; t += kThreads / kTileLanes) {
    const int r0 = t / col_tiles * kTileRows, j0 = t % col_tiles * kTileCols;
    const float* a[kTileRows];
    const float* b[kTileCols];
#pragma unroll
    for (int r = 0; r < kTileRows; ++r) a[r] = in + min(r0 + r, rows - 1) * ld_in;
#pragma unroll
    for (int j = 0; j < kTileCols; ++j) b[j] = w + min(j0 + j, cols - 1) * ld_w;
    float acc[kTileRows][kTileCols] = {};
    if (whole_float4s) {
      for (int k = 4 * lane; k < K; k += 4 * kTileLanes) {
        float4 av[kTileRows], bv[kTileCols];
#pragma unroll
        for (int r = 0; r < kTileRows; ++r) av[r] = *reinterpret_cast<const float4*>(a[r] + k);
#pragma unroll
        for (int j = 0; j < kTileCols; ++j) bv[j] = *reinterpret_cast<const float4*>(b[j] + k);
#pragma unroll
        for (int r = 0; r < kTileRows; ++r)
#pragma unroll
          for (int j = 0; j < kTileCols; ++j) {
            float& p = acc[r][j];
            p = fma_rn(av[r].x, bv[j].x, p);
            p = fma_rn(av[r].y, bv[j].y, p);
            p = fma_rn(av[r].z, bv[j].z, p);
            p = fma_rn(av[r].w, bv[j].w, p);
          }
      }
    } else {
      for (int k0 = 4 * lane; k0 < K; k0 += 4 * kTileLanes)
        for (int k = k0; k < min(K, k0 + 4); ++k)
#pragma unroll
          for (int r = 0; r < kTileRows; ++r)
#pragma unroll
            for (int j = 0; j < kTileCols; ++j) acc[r][j] = fma_rn(a[r][k], b[j][k], acc[r][j]);
    }
#pragma unroll
    for (int r = 0; r < kTileRows; ++r)
#pragma unroll
      for (int j = 0; j < kTileCols; ++j)
#pragma unroll
        for (int h = kTileLanes / 2; h >= 1; h /= 2)
          acc[r][j] = persistent::add_rn(acc[r][j], __shfl_xor_sync(tile_mask, acc[r][j], h, kTileLanes));
    if (lane != 0) continue;
#pragma unroll
    for (int r = 0; r < kTileRows; ++r)
#pragma unroll
      for (int j = 0; j < kTileCols; ++j)
        if (r0 + r < rows && j0 + j < cols) out(r0 + r, j0 + j, acc[r][j]);
  }
}

// How many K-wide rows the stage holds (at least one: the plan sizes it for the widest), at most the group's rows.
__device__ __forceinline__ int stage_rows_for(const Params& q, int K, int rows) {
  return min(rows, q.p.stage_floats / K);
}

// Layer l's input rows [r0, r0 + rows) of the group (its first row b0) at step `step`: the batch for l = 0, else
// a[l-1] from the workspace.
__device__ void stage_input(const Params& q, const float* smem, int step, int l, int b0, int r0, int rows,
                            float* stage) {
  if (l == 0)
    stage_batch(q, smem, step, r0, rows, stage);
  else
    stage_rows(q.ws.activation[l], q.a.width[l], b0 + r0, rows, stage);
}

// A layer's gradient over rows [r0, r0 + rows) of the group, into its partial in the workspace (weights: outputs × K
// row-major, biases: outputs): weights[j, k] = Σ_r d[r0 + r, j]·in[r, k], biases[j] = Σ_r d[r0 + r, j], each one chain
// in increasing r (kernels/persistent_mlp_math.h) started at r0 = 0 and carried on from part for later slices: the same
// thread owns an element in every slice, so it reads back its own store. d's row r at d + r·d_stride (the gradient at
// the layer's outputs), the staged input rows × K. A thread a tile of kGradCols outputs × four consecutive k, so that
// one 16-byte load of the input serves kGradCols · 4 FMAs.
constexpr int kGradCols = 2;
__device__ void add_gradient_partial(const float* d, int d_stride, int r0, int rows, const float* in, int K,
                                     int outputs, float* weights, float* biases) {
  const bool first = r0 == 0;
  const int k_groups = (K + 3) / 4, col_tiles = (outputs + kGradCols - 1) / kGradCols;
  const bool whole_float4s = K % 4 == 0;
  // A row's four k as one 16-byte store (and load, after the first slice): a warp writes 512 contiguous bytes.
  const bool vector_part = whole_float4s && reinterpret_cast<uintptr_t>(weights) % 16 == 0;
  for (int t = threadIdx.x; t < col_tiles * k_groups; t += kThreads) {
    const int j0 = t / k_groups * kGradCols, k0 = t % k_groups * 4;
    float g[kGradCols][4];
#pragma unroll
    for (int j = 0; j < kGradCols; ++j) {
      if (vector_part && !first && j0 + j < outputs) {
        const float4 v = *reinterpret_cast<const float4*>(weights + int64_t(j0 + j) * K + k0);
        g[j][0] = v.x, g[j][1] = v.y, g[j][2] = v.z, g[j][3] = v.w;
        continue;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e)
        g[j][e] = !first && j0 + j < outputs && k0 + e < K ? weights[int64_t(j0 + j) * K + k0 + e] : 0.f;
    }
    for (int r = 0; r < rows; ++r) {
      float x[4];
      if (whole_float4s) {
        const float4 v = *reinterpret_cast<const float4*>(in + r * K + k0);
        x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] = k0 + e < K ? in[r * K + k0 + e] : 0.f;
      }
#pragma unroll
      for (int j = 0; j < kGradCols; ++j) {
        const float dj = d[(r0 + r) * d_stride + min(j0 + j, outputs - 1)];
#pragma unroll
        for (int e = 0; e < 4; ++e) g[j][e] = fma_rn(dj, x[e], g[j][e]);
      }
    }
#pragma unroll
    for (int j = 0; j < kGradCols; ++j) {
      if (j0 + j >= outputs) break;
      if (vector_part) {
        *reinterpret_cast<float4*>(weights + int64_t(j0 + j) * K + k0) =
            make_float4(g[j][0], g[j][1], g[j][2], g[j][3]);
        continue;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (k0 + e < K) weights[int64_t(j0 + j) * K + k0 + e] = g[j][e];
    }
  }
  for (int j = threadIdx.x; j < outputs; j += kThreads) {
    float g = first ? 0.f : biases[j];
    for (int r = 0; r < rows; ++r) g = persistent::add_rn(g, d[(r0 + r) * d_stride + j]);
    biases[j] = g;
  }
}

// The partial of hidden layer l's rows this block owns (count of them from n0) over the group's rows (b0, bc), from
// mine (d at its own neurons) and layer l's input, staged again, into the group's partial `part`. Every thread of the
// block calls it.
__device__ void rows_partial(const Params& q, float* smem, float* part, int step, int l, int n0, int count, int b0,
                             int bc) {
  mark_phase(q, kPartial);
  const int K = q.a.width[l], N = q.a.width[l + 1];
  float* stage = smem + q.p.at.stage;
  float* weights = part + q.ws.layer_offset[l] + int64_t(n0) * K;  // rows n0.. of W[l]'s partial
  float* biases = part + q.ws.layer_offset[l] + int64_t(N) * K + n0;
  const int R = stage_rows_for(q, K, bc);
  for (int r0 = 0; r0 < bc; r0 += R) {
    const int rows = min(R, bc - r0);
    __syncthreads();
    stage_input(q, smem, step, l, b0, r0, rows, stage);
    __syncthreads();
    add_gradient_partial(smem + q.p.at.mine, q.p.own[l], r0, rows, stage, K, count, weights, biases);
  }
  __syncthreads();
}

// The block's weights from the tensors: its rows of each hidden layer, their columns of the next hidden layer, the
// whole head. Through L2 (ld.global.cg): other SMs updated them.
__device__ void load_weights(const Params& q, float* smem, const int* n0, const int* count) {
  const PersistentMlpArgs& a = q.a;
  const Layout& s = q.p.at;
  const int L = a.layers, C = a.width[L], KH = a.width[L - 1];
  for (int l = 0; l + 1 < L; ++l) {
    const int K = a.width[l];
    const float4* rows = reinterpret_cast<const float4*>(a.weight[l] + int64_t(n0[l]) * K);
    if (K % 4 == 0 && (int64_t(n0[l]) * K) % 4 == 0) {
      for (int i = threadIdx.x; i < count[l] * K / 4; i += kThreads)
        reinterpret_cast<float4*>(smem + s.rows_w[l])[i] = __ldcg(rows + i);
    } else {
      for (int i = threadIdx.x; i < count[l] * K; i += kThreads)
        smem[s.rows_w[l] + i] = __ldcg(a.weight[l] + int64_t(n0[l]) * K + i);
    }
    for (int j = threadIdx.x; j < count[l]; j += kThreads) smem[s.rows_b[l] + j] = __ldcg(a.bias[l] + n0[l] + j);
  }
  for (int l = 1; l + 1 < L; ++l) {  // columns i of W[l] (N × K): [j][n] = W[l][n, n0[l-1] + j]
    const int K = a.width[l], N = a.width[l + 1];
    for (int i = threadIdx.x; i < count[l - 1] * N; i += kThreads) {
      const int j = i / N, n = i % N;
      smem[s.cols_w[l] + i] = __ldcg(a.weight[l] + int64_t(n) * K + n0[l - 1] + j);
    }
  }
  for (int i = threadIdx.x; i < C * KH; i += kThreads) smem[s.head_w + i] = __ldcg(a.weight[L - 1] + i);
  for (int c = threadIdx.x; c < C; c += kThreads) smem[s.head_b + c] = __ldcg(a.bias[L - 1] + c);
}

// Σ_q partial[q] at element i (q increasing, kernels/persistent_mlp_math.h) for one float or a float4 of four
// consecutive elements, kSumLoads groups' loads in flight at once.
constexpr int kSumLoads = 8;
__device__ __forceinline__ float add4(float a, float b) { return persistent::add_rn(a, b); }
__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(persistent::add_rn(a.x, b.x), persistent::add_rn(a.y, b.y), persistent::add_rn(a.z, b.z),
                     persistent::add_rn(a.w, b.w));
}
template <class T>
__device__ __forceinline__ T group_sum(const Params& q, int64_t i) {
  const T* at = reinterpret_cast<const T*>(q.ws.partial + i);
  const int64_t stride = int64_t(q.ws.partial_stride) * sizeof(float) / sizeof(T);
  T sum{};
  for (int g0 = 0; g0 < q.p.groups; g0 += kSumLoads) {
    T parts[kSumLoads];
#pragma unroll
    for (int u = 0; u < kSumLoads; ++u)
      if (g0 + u < q.p.groups) parts[u] = __ldcg(at + (g0 + u) * stride);
#pragma unroll
    for (int u = 0; u < kSumLoads; ++u)
      if (g0 + u < q.p.groups) sum = g0 + u == 0 ? parts[u] : add4(sum, parts[u]);
  }
  return sum;
}

// One parameter's step from the groups' partials at element i of the partials' layout, with its optimizer state at
// first and second (nullptr where the optimizer keeps none).
template <bool kAdam>
__device__ __forceinline__ void apply_step(const ParamStep& step, float& p, float g, float& first, float& second) {
  if constexpr (kAdam)
    step.adam.apply(p, g, first, second);
  else
    step.sgd.apply(p, g, first);
}

template <bool kAdam>
__device__ __forceinline__ void step_scalar(const Params& q, const ParamStep& step, int64_t i, float* p, float* first,
                                            float* second) {
  const float grad = group_sum<float>(q, i);
  float param = *p, a = first ? *first : 0.f, b = second ? *second : 0.f;
  apply_step<kAdam>(step, param, grad, a, b);
  *p = param;
  if (first) *first = a;
  if (second) *second = b;
}

// Every parameter in this block's share (the parameters of all layers in the partials' order, cut into gridDim.x
// ranges of a multiple of 4): its gradient, the groups' partials summed (group_sum), then its step (SGD's or Adam's),
// into the tensors with its state. The weights four at a time (float4 loads and stores: each layer's partials start
// on a 16-byte boundary, kernels/persistent_mlp.h, and so do the tensors the engine allocates); the biases, and
// tensors that are not aligned, one at a time.
template <bool kAdam>
__device__ void sum_and_update(const Params& q, const ParamStep& step) {
  const PersistentMlpArgs& a = q.a;
  const bool adam = kAdam, first_state = adam || a.momentum != 0.f;
  const int64_t total =
      int64_t(q.ws.layer_offset[a.layers - 1]) + int64_t(a.width[a.layers]) * a.width[a.layers - 1] + a.width[a.layers];
  const int64_t share = ((total + gridDim.x - 1) / gridDim.x + 3) / 4 * 4;
  const int64_t lo = min(total, int64_t(blockIdx.x) * share), hi = min(total, lo + share);
  for (int l = 0; l < a.layers; ++l) {
    const int64_t first = int64_t(q.ws.layer_offset[l]);
    const int64_t weights = int64_t(a.width[l + 1]) * a.width[l], biases = a.width[l + 1];
    // The weights: [first, first + weights) of the layout.
    float* w = a.weight[l];
    float* w1 = first_state ? a.weight_velocity[l] : nullptr;
    float* w2 = adam ? a.weight_second_moment[l] : nullptr;
    int64_t from = max(lo, first), to = min(hi, first + weights);
    const bool aligned =
        (reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(w1) | reinterpret_cast<uintptr_t>(w2)) % 16 == 0;
    if (aligned) {  // from - first is a multiple of 4 (lo and first are)
      for (int64_t i = from + 4 * threadIdx.x; i + 3 < to; i += 4 * kThreads) {
        const float4 grad = group_sum<float4>(q, i);
        const int64_t e = i - first;
        float4 param = *reinterpret_cast<float4*>(w + e);
        float4 s1 = w1 ? *reinterpret_cast<float4*>(w1 + e) : float4{};
        float4 s2 = w2 ? *reinterpret_cast<float4*>(w2 + e) : float4{};
        apply_step<kAdam>(step, param.x, grad.x, s1.x, s2.x);
        apply_step<kAdam>(step, param.y, grad.y, s1.y, s2.y);
        apply_step<kAdam>(step, param.z, grad.z, s1.z, s2.z);
        apply_step<kAdam>(step, param.w, grad.w, s1.w, s2.w);
        *reinterpret_cast<float4*>(w + e) = param;
        if (w1) *reinterpret_cast<float4*>(w1 + e) = s1;
        if (w2) *reinterpret_cast<float4*>(w2 + e) = s2;
      }
      from = max(from, to - (to - from) % 4);  // the last few, one at a time
    }
    for (int64_t i = from + threadIdx.x; i < to; i += kThreads) {
      const int64_t e = i - first;
      step_scalar<kAdam>(q, step, i, w + e, w1 ? w1 + e : nullptr, w2 ? w2 + e : nullptr);
    }
    // The biases: [first + weights, first + weights + biases).
    float* b1 = first_state ? a.bias_velocity[l] : nullptr;
    float* b2 = adam ? a.bias_second_moment[l] : nullptr;
    from = max(lo, first + weights), to = min(hi, first + weights + biases);
    for (int64_t i = from + threadIdx.x; i < to; i += kThreads) {
      const int64_t e = i - first - weights;
      step_scalar<kAdam>(q, step, i, a.bias[l] + e, b1 ? b1 + e : nullptr, b2 ? b2 + e : nullptr);
    }
  }
}

#endif  // NT_CLUSTERS

// kAdam: Adam's step instead of SGD's (a.adam_step is set). Two kernels, so that SGD's registers are not Adam's.
template <bool kAdam>
__global__ void NT_CLUSTER_DIMS(kClusterBlocks, 1, 1) __launch_bounds__(kThreads, 1)
    persistent_mlp_kernel(const Params q, StampRing stamps) {
  begin_dependent_kernel(stamps);
#if NT_CLUSTERS
  mark_phase(q, kLoad);
  extern __shared__ __align__(16) float smem[];
  const PersistentMlpArgs& a = q.a;
  const Layout& s = q.p.at;
  const int L = a.layers, B = a.B, C = a.width[L], KH = a.width[L - 1];
  const int group = blockIdx.x / kClusterBlocks, rank = blockIdx.x % kClusterBlocks;
  const int b0 = group * q.p.chunk, bc = min(q.p.chunk, B - b0);  // the group's rows of the batch
  const bool last_rank = rank == kClusterBlocks - 1;
  // Adam's steps so far, read by every block before the first grid barrier; the last block leaves the count after the
  // last update.
  const uint64_t t0 = a.adam_step ? *static_cast<const volatile uint64_t*>(a.adam_step) : 0;
  float* part = q.ws.partial + int64_t(group) * q.ws.partial_stride;  // the group's gradient partial

  // The block's range of each hidden layer's outputs.
  int n0[kMaxLayers], count[kMaxLayers];
  for (int l = 0; l + 1 < L; ++l) {
    n0[l] = min(a.width[l + 1], rank * q.p.own[l]);
    count[l] = min(a.width[l + 1], n0[l] + q.p.own[l]) - n0[l];
  }

  load_weights(q, smem, n0, count);
  load_window(q, smem, 0, b0, bc);
  const bool pixels_on_chip = s.batch_pixels >= 0;
  if (pixels_on_chip) fetch_pixels(q, smem, 0, bc);
  for (int i = threadIdx.x; i < kMaxBatchChannels * 256; i += kThreads)
    smem[s.pixel_lut + i] =
        normalize_pixel(static_cast<uint8_t>(i % 256), a.src.mean.value[i / 256], a.src.std.value[i / 256]);
  __syncthreads();

  float* stage = smem + s.stage;
  float* mine = smem + s.mine;
  float* own_act = smem + s.own_act;
  float* dlogits = smem + s.dlogits;

  for (int step = 0; step < a.steps; ++step) {
    // ---- this step's images (fetched during the last), and the next step's on their way
    mark_phase(q, kBatch);
    if (pixels_on_chip) {
      wait_pixels();
      if (step + 1 < a.steps && (step + 1) % kWindowSteps != 0) fetch_pixels(q, smem, step + 1, bc);
    }
    mark_phase(q, kForward);

    // ---- forward through the hidden layers: own outputs of the group's rows, to the workspace
    for (int l = 0; l + 1 < L; ++l) {
      const int K = a.width[l], N = a.width[l + 1];
      const float* w = smem + s.rows_w[l];
      const float* bias = smem + s.rows_b[l];
      const int R = stage_rows_for(q, K, bc);
      for (int r0 = 0; r0 < bc; r0 += R) {
        const int rows = min(R, bc - r0);
        stage_input(q, smem, step, l, b0, r0, rows, stage);
        __syncthreads();
        float* out = q.ws.activation[l + 1] + int64_t(b0 + r0) * N + n0[l];
        tiled_dots(stage, K, w, K, K, rows, count[l], [&](int r, int j, float dot) {
          out[int64_t(r) * N + j] = persistent::linear_out(dot, bias[j], true);
        });
        __syncthreads();
      }
      phase_cluster_barrier(q, l + 2 < L ? kForward : kHead);
    }

    // ---- the head, in every block of the cluster: logits, softmax, d at the own neurons of layer L-2
    const float* hw = smem + s.head_w;
    const int own_h = count[L - 2], own_h_stride = q.p.own[L - 2];
    const int RH = stage_rows_for(q, KH, bc);
    for (int r0 = 0; r0 < bc; r0 += RH) {
      const int rows = min(RH, bc - r0);
      stage_rows(q.ws.activation[L - 1], KH, b0 + r0, rows, stage);
      __syncthreads();
      tiled_dots(stage, KH, hw, KH, KH, rows, C, [&](int r, int c, float dot) {
        dlogits[(r0 + r) * C + c] = persistent::linear_out(dot, smem[s.head_b + c], false);
      });
      __syncthreads();
      for (int r = threadIdx.x; r < rows; r += kThreads) {
        const int label = reinterpret_cast<const int*>(smem + s.batch_label)[step % kWindowSteps * q.p.chunk + r0 + r];
        bool hit = false;
        const float loss = persistent::softmax_xent_row(dlogits + (r0 + r) * C, C, label, B, &hit);
        if (rank == 0) q.ws.row_loss[b0 + r0 + r] = loss, q.ws.row_hit[b0 + r0 + r] = hit ? 1.f : 0.f;
      }
      __syncthreads();
      for (int i = threadIdx.x; i < rows * own_h; i += kThreads) {
        const int r = i / own_h, j = i % own_h, n = n0[L - 2] + j;
        const float sum = dot4(dlogits + (r0 + r) * C, hw + n, C, KH);
        const float d = stage[r * KH + n] > 0.f ? sum : 0.f;
        mine[(r0 + r) * own_h_stride + j] = d;
        if (L > 2) q.ws.gradient[L - 2][int64_t(b0 + r0 + r) * KH + n] = d;
      }
      // The head's partial, by the last rank (which owns the fewest neurons).
      if (last_rank)
        add_gradient_partial(dlogits, C, r0, rows, stage, KH, C, part + q.ws.layer_offset[L - 1],
                             part + q.ws.layer_offset[L - 1] + int64_t(C) * KH);
      __syncthreads();
    }
    rows_partial(q, smem, part, step, L - 2, n0[L - 2], count[L - 2], b0, bc);
    if (L > 2) phase_cluster_barrier(q, kBackward);

    // ---- backward through the hidden layers: l's gradient (from every block of the cluster) to l-1's own neurons
    for (int l = L - 2; l >= 1; --l) {
      const int N = a.width[l + 1], K = a.width[l], own = count[l - 1], own_stride = q.p.own[l - 1];
      const float* cw = smem + s.cols_w[l];
      for (int i = threadIdx.x; i < bc * own; i += kThreads) {
        const int r = i / own, j = i % own;
        own_act[r * own_stride + j] = __ldcg(q.ws.activation[l] + int64_t(b0 + r) * K + n0[l - 1] + j);
      }
      const int R = stage_rows_for(q, N, bc);
      for (int r0 = 0; r0 < bc; r0 += R) {
        const int rows = min(R, bc - r0);
        __syncthreads();
        stage_rows(q.ws.gradient[l], N, b0 + r0, rows, stage);
        __syncthreads();
        tiled_dots(stage, N, cw, N, N, rows, own, [&](int r, int j, float sum) {
          const float d = own_act[(r0 + r) * own_stride + j] > 0.f ? sum : 0.f;
          mine[(r0 + r) * own_stride + j] = d;
          if (l - 1 >= 1) q.ws.gradient[l - 1][int64_t(b0 + r0 + r) * K + n0[l - 1] + j] = d;
        });
      }
      rows_partial(q, smem, part, step, l - 1, n0[l - 1], count[l - 1], b0, bc);
      if (l - 1 >= 1) phase_cluster_barrier(q, kBackward);
    }

    // ---- the groups' partials summed, every parameter's step; the next window of rows where one starts
    phase_grid_barrier(q, kUpdate);
    if (step + 1 < a.steps && (step + 1) % kWindowSteps == 0) {
      load_window(q, smem, step + 1, b0, bc);  // this step's rows and labels are no longer read
      if (pixels_on_chip) fetch_pixels(q, smem, step + 1, bc);
    }
    sum_and_update<kAdam>(q, persistent::param_step(a, t0 + uint64_t(step) + 1));
    if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) {
      double loss = 0.0;
      long long hits = 0;
      for (int b = 0; b < B; ++b) {
        loss += double(__ldcg(q.ws.row_loss + b));
        hits += __ldcg(q.ws.row_hit + b) != 0.f ? 1 : 0;
      }
      *a.loss_sum += loss;
      *a.correct += hits;
    }
    if (step + 1 == a.steps) break;
    phase_grid_barrier(q, kReload);
    load_weights(q, smem, n0, count);
    __syncthreads();
  }
  if (a.adam_step && blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) a.adam_step[0] = t0 + uint64_t(a.steps);
  if (blockIdx.x == 0 && threadIdx.x == 0) q.phases.end();
#else
  __trap();  // clusters need sm_90: persistent_mlp_groups never plans this image
#endif
}

// The plan for the current device and `groups` clusters, the stage as large as fits (at least kMinStageRows of the
// widest rows where the group has them); groups = 0 where it does not fit or cannot run.
Plan device_plan(const int* width, int layers, int B, int groups) {
  if (layers < 2 || layers > kMaxLayers || B < 1 || B > kPersistentMaxBatch || groups < 1 ||
      groups > std::min(B, kPersistentMaxGroups) || (groups - 1) * persistent_mlp_chunk(B, groups) >= B)
    return {};
  if (!cluster_kernels_run(persistent_mlp_kernel<false>)) return {};
  Plan p = plan(width, layers, B, groups);
  const size_t limit = max_shared_bytes_per_block() / sizeof(float);
  if (size_t(p.at.total) + (size_t(p.stage_width) + 3) / 4 * 4 > limit) return {};
  // The group's images stay in shared memory as uint8, in two buffers (one gather a step, a step ahead, for the
  // forward and the weight gradient alike), when that leaves room for kMinStageRows staged rows; else each use
  // gathers its rows.
  const int min_rows = std::min(p.chunk, kMinStageRows);
  const size_t pixel_floats = (size_t(p.chunk) * width[0] + 15) / 16 * 4;
  if (size_t(p.at.total) + 2 * pixel_floats + size_t(min_rows) * p.stage_width <= limit) {
    p.pixel_floats = static_cast<int>(pixel_floats);
    p.at.batch_pixels = p.at.total;
    p.at.total += 2 * p.pixel_floats;
  }
  // The stage takes the rest, up to the group's rows of the widest row.
  p.stage_floats = static_cast<int>(std::min<size_t>(size_t(p.chunk) * p.stage_width, (limit - p.at.total) / 4 * 4));
  p.at.stage = p.at.total;
  p.at.total += p.stage_floats;
  const size_t bytes = size_t(p.at.total) * sizeof(float);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(groups * kClusterBlocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = bytes;
  for (auto* kernel : {persistent_mlp_kernel<false>, persistent_mlp_kernel<true>}) {
    int clusters = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess ||
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) != cudaSuccess ||
        cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess || clusters < groups) {
      cudaGetLastError();
      return {};
    }
  }
  return p;
}

}  // namespace

int persistent_mlp_groups(const int* width, int layers, int B) {
  if (layers < 2 || layers > kMaxLayers || B < 1 || B > kPersistentMaxBatch) return 0;
  for (int want = std::min(B, kPersistentMaxGroups); want >= 1; --want) {
    const int groups = (B + persistent_mlp_chunk(B, want) - 1) / persistent_mlp_chunk(B, want);  // none empty
    if (device_plan(width, layers, B, groups).groups > 0) return groups;
  }
  return 0;
}

void persistent_mlp(const Exec& exec, const PersistentMlpArgs& a) {
  check_persistent_mlp(a);
  const Plan p = device_plan(a.width, a.layers, a.B, a.groups);
  NT_CHECK(p.groups > 0, "persistent_mlp: this model (", a.layers, " layers) at batch ", a.B, " in ", a.groups,
           " groups does not fit the device (persistent_mlp_groups)");
  Params q{};
  q.a = a;
  q.p = p;
  q.ws = persistent_mlp_workspace(a.workspace, a.width, a.layers, a.B, a.groups);
  q.barrier = GridBarrier{q.ws.barrier, q.ws.barrier + 1};
  if (a.steps == 0) return;
  q.phases = profile::phase_stamps_for(exec.observer, kPhaseNames, std::size(kPhaseNames));
  profile::OpCost cost;
  int64_t weights = 0;
  for (int l = 0; l < a.layers; ++l) weights += int64_t(a.width[l]) * a.width[l + 1];
  cost.flops = 6.0 * double(weights) * a.B * a.steps;  // forward, input gradient and weight gradient
  cost.bytes = double(a.steps) * a.B * a.width[0];     // the batches' pixels; the weights stay on chip
  launch_with(exec, "persistent_mlp", cost, a.adam_step ? persistent_mlp_kernel<true> : persistent_mlp_kernel<false>,
              dim3(unsigned(p.groups * kClusterBlocks)), dim3(kThreads), size_t(p.at.total) * sizeof(float),
              /*cooperative=*/true, q);
}

}  // namespace nt::kernels::cuda
