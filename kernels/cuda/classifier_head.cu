// The classifier head on the GPU: last Linear + softmax cross-entropy, forward and backward, one launch.
//
// Math and layouts: kernels/classifier_head.h. x (B,K), W (C,K), logits and dlogits (B,C), dW (C,K),
// dx (B,K), all row-major; C <= kHeadMaxClasses.
//
// Shape of the launch: ONE thread-block cluster of 8 blocks (sm_90) of 256 threads. Block r of the cluster
// owns the rows [r·R, (r+1)·R), R = ceil(B/8): at the mlp's batch 64, a row per warp. A single block of
// 1024 threads (the first version) took 32 µs at batch 64 on an H100, all rows' work on one SM; eight SMs
// share the row work here, and the cluster's
// distributed shared memory reduces the weight gradient in a fixed order, with no atomics, no workspace
// and no second launch (the technique of the split-K GEMM, kernels/cuda/gemm.cu).
//
// Phase 1, a warp per row (its block's rows b = r·R + warp, + 8, ...):
//   logits   lane l accumulates x[b][k]·W[c][k] over k = l, l+32, ... for every class c (MaxC registers),
//            then a xor butterfly per class gives every lane all C sums (a+b == b+a: the same bits in
//            every lane); lane c keeps logit c and adds bias[c].
//   softmax cross-entropy on lanes 0..C-1 with the row arithmetic of kernels/cuda/softmax_xent.cu (one
//            class per lane, so its exp sum is the same butterfly): loss, argmax hit, dlogits row.
//   dx       lane l computes dx[b][k] = Σ_c dlogits[b][c]·W[c][k] (c ascending) for k = l, l+32, ...,
//            selected by x[b][k] > 0 when the previous layer ended in a ReLU.
// __syncthreads: the block's dlogits, staged in shared memory, are then visible to all its threads.
// Phase 2, the block's partial weight gradient in shared memory, a thread per input k (coalesced x), the
// block's dlogits staged in shared memory by phase 1: part[c·K + k] = Σ_{b in the block's rows} dl[b][c]·x[b][k],
// b ascending, and part[C·K + c] = Σ_b dl[b][c] (read back from global memory, each row of each element would
// cost an L2 round trip, in sequence). Row losses and hits: per-warp slots, summed in warp
// order. cluster.sync, then block r writes its 1/8 share of dW and db as Σ over ranks 0..7 of the blocks'
// partials, and rank 0 adds the 8 blocks' losses and hits, in rank order, to the device-resident counters.
// cluster.sync again, so that no block leaves while another still reads its shared memory.
//
// Limit: a block's rows grow as B/8 (batch 256: 4 rows per warp); in training, dynamic shared memory holds
// (C·K + C) + (B/8)·C floats (opted into above 48 KB; beyond what a block can have, the unfused ops run).
#include <climits>
#include <cmath>
#include <cstdint>

#include <cooperative_groups.h>

#include "kernels/classifier_head.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace nt::kernels::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kClusterBlocks = 8;  // the portable cluster size
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;

struct RowTotals {
  double loss = 0;   // this warp's row losses in row order (lane 0)
  long long hits = 0;
};

