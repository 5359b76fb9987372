// The classifier head on the GPU: last Linear + softmax cross-entropy, forward and backward, one launch.
//
// Math and layouts: kernels/classifier_head.h. x (B,K), W (C,K), logits and dlogits (B,C), dW (C,K),
// dx (B,K), all row-major; C <= kHeadMaxClasses.
//
// Shape of the launch: ONE thread-block cluster of 8 blocks (sm_90), each a warp per row of its share (8 to 32
// warps, head_threads). Block r of the cluster owns the rows [r·R, (r+1)·R), R = ceil(B/8): a row per warp up to
// batch 256 (up to 128 with more than 16 classes), several rows a warp above. A single block of
// 1024 threads (the first version) was slow, all rows' work on one SM (docs/design.md); eight SMs
// share the row work here, and the cluster's distributed shared memory reduces the weight gradient in a
// fixed order, with no atomics, no workspace and no second launch (the technique of the split-K GEMM,
// kernels/cuda/gemm.cu).
//
// Staging: every block first copies W and its own rows of x into shared memory, all loads in flight at
// once, so the kernel pays one global-memory round trip; everything after reads shared memory, as float4
// along k. (Version 2 read W from global memory inside the per-class loop, behind a class guard, so each
// load waited for the one before. Staged, with a lane per class, only 10 of 32 lanes were busy. Lanes along
// k with float4 operands cut the instructions per warp several-fold. Nsight Compute's numbers: docs/design.md,
// 'The classifier head's kernel'.)
//   shared memory (floats), rows of ldw = 4·ld4: K rounded up to a float4 (pads zero), then padded so that the
//   logits' reads of W rows do not conflict in the banks (padded_row4):
//     sW (C, ldw); in training, once W is no longer needed, the block's partial dW (C, ldw) over it
//     sx (R, ldw) the block's rows of x;   sdl (R, C) their dlogits and the partial db (C) (training)
//
// Phase 1, a warp per row (its block's rows b = r·R + warp, + 8, ...):
//   logits   P = lanes_per_class(C) lanes per class (2 for 10 classes): lane c·P + p sums x[b]·W[c] over the
//            float4 columns p, p+P, ... (4 products each, k order), the class's P lanes add their sums in a xor
//            butterfly, and lane c takes logit c and adds bias[c]. (Version 3 had every lane sum all C classes
//            over the columns l, l+32, ... and reduced each class over the whole warp: at the mlp's 10 classes
//            of 160 inputs, 1,076 instructions a warp in this phase, most of them the class guards and the ten
//            butterflies; docs/design.md, 'The classifier head's kernel'.)
//   softmax cross-entropy on lanes 0..C-1 with the row arithmetic of kernels/cuda/softmax_xent.cu (one
//            class per lane, the same butterflies): loss, argmax hit, dlogits row (to global and to sdl).
//   dx       lane l on the float4 columns q = l, l+32, ...: dx[b][q] = Σ_c dl[b][c]·W[c][q] (c ascending),
//            selected by x[b][q] > 0 when the previous layer ended in a ReLU.
// __syncthreads: W is no longer needed, the block's dlogits are visible to all its threads.
// Phase 2, the block's partial weight gradient, a thread per (c, q):
//   part[c][q] = Σ_{b in the block's rows} dl[b][c]·x[b][q] and part_db[c] = Σ_b dl[b][c], b ascending.
// Row losses and hits: per-warp slots, summed in a fixed xor tree over the warps. cluster.sync, then block r writes its
// 1/8 share of dW (float4 columns) and rank 0 db, each as Σ over ranks 0..7 of the blocks' partials, and rank 0 adds
// the 8 blocks' losses and hits, in rank order, to the device-resident counters. A last cluster barrier, so that no
// block leaves while another still reads its shared memory.
//
// BF16 (Exec::math, kernels/operand.h): x and W are rounded as they are staged, and each dlogit where the products
// (and db) read it, so every product multiplies the operands the CPU twin's GEMMs round; the dlogits written, the
// loss and the bias stay fp32. The dx mask then tests the rounded x, which differs from x's sign only below BF16's
// smallest subnormal (2^-133).
//
// Limit: the shared memory grows with the rows per block (B/8); where it exceeds what a block can have,
// the unfused ops run instead.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include <cooperative_groups.h>

