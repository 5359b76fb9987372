// The persistent mlp step on the GPU (kernels/persistent_mlp.h): one cooperative launch of one block per SM runs every
// step, the weights in shared memory from the first step to the last.
//
// Ownership. G blocks; hidden layer l (l < L-1, output width N = w[l+1]) gives block g its neurons
// [g·own(l), min(N, (g+1)·own(l))), own(l) = ceil(N / G): the rows of W[l] and b[l], and the same columns of W[l+1]
// when layer l+1 is hidden too (a second copy). Every block holds the whole head W[L-1], b[L-1] (C ≤ 32 rows).
// Velocities sit beside their weights. Shared memory, in floats:
//   rows W[l] (own·w[l]), b[l], their velocities      columns of W[l+1] as [i][n] (own(l)·w[l+2]), velocities
//   head W[L-1], b[L-1], velocities                    dlogits (B·C), row losses and hits (B each)
//   mine (B·own_max): the gradient at the block's own neurons      own_act (B·own_max): their activations
//   grad (the larger of any row or column slice's gradient)  head_grad (C·w[L-1] + C)  pixel_lut (256 a plane)
//   batch_row, batch_label (B each)  batch_pixels (B·D bytes, where they fit)  stage (the rest, up to B·stage_width)
// Activations a[l] and the gradients d[l] at hidden outputs go through the workspace (global, L2): each block writes
// its own columns, every block reads whole rows, as many K-wide rows at once as the stage holds, with ld.global.cg
// (another SM wrote them; this SM's L1 may hold an older line). Each step opens with the batch's rows and labels, and
// its images where they fit, loaded into shared memory once (load_batch).
// The wide dot products run in dot16's order as 16-lane register tiles (tiled_dots), the weight gradients as tiles
// of outputs × four k (add_weight_gradient); docs/persistent-mlp.md has the measurements behind both.
//
// A step, L = layers (grid barriers between the phases that read what other blocks wrote):
//   forward l = 0..L-2     stage a[l] (l = 0: gather and normalize the batch), own outputs of layer l   barrier
//   head                   stage a[L-1]; logits, softmax (every block, the same bits), d[L-2] at own neurons from the
//                          head's columns, head gradient; head step; rows of layer L-2 step       barrier (see below)
//   back l = L-2..1        stage d[l]; d[l-1] at own neurons from the column copy of W[l]; that copy steps; rows of
//                          layer l-1 step (stage a[l-1])                                           barrier if l > 1
// Each gradient is computed from the weights before the step, in kernels/persistent_mlp_math.h's order, so the row
// and column copies of W[l] take the same gradient (Σ_b d[l][b,n]·a[l][b,i], b increasing) and stay equal. With two
// or more hidden layers no barrier closes the step: what the next step's first phase overwrites (its a at the own
// neurons) is read after the last barrier only by the block that owns it. With one, every block reads the whole of
// that a in the head phase, so a barrier closes each step but the last.
//
// The loss: the last block adds the batch's row losses in double, in increasing b, to *loss_sum, and the hits to
// *correct.
#include <algorithm>
#include <iterator>

#include "kernels/cuda/grid_barrier.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/persistent_mlp.h"
#include "kernels/persistent_mlp_math.h"
#include "profile/phase_stamps.h"