// Phase 1 for row b, by one warp (see the top of the file).
// sdl: this block's dlogits rows in shared memory (row b at sdl[(b - r0)·C]), for phase 2.
template <int MaxC>
__device__ void head_row(const ClassifierHead& h, int b, int lane, float* sdl, RowTotals& totals) {
  const int K = h.K, C = h.C;
  const float* x = h.x + static_cast<int64_t>(b) * K;  // x: (K) this row
  const int32_t label = h.labels[b];

  float part[MaxC];
#pragma unroll
  for (int c = 0; c < MaxC; ++c) part[c] = 0.f;
#pragma unroll 4
  for (int k = lane; k < K; k += kWarpSize) {
    const float xv = x[k];
#pragma unroll
    for (int c = 0; c < MaxC; ++c)
      if (c < C) part[c] = fmaf(xv, __ldg(h.weight + static_cast<int64_t>(c) * K + k), part[c]);
  }
  float z = -INFINITY;  // lane c's logit; lanes past C never win the argmax (-inf, index INT_MAX)
#pragma unroll
  for (int c = 0; c < MaxC; ++c) {
    if (c >= C) break;
    const float sum = warp_sum(part[c]);
    if (c == lane) z = sum;
  }
  const bool in_row = lane < C;
  if (in_row) {
    if (h.bias) z += __ldg(h.bias + lane);
    h.logits[static_cast<int64_t>(b) * C + lane] = z;
  }

  float m = z;
  int k_max = in_row ? lane : INT_MAX;
  warp_argmax(m, k_max);
  const float e = in_row ? expf(z - m) : 0.f;
  const float s = warp_sum(e);
  const bool label_ok = label >= 0 && label < C;
  const float z_label = __shfl_sync(kFullMask, z, label_ok ? label : 0);
  if (lane == 0) {
    totals.loss += static_cast<double>(logf(s) + (m - (label_ok ? z_label : __int_as_float(0x7fffffff))));
    totals.hits += (label_ok && k_max == label) ? 1 : 0;
  }
  if (!h.dlogits) return;

  const float dl = in_row ? (e / s - (lane == label ? 1.f : 0.f)) / static_cast<float>(h.B) : 0.f;
  if (in_row) h.dlogits[static_cast<int64_t>(b) * C + lane] = dl, sdl[lane] = dl;
  if (h.dx) {
    float dls[MaxC];  // the row's dlogits, in every lane
#pragma unroll
    for (int c = 0; c < MaxC; ++c) dls[c] = __shfl_sync(kFullMask, dl, c);
    float* dx = h.dx + static_cast<int64_t>(b) * K;  // dx: (K) this row's input gradient
#pragma unroll 2
    for (int k = lane; k < K; k += kWarpSize) {
      float acc = 0.f;
#pragma unroll
      for (int c = 0; c < MaxC; ++c)
        if (c < C) acc = fmaf(dls[c], __ldg(h.weight + static_cast<int64_t>(c) * K + k), acc);
      dx[k] = (!h.mask_dx || x[k] > 0.f) ? acc : 0.f;
    }
  }
}

// Phase 2, this block's partial weight gradient over its rows [r0, r1): a thread per input k, which reads
// x[b][k] once per row and every class's dlogit from shared memory (a broadcast):
//   part[c·K + k] = Σ_b dl[b][c]·x[b][k],   part[C·K + c] = Σ_b dl[b][c]   (b ascending).
template <int MaxC>
__device__ void partial_weight_grads(const ClassifierHead& h, int r0, int r1, const float* sdl, float* part) {
  const int K = h.K, C = h.C;
  for (int k = threadIdx.x; k < K; k += kThreads) {
    float acc[MaxC];
#pragma unroll
    for (int c = 0; c < MaxC; ++c) acc[c] = 0.f;
#pragma unroll 4
    for (int b = r0; b < r1; ++b) {
      const float xv = h.x[static_cast<int64_t>(b) * K + k];
      const float* dl = sdl + (b - r0) * C;  // dl: (C) row b's dlogits
#pragma unroll
      for (int c = 0; c < MaxC; ++c)
        if (c < C) acc[c] = fmaf(dl[c], xv, acc[c]);
    }
#pragma unroll
    for (int c = 0; c < MaxC; ++c)
      if (c < C) part[c * K + k] = acc[c];
  }
  for (int c = threadIdx.x; c < C; c += kThreads) {
    float acc = 0.f;
    for (int b = r0; b < r1; ++b) acc += sdl[(b - r0) * C + c];
    part[C * K + c] = acc;
  }
}

struct BlockTotals {
  double loss;
  long long hits;
};