#include "kernels/classifier_head.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/warp_reduce.cuh"
#include "kernels/operand.h"

// The kernel's helpers are unreferenced in the device passes for GPUs without clusters, where its body is a stub
// (NT_CLUSTERS): nvcc's "declared but never referenced" there says nothing about the code that runs.
#pragma nv_diag_suppress 177

namespace nt::kernels::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kClusterBlocks = 8;  // the portable cluster size
// R: the rows of the batch each block of the cluster owns (the last block may own fewer).
__host__ __device__ constexpr int block_rows(int B) { return (B + kClusterBlocks - 1) / kClusterBlocks; }
// Threads per block: a warp per row of the block's R rows, at least 8 warps, and at most 32 (1024 threads, so 64
// registers a thread) in the kernel for up to 16 classes, 16 in the one that holds 32 classes' values a lane (at 64
// registers those spill). The rows' phase runs a row per warp at a time: a batch of 256 on 8 warps ran 4 rows one
// after another. max_classes: the kernel's MaxC.
__host__ __device__ constexpr int max_head_threads(int max_classes) { return max_classes <= 16 ? 1024 : 512; }
constexpr int kMaxWarps = max_head_threads(16) / kWarpSize;
int head_threads(int B, int max_classes) {
  return std::clamp(block_rows(B), 8, max_head_threads(max_classes) / kWarpSize) * kWarpSize;
}

struct RowTotals {
  double loss = 0;  // this warp's row losses in row order (lane 0)
  long long hits = 0;
};

// Lanes per class in the logits' dot products: the largest power of two P with P·C <= 32 (2 for 10 classes).
__host__ __device__ constexpr int lanes_per_class(int C) {
  int lanes = kWarpSize;
  while (lanes > 1 && lanes * C > kWarpSize) lanes /= 2;
  return lanes;
}

// The row stride of the staged matrices in float4s: k4 (= ceil(K/4), the float4 columns that hold K) padded so
// that the logits' reads of W do not conflict. A quarter-warp's eight 16-byte reads, lane = class·P + part reading
// W[class][part + ...], fall in eight distinct 16-byte bank groups when the stride is P mod 8 (P < 8), or odd (P = 1);
// eight lanes of one class (P >= 8) read consecutive float4s anyway.
__host__ __device__ constexpr int padded_row4(int k4, int lanes) {
  const int want = lanes % 8;
  int ld4 = k4;
  while (ld4 % 8 != want) ++ld4;
  return ld4;
}

// Shared memory of one block (see the top of the file), in floats.
struct HeadSmem {
  int k4;         // float4 columns holding a row of K values (the last one zero-padded)
  int ld4;        // row stride of sW, sx and the partial dW, in float4s (padded_row4)
  int w_floats;   // sW (C, 4·ld4); in training later the partial dW over it
  int x_floats;   // sx (R, 4·ld4), right after sW
  int dl_floats;  // sdl (R, C) and the partial db (C), training only
  __host__ __device__ HeadSmem(int B, int K, int C, bool training)
      : k4((K + 3) / 4),
        ld4(padded_row4(k4, lanes_per_class(C))),
        w_floats(C * 4 * ld4),
        x_floats(block_rows(B) * 4 * ld4),
        dl_floats(training ? (block_rows(B) + 1) * C : 0) {}
  __host__ __device__ size_t bytes() const { return size_t(w_floats + x_floats + dl_floats) * sizeof(float); }
};