namespace nt::kernels::cuda {

namespace {

using persistent::dot4;
using persistent::fma_rn;
using persistent::SgdStep;

constexpr int kThreads = 512;
constexpr int kMinStageRows = 16;
constexpr int kMaxLayers = kPersistentMaxLayers;

// Offsets into the block's shared memory, in floats; -1: none. Computed once on the host (plan()).
struct Layout {
  int rows_w[kMaxLayers], rows_b[kMaxLayers], rows_vw[kMaxLayers], rows_vb[kMaxLayers];  // hidden layers
  int cols_w[kMaxLayers], cols_vw[kMaxLayers];  // of W[l] for l in [1, L-2]: the columns of the own neurons of l-1
  int head_w, head_b, head_vw, head_vb;
  int dlogits, row_loss, row_hit, mine, own_act, grad, head_grad, pixel_lut, stage;
  int batch_row, batch_label;  // the step's rows of the data set and their labels (B ints each)
  int batch_pixels;            // the step's images as uint8 (B·D bytes) when they fit beside the rest; else -1
  int total;
};

struct Plan {
  int G = 0;                 // blocks
  int own[kMaxLayers] = {};  // neurons per block of hidden layer l's output
  int own_max = 0;
  int stage_floats = 0;  // the stage's size: rows of a K-wide input are staged stage_floats / K at a time
  int stage_width = 0;   // the widest staged row
  Layout at{};
};

struct Params {
  PersistentMlpArgs a;
  Plan p;
  GridBarrier barrier;
  PersistentMlpWorkspace ws;    // activation[l]: layer l's input for l >= 1; gradient[l]: d at hidden layer l's output
  profile::PhaseStamps phases;  // kPhaseNames, marked by thread 0 of block 0 (empty unless a profiler asks)
};

// The phases the kernel reports to the profiler (profile/phase_stamps.h), as block 0 sees them: its share of each
// phase's work, then its wait at the grid barrier that closes the phase (the slowest block's lag and the barrier).
enum Phase : uint32_t { kLoad, kForward, kHead, kBackward, kBarrier, kStore };
constexpr const char* kPhaseNames[] = {"load weights",        "forward",      "head and its update",
                                       "backward and update", "grid barrier", "store weights"};

__device__ __forceinline__ void mark_phase(const Params& q, Phase phase) {
  if (blockIdx.x == 0 && threadIdx.x == 0) q.phases.mark(phase);
}

// A grid barrier that reports its wait: the block's threads meet first, so the mark follows the block's own work.
__device__ __forceinline__ void phase_barrier(const Params& q, Phase next) {
  if (q.phases.slots) {
    __syncthreads();
    mark_phase(q, kBarrier);
  }
  grid_barrier(q.barrier);
  mark_phase(q, next);
}

Plan plan(const int* width, int layers, int B, int G) {
  Plan p;
  p.G = G;
  const int L = layers, C = width[L];
  for (int l = 0; l + 1 < L; ++l) p.own[l] = (width[l + 1] + G - 1) / G, p.own_max = std::max(p.own_max, p.own[l]);
  for (int l = 0; l < L; ++l) p.stage_width = std::max(p.stage_width, width[l]);
  for (int l = 1; l + 1 < L; ++l) p.stage_width = std::max(p.stage_width, width[l + 1]);  // d[l] rows
  int at = 0;
  auto take = [&](int floats) {
    const int here = at;
    at += (floats + 3) / 4 * 4;  // 16-byte aligned slices
    return here;
  };
  Layout& s = p.at;
  int grad = 0;
  for (int l = 0; l < kMaxLayers; ++l) s.rows_w[l] = s.rows_b[l] = s.rows_vw[l] = s.rows_vb[l] = -1;
  for (int l = 0; l < kMaxLayers; ++l) s.cols_w[l] = s.cols_vw[l] = -1;
  for (int l = 0; l + 1 < L; ++l) {
    s.rows_w[l] = take(p.own[l] * width[l]);
    s.rows_b[l] = take(p.own[l]);
    s.rows_vw[l] = take(p.own[l] * width[l]);
    s.rows_vb[l] = take(p.own[l]);
    grad = std::max(grad, p.own[l] * width[l] + p.own[l]);
  }
  for (int l = 1; l + 1 < L; ++l) {
    s.cols_w[l] = take(p.own[l - 1] * width[l + 1]);
    s.cols_vw[l] = take(p.own[l - 1] * width[l + 1]);
    grad = std::max(grad, p.own[l - 1] * width[l + 1]);
  }
  s.head_w = take(C * width[L - 1]);
  s.head_b = take(C);
  s.head_vw = take(C * width[L - 1]);
  s.head_vb = take(C);
  s.dlogits = take(B * C);
  s.row_loss = take(B);
  s.row_hit = take(B);
  s.mine = take(B * p.own_max);
  s.own_act = take(B * p.own_max);
  s.grad = take(grad);
  s.head_grad = take(C * width[L - 1] + C);
  s.pixel_lut = take(kMaxBatchChannels * 256);
  s.batch_row = take(B);
  s.batch_label = take(B);
  s.batch_pixels = -1;
  s.total = at;
  return p;
}

// The step's rows of the data set and their labels into shared memory; and, where the plan keeps them there
// (batch_pixels), the step's images as uint8: 16-byte loads where rows are whole ones, kBatchLoads in flight a thread,
// all issued before any is used (a block's one wait on L2 for the batch a step). Followed by __syncthreads.
// This loop and stage_batch's and stage_rows' are written out each: one helper taking the load and the store as
// lambdas made the step 2% (batch 64) to 4% (batch 256) slower on an H200, measured in one call against this code.
constexpr int kBatchLoads = 8;
__device__ void load_batch(const Params& q, float* smem, int64_t first) {
  const BatchSource& src = q.a.src;
  const Layout& s = q.p.at;
  const int B = q.a.B, D = src.D;
  int* rows = reinterpret_cast<int*>(smem + s.batch_row);
  int* labels = reinterpret_cast<int*>(smem + s.batch_label);
  for (int b = threadIdx.x; b < B; b += kThreads) {
    const int64_t row = src.perm[first + b];
    rows[b] = static_cast<int>(row);
    labels[b] = src.labels[row];
  }
  __syncthreads();
  if (s.batch_pixels < 0) return;
  uint8_t* pixels = reinterpret_cast<uint8_t*>(smem + s.batch_pixels);
  if (D % 16 == 0) {
    const int vectors = D / 16, total = B * vectors;
    for (int base = threadIdx.x; base < total; base += kThreads * kBatchLoads) {
      uint4 v[kBatchLoads];
#pragma unroll
      for (int u = 0; u < kBatchLoads; ++u) {
        const int i = base + u * kThreads;
        if (i < total)
          v[u] = __ldg(reinterpret_cast<const uint4*>(src.images + int64_t(rows[i / vectors]) * D) + i % vectors);
      }
#pragma unroll
      for (int u = 0; u < kBatchLoads; ++u) {
        const int i = base + u * kThreads;
        if (i < total) reinterpret_cast<uint4*>(pixels)[i] = v[u];
      }
    }
  } else {
    for (int i = threadIdx.x; i < B * D; i += kThreads) pixels[i] = src.images[int64_t(rows[i / D]) * D + i % D];
  }
  __syncthreads();
}

// Rows [r0, r0 + rows) of the step's batch into stage (rows × D), normalized (kernels/batch.h) through pixel_lut:
// each plane's 256 values computed once by normalize_pixel, the same bits without two divisions a pixel. From the
// uint8 images in shared memory where the plan keeps them, else from L2, four pixels a load where rows are whole
// words and kStageLoads loads in flight a thread.
constexpr int kStageLoads = 4;
__device__ void stage_batch(const Params& q, const float* smem, int r0, int rows, float* stage) {
  const BatchSource& src = q.a.src;
  const Layout& s = q.p.at;
  const float* pixel_lut = smem + s.pixel_lut;
  const int* batch_row = reinterpret_cast<const int*>(smem + s.batch_row);
  const int D = src.D;
  const int P = src.height > 0 && src.width > 0 ? src.height * src.width : D;
  auto plane = [&](int k) { return P == D ? 0 : k / P; };
  if (s.batch_pixels >= 0) {
    const uint8_t* pixels = reinterpret_cast<const uint8_t*>(smem + s.batch_pixels) + int64_t(r0) * D;
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

// How many K-wide rows the stage holds (at least one: the plan sizes it for the widest), at most the batch.
__device__ __forceinline__ int stage_rows_for(const Params& q, int K) { return min(q.a.B, q.p.stage_floats / K); }

// Layer l's input rows [r0, r0 + rows): the batch for l = 0, else a[l-1] from the workspace.
__device__ void stage_input(const Params& q, const float* smem, int l, int r0, int rows, float* stage) {
  if (l == 0)
    stage_batch(q, smem, r0, rows, stage);
  else
    stage_rows(q.ws.activation[l], q.a.width[l], r0, rows, stage);
}

// A layer's weight gradient over the staged rows [r0, r0 + rows) of its input, added to grad (outputs × K):
// grad[j, k] += Σ_r d[r0 + r, j]·in[r, k], each a chain in increasing r (kernels/persistent_mlp_math.h), with d's row
// b at d + b·d_stride (the gradient at the layer's outputs) and in the staged input (rows × K). A thread a tile of
// kGradCols outputs × four consecutive k, so that one 16-byte load of in serves kGradCols · 4 FMAs.
constexpr int kGradCols = 2;
__device__ void add_weight_gradient(const float* d, int d_stride, int r0, int rows, const float* in, int K, int outputs,
                                    float* grad) {
  const int k_groups = (K + 3) / 4, col_tiles = (outputs + kGradCols - 1) / kGradCols;
  const bool whole_float4s = K % 4 == 0;
  for (int t = threadIdx.x; t < col_tiles * k_groups; t += kThreads) {
    const int j0 = t / k_groups * kGradCols, k0 = t % k_groups * 4;
    float g[kGradCols][4];
#pragma unroll
    for (int j = 0; j < kGradCols; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) g[j][e] = j0 + j < outputs && k0 + e < K ? grad[(j0 + j) * K + k0 + e] : 0.f;
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
    for (int j = 0; j < kGradCols; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (j0 + j < outputs && k0 + e < K) grad[(j0 + j) * K + k0 + e] = g[j][e];
  }
}

// The bias gradient over the same rows, added to grad_bias (outputs): Σ_r d[r0 + r, j], r increasing.
__device__ void add_bias_gradient(const float* d, int d_stride, int r0, int rows, int outputs, float* grad_bias) {
  for (int j = threadIdx.x; j < outputs; j += kThreads) {
    float g = grad_bias[j];
    for (int r = 0; r < rows; ++r) g = persistent::add_rn(g, d[(r0 + r) * d_stride + j]);
    grad_bias[j] = g;
  }
}

// Both of a layer's gradients: weights (outputs × K), then biases (outputs), in grad.
__device__ void add_layer_gradient(const float* d, int d_stride, int r0, int rows, const float* in, int K, int outputs,
                                   float* grad) {
  add_weight_gradient(d, d_stride, r0, rows, in, K, outputs, grad);
  add_bias_gradient(d, d_stride, r0, rows, outputs, grad + outputs * K);
}

// The SGD step of the rows of hidden layer l this block owns, from mine (B × own: d at its own neurons) and layer l's
// input (staged again): grad = Σ_b mine[b,j]·in[b,k], b increasing, then each weight's step.
__device__ void step_rows(const Params& q, float* smem, const SgdStep& sgd, int l, int count) {
  const PersistentMlpArgs& a = q.a;
  const Layout& s = q.p.at;
  const int B = a.B, K = a.width[l], own = q.p.own[l];
  float* grad = smem + s.grad;
  float* stage = smem + s.stage;
  const float* mine = smem + s.mine;
  for (int i = threadIdx.x; i < count * K + count; i += kThreads) grad[i] = 0.f;
  const int R = stage_rows_for(q, K);
  for (int r0 = 0; r0 < B; r0 += R) {
    const int rows = min(R, B - r0);
    __syncthreads();
    stage_input(q, smem, l, r0, rows, stage);
    __syncthreads();
    add_layer_gradient(mine, own, r0, rows, stage, K, count, grad);
  }
  __syncthreads();
  float* w = smem + s.rows_w[l];
  float* b = smem + s.rows_b[l];
  float* vw = smem + s.rows_vw[l];
  float* vb = smem + s.rows_vb[l];
  for (int i = threadIdx.x; i < count * K; i += kThreads) sgd.apply(w[i], grad[i], vw[i]);
  for (int j = threadIdx.x; j < count; j += kThreads) sgd.apply(b[j], grad[count * K + j], vb[j]);
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 1) persistent_mlp_kernel(const Params q, StampRing stamps) {
  begin_dependent_kernel(stamps);
  mark_phase(q, kLoad);
  extern __shared__ __align__(16) float smem[];
  const PersistentMlpArgs& a = q.a;
  const Layout& s = q.p.at;
  const int L = a.layers, B = a.B, C = a.width[L], g = blockIdx.x;
  const SgdStep sgd{a.lr_scale ? __fmul_rn(a.lr, *a.lr_scale) : a.lr, a.momentum, a.weight_decay};
  const bool momentum = a.momentum != 0.f;

  // The block's range of each hidden layer's outputs.
  int n0[kMaxLayers], count[kMaxLayers];
  for (int l = 0; l + 1 < L; ++l) {
    n0[l] = min(a.width[l + 1], g * q.p.own[l]);
    count[l] = min(a.width[l + 1], n0[l] + q.p.own[l]) - n0[l];
  }

  // Load: rows and columns of the hidden layers, the whole head; velocities (zero without momentum: never read).
  // Written out, as is the store at the end: __device__ helpers for a slice's load and store ran every step 0.7%
  // (batch 64) to 1.4% (batch 256) slower on an H200 (the same call, against this code), though they run once.
  for (int l = 0; l + 1 < L; ++l) {
    const int K = a.width[l];
    for (int i = threadIdx.x; i < count[l] * K; i += kThreads) {
      const int64_t at = int64_t(n0[l]) * K + i;
      smem[s.rows_w[l] + i] = a.weight[l][at];
      smem[s.rows_vw[l] + i] = momentum ? a.weight_velocity[l][at] : 0.f;
    }
    for (int j = threadIdx.x; j < count[l]; j += kThreads) {
      smem[s.rows_b[l] + j] = a.bias[l][n0[l] + j];
      smem[s.rows_vb[l] + j] = momentum ? a.bias_velocity[l][n0[l] + j] : 0.f;
    }
  }
  for (int l = 1; l + 1 < L; ++l) {  // columns i of W[l] (N × K): [j][n] = W[l][n, n0[l-1] + j]
    const int K = a.width[l], N = a.width[l + 1];
    for (int i = threadIdx.x; i < count[l - 1] * N; i += kThreads) {
      const int j = i / N, n = i % N;
      const int64_t at = int64_t(n) * K + n0[l - 1] + j;
      smem[s.cols_w[l] + i] = a.weight[l][at];
      smem[s.cols_vw[l] + i] = momentum ? a.weight_velocity[l][at] : 0.f;
    }
  }
  const int KH = a.width[L - 1];
  for (int i = threadIdx.x; i < C * KH; i += kThreads) {
    smem[s.head_w + i] = a.weight[L - 1][i];
    smem[s.head_vw + i] = momentum ? a.weight_velocity[L - 1][i] : 0.f;
  }
  for (int j = threadIdx.x; j < C; j += kThreads) {
    smem[s.head_b + j] = a.bias[L - 1][j];
    smem[s.head_vb + j] = momentum ? a.bias_velocity[L - 1][j] : 0.f;
  }
  for (int i = threadIdx.x; i < kMaxBatchChannels * 256; i += kThreads)
    smem[s.pixel_lut + i] =
        normalize_pixel(static_cast<uint8_t>(i % 256), a.src.mean.value[i / 256], a.src.std.value[i / 256]);
  __syncthreads();

  float* stage = smem + s.stage;
  float* mine = smem + s.mine;
  float* own_act = smem + s.own_act;
  float* dlogits = smem + s.dlogits;

  mark_phase(q, kForward);
  for (int step = 0; step < a.steps; ++step) {
    load_batch(q, smem, a.first + int64_t(step) * B);

    // ---- forward through the hidden layers: own outputs, to the workspace
    for (int l = 0; l + 1 < L; ++l) {
      const int K = a.width[l], N = a.width[l + 1], own = count[l];
      const float* w = smem + s.rows_w[l];
      const float* bias = smem + s.rows_b[l];
      const int R = stage_rows_for(q, K);
      for (int r0 = 0; r0 < B; r0 += R) {
        const int rows = min(R, B - r0);
        stage_input(q, smem, l, r0, rows, stage);
        __syncthreads();
        float* out = q.ws.activation[l + 1] + int64_t(r0) * N + n0[l];
        tiled_dots(stage, K, w, K, K, rows, own, [&](int r, int j, float dot) {
          out[int64_t(r) * N + j] = persistent::linear_out(dot, bias[j], true);
        });
        __syncthreads();
      }
      phase_barrier(q, l + 2 < L ? kForward : kHead);
    }

    // ---- the head, in every block: logits, softmax, d at the own neurons of layer L-2, the head's gradient
    float* head_grad = smem + s.head_grad;
    for (int i = threadIdx.x; i < C * KH + C; i += kThreads) head_grad[i] = 0.f;
    const float* hw = smem + s.head_w;
    const int own_h = count[L - 2], own_h_stride = q.p.own[L - 2];
    const int RH = stage_rows_for(q, KH);
    for (int r0 = 0; r0 < B; r0 += RH) {
      const int rows = min(RH, B - r0);
      stage_rows(q.ws.activation[L - 1], KH, r0, rows, stage);
      __syncthreads();
      tiled_dots(stage, KH, hw, KH, KH, rows, C, [&](int r, int c, float dot) {
        dlogits[(r0 + r) * C + c] = persistent::linear_out(dot, smem[s.head_b + c], false);
      });
      __syncthreads();
      for (int r = threadIdx.x; r < rows; r += kThreads) {
        const int b = r0 + r;
        const int label = reinterpret_cast<const int*>(smem + s.batch_label)[b];
        bool hit = false;
        smem[s.row_loss + b] = persistent::softmax_xent_row(dlogits + b * C, C, label, B, &hit);
        smem[s.row_hit + b] = hit ? 1.f : 0.f;
      }
      __syncthreads();
      for (int i = threadIdx.x; i < rows * own_h; i += kThreads) {
        const int r = i / own_h, j = i % own_h, n = n0[L - 2] + j;
        const float sum = dot4(dlogits + (r0 + r) * C, hw + n, C, KH);
        const float d = stage[r * KH + n] > 0.f ? sum : 0.f;
        mine[(r0 + r) * own_h_stride + j] = d;
        if (L > 2) q.ws.gradient[L - 2][int64_t(r0 + r) * KH + n] = d;
      }
      add_layer_gradient(dlogits, C, r0, rows, stage, KH, C, head_grad);
      __syncthreads();
    }
    // One thread adds the batch's losses in increasing b (64 dependent double adds, about a microsecond): the last
    // block, which owns the fewest neurons, so that the wait falls where the block has time to spare.
    if (g == gridDim.x - 1 && threadIdx.x == 0) {
      double loss = 0.0;
      long long hits = 0;
      for (int b = 0; b < B; ++b) {
        loss += double(smem[s.row_loss + b]);
        hits += smem[s.row_hit + b] != 0.f ? 1 : 0;
      }
      *a.loss_sum += loss;
      *a.correct += hits;
    }
    for (int i = threadIdx.x; i < C * KH; i += kThreads)
      sgd.apply(smem[s.head_w + i], head_grad[i], smem[s.head_vw + i]);
    for (int c = threadIdx.x; c < C; c += kThreads)
      sgd.apply(smem[s.head_b + c], head_grad[C * KH + c], smem[s.head_vb + c]);
    __syncthreads();
    step_rows(q, smem, sgd, L - 2, count[L - 2]);
    // The backward needs d[L-2] from every block; with one hidden layer, the next step's forward overwrites a[0],
    // which every block has just read.
    if (L > 2 || step + 1 < a.steps) phase_barrier(q, L > 2 ? kBackward : kForward);

    // ---- backward through the hidden layers: l's gradient (from every block) to l-1's own neurons
    for (int l = L - 2; l >= 1; --l) {
      const int N = a.width[l + 1], K = a.width[l], own = count[l - 1], own_stride = q.p.own[l - 1];
      float* cw = smem + s.cols_w[l];
      float* cvw = smem + s.cols_vw[l];
      float* grad = smem + s.grad;
      for (int i = threadIdx.x; i < B * own; i += kThreads) {
        const int b = i / own, j = i % own;
        own_act[b * own_stride + j] = __ldcg(q.ws.activation[l] + int64_t(b) * K + n0[l - 1] + j);
      }
      for (int i = threadIdx.x; i < own * N; i += kThreads) grad[i] = 0.f;
      const int R = stage_rows_for(q, N);
      for (int r0 = 0; r0 < B; r0 += R) {
        const int rows = min(R, B - r0);
        __syncthreads();
        stage_rows(q.ws.gradient[l], N, r0, rows, stage);
        __syncthreads();
        tiled_dots(stage, N, cw, N, N, rows, own, [&](int r, int j, float sum) {
          const float d = own_act[(r0 + r) * own_stride + j] > 0.f ? sum : 0.f;
          mine[(r0 + r) * own_stride + j] = d;
          if (l - 1 >= 1) q.ws.gradient[l - 1][int64_t(r0 + r) * K + n0[l - 1] + j] = d;
        });
        add_weight_gradient(own_act, own_stride, r0, rows, stage, N, own, grad);  // the column copy's gradient
      }
      __syncthreads();
      for (int i = threadIdx.x; i < own * N; i += kThreads) sgd.apply(cw[i], grad[i], cvw[i]);
      __syncthreads();
      step_rows(q, smem, sgd, l - 1, count[l - 1]);
      if (l - 1 >= 1) phase_barrier(q, kBackward);
    }
    if (L > 2 && step + 1 < a.steps) mark_phase(q, kForward);  // no barrier closes such a step
  }
  mark_phase(q, kStore);

  // Store: each block its rows of the hidden layers, block 0 the head (all copies are equal).
  for (int l = 0; l + 1 < L; ++l) {
    const int K = a.width[l];
    for (int i = threadIdx.x; i < count[l] * K; i += kThreads) {
      const int64_t at = int64_t(n0[l]) * K + i;
      a.weight[l][at] = smem[s.rows_w[l] + i];
      if (momentum) a.weight_velocity[l][at] = smem[s.rows_vw[l] + i];
    }
    for (int j = threadIdx.x; j < count[l]; j += kThreads) {
      a.bias[l][n0[l] + j] = smem[s.rows_b[l] + j];
      if (momentum) a.bias_velocity[l][n0[l] + j] = smem[s.rows_vb[l] + j];
    }
  }
  if (g == 0) {
    for (int i = threadIdx.x; i < C * KH; i += kThreads) {
      a.weight[L - 1][i] = smem[s.head_w + i];
      if (momentum) a.weight_velocity[L - 1][i] = smem[s.head_vw + i];
    }
    for (int c = threadIdx.x; c < C; c += kThreads) {
      a.bias[L - 1][c] = smem[s.head_b + c];
      if (momentum) a.bias_velocity[L - 1][c] = smem[s.head_vb + c];
    }
  }
  if (g == 0 && threadIdx.x == 0) q.phases.end();
}

// The plan for the current device, the stage as large as fits (at least one of the widest rows); G = 0
// where it does not fit or cannot run.
Plan device_plan(const int* width, int layers, int B) {
  if (layers < 2 || layers > kMaxLayers || B < 1 || B > kPersistentMaxBatch) return {};
  const int G = multiprocessor_count();
  Plan p = plan(width, layers, B, G);
  const size_t limit = max_shared_bytes_per_block() / sizeof(float);
  if (size_t(p.at.total) + (size_t(p.stage_width) + 3) / 4 * 4 > limit) return {};
  // The step's images stay in shared memory as uint8 (one gather from L2 a step, for the forward and the weight
  // gradient alike) when that leaves room for at least kMinStageRows staged rows; else each use gathers its rows.
  const size_t pixel_floats = (size_t(B) * width[0] + 15) / 16 * 4;
  if (size_t(p.at.total) + pixel_floats + size_t(std::min(B, kMinStageRows)) * p.stage_width <= limit) {
    p.at.batch_pixels = p.at.total;
    p.at.total += static_cast<int>(pixel_floats);
  }
  // The stage takes the rest, up to the whole batch of the widest row: a narrower input then stages more rows at once
  // (the mlp at batch 64: the images in two halves, every hidden layer's rows at once).
  p.stage_floats = static_cast<int>(std::min<size_t>(size_t(B) * p.stage_width, (limit - p.at.total) / 4 * 4));
  p.at.stage = p.at.total;
  p.at.total += p.stage_floats;
  int resident = 0;
  const size_t bytes = size_t(p.at.total) * sizeof(float);
  if (cudaFuncSetAttribute(persistent_mlp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) !=
          cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, persistent_mlp_kernel, kThreads, bytes) != cudaSuccess ||
      resident < 1) {
    cudaGetLastError();
    return {};
  }
  return p;
}

}  // namespace

bool persistent_mlp_fits(const int* width, int layers, int B) { return device_plan(width, layers, B).G > 0; }

void persistent_mlp(const Exec& exec, const PersistentMlpArgs& a) {
  check_persistent_mlp(a);
  const Plan p = device_plan(a.width, a.layers, a.B);
  NT_CHECK(p.G > 0, "persistent_mlp: this model (", a.layers, " layers) at batch ", a.B,
           " does not fit the device's blocks (persistent_mlp_fits)");
  Params q{};
  q.a = a;
  q.p = p;
  q.ws = persistent_mlp_workspace(a.workspace, a.width, a.layers, a.B);
  q.barrier = GridBarrier{q.ws.barrier, q.ws.barrier + 1};
  if (a.steps == 0) return;
  q.phases = profile::phase_stamps_for(exec.observer, kPhaseNames, std::size(kPhaseNames));
  profile::OpCost cost;
  int64_t weights = 0;
  for (int l = 0; l < a.layers; ++l) weights += int64_t(a.width[l]) * a.width[l + 1];
  cost.flops = 6.0 * double(weights) * a.B * a.steps;  // forward, input gradient and weight gradient
  cost.bytes = double(a.steps) * a.B * a.width[0];     // the batches' pixels; the weights stay on chip
  launch_with(exec, "persistent_mlp", cost, persistent_mlp_kernel, dim3(p.G), dim3(kThreads),
              size_t(p.at.total) * sizeof(float), /*cooperative=*/true, q);
}

}  // namespace nt::kernels::cuda