template <int MaxC>
__global__ void NT_CLUSTER_DIMS(kClusterBlocks, 1, 1) __launch_bounds__(kThreads)
    classifier_head_kernel(ClassifierHead h) {
  begin_dependent_kernel();
#if NT_CLUSTERS
  // Training: this block's partial dW (C·K) and db (C), then its rows' dlogits (R·C).
  extern __shared__ __align__(16) float part[];
  __shared__ double warp_loss[kWarps];
  __shared__ long long warp_hits[kWarps];
  __shared__ BlockTotals block_totals;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int rows_per_block = (h.B + kClusterBlocks - 1) / kClusterBlocks;
  const int r0 = min(rank * rows_per_block, h.B), r1 = min(r0 + rows_per_block, h.B);

  float* sdl = part + h.C * h.K + h.C;  // used in training only
  RowTotals totals;
  for (int b = r0 + warp; b < r1; b += kWarps) head_row<MaxC>(h, b, lane, sdl + (b - r0) * h.C, totals);
  if (lane == 0) warp_loss[warp] = totals.loss, warp_hits[warp] = totals.hits;
  __syncthreads();

  if (h.dweight) partial_weight_grads<MaxC>(h, r0, r1, sdl, part);
  if (threadIdx.x == 0) {
    BlockTotals t{0, 0};
    for (int w = 0; w < kWarps; ++w) t.loss += warp_loss[w], t.hits += warp_hits[w];  // fixed order
    block_totals = t;
  }
  cluster.sync();  // every block's partials are in place

  if (h.dweight) {
    const float* parts[kClusterBlocks];
#pragma unroll
    for (int q = 0; q < kClusterBlocks; ++q) parts[q] = cluster.map_shared_rank(part, q);
    const int elems = h.C * h.K + h.C, share = (elems + kClusterBlocks - 1) / kClusterBlocks;
    for (int e = rank * share + threadIdx.x; e < min(elems, (rank + 1) * share); e += kThreads) {
      float v = parts[0][e];
#pragma unroll
      for (int q = 1; q < kClusterBlocks; ++q) v += parts[q][e];
      if (e < h.C * h.K) h.dweight[e] = v;
      else if (h.dbias) h.dbias[e - h.C * h.K] = v;
    }
  }
  if (rank == 0 && threadIdx.x == 0) {
    double loss = 0;
    long long hits = 0;
    for (int q = 0; q < kClusterBlocks; ++q) {  // rank order
      const BlockTotals* t = cluster.map_shared_rank(&block_totals, q);
      loss += t->loss, hits += t->hits;
    }
    *h.loss_sum += loss;
    *h.correct += hits;
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
#else
  __trap();  // clusters need sm_90; the launcher takes the unfused path where this image would run
#endif
}

}  // namespace

void classifier_head(const Exec& exec, const ClassifierHead& h) {
  check_classifier_head(h);
  NT_CHECK(classifier_head_fits(h.C, h.K), "classifier head: ", h.C, " classes of ", h.K,
           " inputs; the CUDA kernel serves 1..", kHeadMaxClasses, " classes and (C*K + C)*4 <= ",
           kHeadMaxSharedBytes, " bytes");
  auto kernel = h.C <= 16 ? classifier_head_kernel<16> : classifier_head_kernel<kHeadMaxClasses>;
  static const bool runs = cluster_kernels_run(classifier_head_kernel<16>);
  const bool backward = h.dweight != nullptr;
  const int64_t rows_per_block = (h.B + kClusterBlocks - 1) / kClusterBlocks;
  const size_t smem = backward ? (size_t(h.C) * h.K + h.C + size_t(rows_per_block) * h.C) * sizeof(float) : 0;
  // Where the kernel cannot run (no clusters) or a huge batch's dlogits overflow shared memory: the unfused ops.
  if (!runs || smem > size_t(kHeadMaxSharedBytes) + 16 * 1024) return classifier_head_unfused(exec, h);

  if (smem > 48 * 1024)  // above the default limit a kernel must opt in (once per size is enough)
    NT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const double B = h.B, K = h.K, C = h.C;
  // x, W, bias and labels read once; logits written; with the backward dlogits, dW, db and dx written
  // (x and W are read again from cache). Flops: one B·K·C product forward, two backward.
  double bytes = 4.0 * (B * K + C * K + C + B + B * C);
  if (backward) bytes += 4.0 * (B * C + C * K + C + (h.dx ? B * K : 0));
  const double flops = 2.0 * B * K * C * (backward ? (h.dx ? 3 : 2) : 1) + 7.0 * B * C;
  launch(exec, "classifier_head", profile::OpCost{bytes, flops}, kernel, dim3(kClusterBlocks), dim3(kThreads), smem,
         h);
}

}  // namespace nt::kernels::cuda