// W (C, K) and the block's rows [r0, r0 + R) of x into sW and sx (row stride ld4 float4s, zero past K up to k4; the
// pad columns after are never read), which are consecutive in shared memory: one flat loop over the C + R rows'
// float4 columns, up to kStageBatch loads per thread in flight before the first store. Float4 loads where the rows
// are 16-byte aligned.
constexpr int kStageBatch = 4;

__device__ __forceinline__ float4 load_row4(const float* row, int k, int n, bool vec) {
  if (vec) return __ldg(reinterpret_cast<const float4*>(row + k));  // n % 4 == 0 here
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (k + 0 < n) v.x = __ldg(row + k + 0);
  if (k + 1 < n) v.y = __ldg(row + k + 1);
  if (k + 2 < n) v.z = __ldg(row + k + 2);
  if (k + 3 < n) v.w = __ldg(row + k + 3);
  return v;
}

// Four staged values as the products see them: themselves, or rounded to BF16.
template <bool RoundBf16>
__device__ __forceinline__ float4 operand4(float4 v) {
  if constexpr (RoundBf16)
    return make_float4(round_to_bf16(v.x), round_to_bf16(v.y), round_to_bf16(v.z), round_to_bf16(v.w));
  return v;
}

template <bool RoundBf16>
__device__ void stage_inputs(const ClassifierHeadArgs& h, int r0, int rows, const HeadSmem& layout, float* sW) {
  const int K = h.K, K4 = layout.k4, all_rows = h.C + rows;
  const bool vec =
      K % 4 == 0 && reinterpret_cast<uintptr_t>(h.weight) % 16 == 0 && reinterpret_cast<uintptr_t>(h.x) % 16 == 0;
  auto row_of = [&](int r) { return r < h.C ? h.weight + int64_t(r) * K : h.x + int64_t(r0 + r - h.C) * K; };
  float4* s4 = reinterpret_cast<float4*>(sW);  // s4: (C + rows, ld4), sx right after sW
  // The thread's float4s are the flat indices threadIdx.x + i·blockDim.x of the (C + rows, K4) rows; their (row,
  // column) advance by a fixed step, so one division serves them all.
  const int threads = static_cast<int>(blockDim.x), step_row = threads / K4, step_col = threads % K4;
  int row = threadIdx.x / K4, col = threadIdx.x % K4;
  while (row < all_rows) {
    float4 v[kStageBatch];
    int at[kStageBatch];  // the float4's place in s4, or -1 past the last row
#pragma unroll
    for (int j = 0; j < kStageBatch; ++j) {
      at[j] = row < all_rows ? row * layout.ld4 + col : -1;
      if (at[j] >= 0) v[j] = load_row4(row_of(row), 4 * col, K, vec);
      col += step_col, row += step_row;
      if (col >= K4) col -= K4, ++row;
    }
#pragma unroll
    for (int j = 0; j < kStageBatch; ++j)
      if (at[j] >= 0) s4[at[j]] = operand4<RoundBf16>(v[j]);
  }
}

__device__ __forceinline__ void fma4(float a, float4 b, float4& acc) {
  acc.x = fmaf(a, b.x, acc.x), acc.y = fmaf(a, b.y, acc.y), acc.z = fmaf(a, b.z, acc.z), acc.w = fmaf(a, b.w, acc.w);
}

// v into row[k..k+3] of a row of n floats: one 16-byte store where `vec` (row aligned) and whole.
__device__ __forceinline__ void store_row4(float* row, int k, int n, float4 v, bool vec) {
  if (vec && k + 3 < n) {
    *reinterpret_cast<float4*>(row + k) = v;
    return;
  }
  if (k + 0 < n) row[k + 0] = v.x;
  if (k + 1 < n) row[k + 1] = v.y;
  if (k + 2 < n) row[k + 2] = v.z;
  if (k + 3 < n) row[k + 3] = v.w;
}

// Phase 1 for row b, by one warp (see the top of the file). xr: the row in shared memory (4·ld4 floats);
// dl: its dlogits slot (C floats). vec_dx: dx rows are 16-byte aligned.
template <int MaxC, bool RoundBf16>
__device__ void head_row(const ClassifierHeadArgs& h, int b, int lane, const float* sW, const HeadSmem& layout,
                         const float* xr, float* dl, bool vec_dx, RowTotals& totals) {
  const int K = h.K, C = h.C, K4 = layout.k4, ld4 = layout.ld4;
  const int32_t label = h.labels[b];
  const bool in_row = lane < C;
  const float bias = in_row && h.bias ? __ldg(h.bias + lane) : 0.f;  // in flight during the dot products
  const float4* x4 = reinterpret_cast<const float4*>(xr);            // x4: (K4) the row as float4
  const float4* w4 = reinterpret_cast<const float4*>(sW);            // w4: (C, ld4)

  // Logits: lane = class·P + part (P = lanes_per_class(C)) sums its class's products over the float4 columns
  // part, part + P, ... in k order, then the P lanes of a class add their sums in an xor butterfly (the same bits
  // in each); lane c then takes logit c from lane c·P.
  const int lanes = lanes_per_class(C), lanes_log2 = __ffs(lanes) - 1, my_class = lane >> lanes_log2;
  float sum = 0.f;
  if (my_class < C) {
    const float4* wr = w4 + my_class * ld4;
#pragma unroll 4
    for (int q = lane & (lanes - 1); q < K4; q += lanes) {
      const float4 xv = x4[q], wv = wr[q];
      sum = fmaf(xv.x, wv.x, sum), sum = fmaf(xv.y, wv.y, sum), sum = fmaf(xv.z, wv.z, sum);
      sum = fmaf(xv.w, wv.w, sum);
    }
  }
  for (int o = lanes / 2; o >= 1; o /= 2) sum += __shfl_xor_sync(kFullMask, sum, o);
  float z = __shfl_sync(kFullMask, sum, lane * lanes % kWarpSize);
  z = in_row ? z + bias : -INFINITY;  // lanes past C never win the argmax (-inf, index INT_MAX)
  if (in_row) h.logits[int64_t(b) * C + lane] = z;

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

  const float d = in_row ? (e / s - (lane == label ? 1.f : 0.f)) / static_cast<float>(h.B) : 0.f;
  const float d_operand = RoundBf16 ? round_to_bf16(d) : d;  // what the products and db see
  if (in_row) h.dlogits[int64_t(b) * C + lane] = d, dl[lane] = d_operand;
  if (!h.dx) return;
  float dls[MaxC];  // the row's dlogits, in every lane
#pragma unroll
  for (int c = 0; c < MaxC; ++c) dls[c] = __shfl_sync(kFullMask, d_operand, c);
  float* dx = h.dx + int64_t(b) * K;  // dx: (K) this row's input gradient
  for (int q = lane; q < K4; q += kWarpSize) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int c = 0; c < MaxC; ++c)
      if (c < C) fma4(dls[c], w4[c * ld4 + q], acc);
    if (h.mask_dx) {
      const float4 xv = x4[q];
      acc.x = xv.x > 0.f ? acc.x : 0.f, acc.y = xv.y > 0.f ? acc.y : 0.f;
      acc.z = xv.z > 0.f ? acc.z : 0.f, acc.w = xv.w > 0.f ? acc.w : 0.f;
    }
    store_row4(dx, 4 * q, K, acc, vec_dx);
  }
}

// Phase 2, this block's partial weight gradient over its `rows` rows, a thread per (c, q):
//   part[c][q] = Σ_b dl[b][c]·x[b][q],   part_db[c] = Σ_b dl[b][c]   (b ascending).
__device__ void partial_weight_grads(int C, const HeadSmem& layout, int rows, const float* sx, const float* sdl,
                                     float* part, float* part_db) {
  const int K4 = layout.k4, ld4 = layout.ld4;
  const float4* x4 = reinterpret_cast<const float4*>(sx);  // x4: (rows, ld4)
  for (int e = threadIdx.x; e < C * K4; e += blockDim.x) {
    const int c = e / K4, q = e % K4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int b = 0; b < rows; ++b) fma4(sdl[b * C + c], x4[b * ld4 + q], acc);
    reinterpret_cast<float4*>(part)[c * ld4 + q] = acc;  // part: (C, ld4)
  }
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.f;
    for (int b = 0; b < rows; ++b) acc += sdl[b * C + c];
    part_db[c] = acc;
  }
}

struct BlockTotals {
  double loss;
  long long hits;
};

// RoundBf16: Exec::math BF16 (a template parameter, so that the fp32 kernel's code is what it was).
template <int MaxC, bool RoundBf16>
__global__ void NT_CLUSTER_DIMS(kClusterBlocks, 1, 1) __launch_bounds__(max_head_threads(MaxC))
    classifier_head_kernel(ClassifierHeadArgs h, StampRing stamps) {
  begin_dependent_kernel(stamps);
#if NT_CLUSTERS
  extern __shared__ __align__(16) float smem[];
  __shared__ double warp_loss[kMaxWarps];
  __shared__ long long warp_hits[kMaxWarps];
  __shared__ BlockTotals block_totals;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int rows_per_block = block_rows(h.B);
  const int r0 = min(rank * rows_per_block, h.B), r1 = min(r0 + rows_per_block, h.B);
  const int K = h.K, C = h.C;

  const bool training = h.dweight != nullptr;
  const HeadSmem layout(h.B, K, C, training);
  const int ldw = 4 * layout.ld4;
  float* sW = smem;                    // (C, ldw); in training later the partial dW (C, ldw)
  float* sx = smem + layout.w_floats;  // (r1 - r0, ldw)
  float* sdl = sx + layout.x_floats;   // (r1 - r0, C), then the partial db (C); training only
  stage_inputs<RoundBf16>(h, r0, r1 - r0, layout, sW);
  __syncthreads();

  const bool vec_dx = K % 4 == 0 && reinterpret_cast<uintptr_t>(h.dx) % 16 == 0;
  RowTotals totals;
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  for (int b = r0 + warp; b < r1; b += warps)
    head_row<MaxC, RoundBf16>(h, b, lane, sW, layout, sx + (b - r0) * ldw, sdl + (b - r0) * C, vec_dx, totals);
  if (lane == 0) warp_loss[warp] = totals.loss, warp_hits[warp] = totals.hits;
  __syncthreads();  // sW is free; sdl and the warp totals are complete

  float *part = smem, *part_db = sdl + rows_per_block * C;  // the same offsets in every block of the cluster
  if (training) partial_weight_grads(C, layout, r1 - r0, sx, sdl, part, part_db);
  if (warp == 0) {  // the warps' totals in a fixed xor tree: 5 levels for up to 32 warps, not a chain of 32 adds
    double loss = lane < warps ? warp_loss[lane] : 0.0;
    long long hits = lane < warps ? warp_hits[lane] : 0;
    for (int o = kWarpSize / 2; o >= 1; o /= 2)
      loss += __shfl_xor_sync(kFullMask, loss, o), hits += __shfl_xor_sync(kFullMask, hits, o);
    if (lane == 0) block_totals = BlockTotals{loss, hits};
  }
  cluster.sync();  // every block's partials are in place

  if (training) {
    const float4* parts[kClusterBlocks];  // parts[q]: (C, ld4) block q's partial dW
#pragma unroll
    for (int q = 0; q < kClusterBlocks; ++q)
      parts[q] = reinterpret_cast<const float4*>(cluster.map_shared_rank(part, q));
    const int K4 = layout.k4, n4 = C * K4, share = (n4 + kClusterBlocks - 1) / kClusterBlocks;
    const bool vec_dw = K % 4 == 0 && reinterpret_cast<uintptr_t>(h.dweight) % 16 == 0;
    for (int e = rank * share + threadIdx.x; e < min(n4, (rank + 1) * share); e += blockDim.x) {
      const int c = e / K4, q4 = e % K4, at = c * layout.ld4 + q4;
      float4 v = parts[0][at];
#pragma unroll
      for (int q = 1; q < kClusterBlocks; ++q) {
        const float4 w = parts[q][at];
        v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
      }
      store_row4(h.dweight + int64_t(c) * K, 4 * q4, K, v, vec_dw);
    }
    if (h.dbias && rank == 0)
      for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = cluster.map_shared_rank(part_db, 0)[c];
#pragma unroll
        for (int q = 1; q < kClusterBlocks; ++q) v += cluster.map_shared_rank(part_db, q)[c];
        h.dbias[c] = v;
      }
  }
  if (rank == 0 && warp == 0) {  // lane q reads block q's totals (all eight reads in flight at once)
    BlockTotals t{0, 0};
    if (lane < kClusterBlocks) t = *cluster.map_shared_rank(&block_totals, lane);
    double loss = 0;
    long long hits = 0;
    for (int q = 0; q < kClusterBlocks; ++q)  // rank order
      loss += __shfl_sync(kFullMask, t.loss, q), hits += __shfl_sync(kFullMask, t.hits, q);
    // One add per counter per launch, by one thread, in stream order: the same bits as a load-add-store, but
    // a fire-and-forget reduction (RED) that the exit barrier does not wait for.
    if (lane == 0)
      atomicAdd(h.loss_sum, loss),
          atomicAdd(reinterpret_cast<unsigned long long*>(h.correct), static_cast<unsigned long long>(hits));
  }
  cluster_exit_barrier();
#else
  __trap();  // clusters need sm_90; the launcher takes the unfused path where this image would run
#endif
}

}  // namespace

void classifier_head(const Exec& exec, const ClassifierHeadArgs& h) {
  check_classifier_head(h);
  NT_CHECK(classifier_head_fits(h.C, h.K), "classifier head: ", h.C, " classes of ", h.K,
           " inputs; the CUDA kernel serves 1..", kHeadMaxClasses, " classes and (C*K + C)*4 <= ", kHeadMaxSharedBytes,
           " bytes");
  const bool bf16 = gemm_rounds_operands(exec.math);
  const int max_classes = h.C <= 16 ? 16 : kHeadMaxClasses;  // the kernel's MaxC
  auto kernel =
      max_classes == 16
          ? (bf16 ? classifier_head_kernel<16, true> : classifier_head_kernel<16, false>)
          : (bf16 ? classifier_head_kernel<kHeadMaxClasses, true> : classifier_head_kernel<kHeadMaxClasses, false>);
  static const bool runs = cluster_kernels_run(classifier_head_kernel<16, false>);
  const bool backward = h.dweight != nullptr;
  const size_t smem = HeadSmem(h.B, h.K, h.C, backward).bytes();
  // Where the kernel cannot run (no clusters) or a large batch's rows overflow shared memory: the unfused ops.
  if (!runs || smem > max_shared_bytes_per_block()) return classifier_head_unfused(exec, h);

  if (smem > 48 * 1024)  // above the default limit a kernel must opt in
    NT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const double B = h.B, K = h.K, C = h.C;
  // x, W, bias and labels read once; logits written; with the backward dlogits, dW, db and dx written.
  // Flops: one B·K·C product forward, two backward.
  double bytes = 4.0 * (B * K + C * K + C + B + B * C);
  if (backward) bytes += 4.0 * (B * C + C * K + C + (h.dx ? B * K : 0));
  const double flops = 2.0 * B * K * C * (backward ? (h.dx ? 3 : 2) : 1) + 7.0 * B * C;
  launch(exec, "classifier_head", profile::OpCost{bytes, flops}, kernel, dim3(kClusterBlocks),
         dim3(head_threads(h.B, max_classes)), smem, h);
}

}  // namespace nt::kernels::cuda
