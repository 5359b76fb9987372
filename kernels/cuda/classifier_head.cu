// The classifier head on the GPU: last Linear + softmax cross-entropy, forward and backward, one launch.
//
// Math and layouts: kernels/classifier_head.h. x (B,K), W (C,K), logits and dlogits (B,C), dW (C,K),
// dx (B,K), all row-major; C <= kHeadMaxClasses.
//
// Why one block: at the mlp's batch 64 the head is 64 x 160 x 10, about 100k multiply-adds per product,
// far too little to spread over SMs, while the unfused path pays four launches for it. One block of 1024
// threads (32 warps) also keeps every reduction in a fixed order, with no atomics and no second pass.
//
// Phase 1, a warp per row (rows b = warp, warp + 32, ...):
//   logits   lane l accumulates x[b][k]·W[c][k] over k = l, l+32, ... for every class c (MaxC registers),
//            then a xor butterfly per class gives every lane all C sums (a+b == b+a: the same bits in
//            every lane); lane c keeps logit c and adds bias[c].
//   softmax cross-entropy on lanes 0..C-1 with the row arithmetic of kernels/cuda/softmax_xent.cu (one
//            class per lane, so its exp sum is the same butterfly): loss, argmax hit, dlogits row.
//   dx       lane l computes dx[b][k] = Σ_c dlogits[b][c]·W[c][k] (c ascending) for k = l, l+32, ...,
//            selected by x[b][k] > 0 when the previous layer ended in a ReLU.
// __syncthreads: the block's global writes (dlogits) are then visible to all its threads.
// Phase 2, a thread per weight-gradient element e = c·K + k, consecutive threads along k (coalesced x):
//   dW[c][k] = Σ_b dlogits[b][c]·x[b][k], b ascending; db[c] = Σ_b dlogits[b][c], b ascending.
// The row losses and hits are reduced as in softmax_xent: per-warp double slots, added in warp order by
// thread 0, which then adds them to the device-resident counters.
//
// Limit: like softmax_xent, a large batch is serialized on one SM (rows per warp grow as B/32, phase 2
// as B): fine for training batches (batch 256: 8 rows per warp), and evaluation at the training batch.
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/classifier_head.h"
#include "kernels/cuda/launch.cuh"

namespace nt::kernels::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarpSize = 32;
constexpr int kWarps = kThreads / kWarpSize;
constexpr unsigned kFullMask = 0xffffffffu;

// Argmax order of softmax_xent.cu: NaN above every number, then larger value, then lower index.
__device__ bool ranks_above(float v, int i, float best_v, int best_i) {
  bool v_nan = isnan(v), best_nan = isnan(best_v);
  if (v_nan != best_nan) return v_nan;
  if (!v_nan && v != best_v) return v > best_v;
  return i < best_i;
}

__device__ void warp_argmax(float& best_v, int& best_i) {
  for (int k = kWarpSize / 2; k >= 1; k /= 2) {
    float v = __shfl_xor_sync(kFullMask, best_v, k);
    int i = __shfl_xor_sync(kFullMask, best_i, k);
    if (ranks_above(v, i, best_v, best_i)) best_v = v, best_i = i;
  }
}

__device__ float warp_sum(float v) {
  for (int k = kWarpSize / 2; k >= 1; k /= 2) v = v + __shfl_xor_sync(kFullMask, v, k);
  return v;
}

struct RowTotals {
  double loss = 0;   // this warp's row losses in row order (lane 0)
  long long hits = 0;
};

// Phase 1 for row b, by one warp (see the top of the file). Returns this lane's dlogit (0 past C).
template <int MaxC>
__device__ float head_row(const ClassifierHead& h, int b, int lane, RowTotals& totals) {
  const int K = h.K, C = h.C;
  const float* x = h.x + static_cast<int64_t>(b) * K;  // x: (K) this row
  const int32_t label = h.labels[b];

  float part[MaxC];
#pragma unroll
  for (int c = 0; c < MaxC; ++c) part[c] = 0.f;
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
  if (!h.dlogits) return 0.f;

  const float dl = in_row ? (e / s - (lane == label ? 1.f : 0.f)) / static_cast<float>(h.B) : 0.f;
  if (in_row) h.dlogits[static_cast<int64_t>(b) * C + lane] = dl;
  if (h.dx) {
    float dls[MaxC];  // the row's dlogits, in every lane
#pragma unroll
    for (int c = 0; c < MaxC; ++c) dls[c] = __shfl_sync(kFullMask, dl, c);
    float* dx = h.dx + static_cast<int64_t>(b) * K;  // dx: (K) this row's input gradient
    for (int k = lane; k < K; k += kWarpSize) {
      float acc = 0.f;
#pragma unroll
      for (int c = 0; c < MaxC; ++c)
        if (c < C) acc = fmaf(dls[c], __ldg(h.weight + static_cast<int64_t>(c) * K + k), acc);
      dx[k] = (!h.mask_dx || x[k] > 0.f) ? acc : 0.f;
    }
  }
  return dl;
}

// Phase 2: dW and db from the dlogits the block wrote in phase 1 (plain loads: written by this kernel).
__device__ void head_weight_grads(const ClassifierHead& h) {
  const int B = h.B, K = h.K, C = h.C;
  const float* dlogits = h.dlogits;
  for (int64_t e = threadIdx.x; e < static_cast<int64_t>(C) * K; e += kThreads) {
    const int c = static_cast<int>(e / K), k = static_cast<int>(e % K);
    float acc = 0.f;
    for (int b = 0; b < B; ++b)
      acc = fmaf(dlogits[static_cast<int64_t>(b) * C + c], h.x[static_cast<int64_t>(b) * K + k], acc);
    h.dweight[e] = acc;
  }
  if (h.dbias) {
    for (int c = threadIdx.x; c < C; c += kThreads) {
      float acc = 0.f;
      for (int b = 0; b < B; ++b) acc += dlogits[static_cast<int64_t>(b) * C + c];
      h.dbias[c] = acc;
    }
  }
}

template <int MaxC>
__global__ void __launch_bounds__(kThreads) classifier_head_kernel(ClassifierHead h) {
  begin_dependent_kernel();
  __shared__ double warp_loss[kWarps];
  __shared__ long long warp_hits[kWarps];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;

  RowTotals totals;
  for (int b = warp; b < h.B; b += kWarps) head_row<MaxC>(h, b, lane, totals);
  if (lane == 0) warp_loss[warp] = totals.loss, warp_hits[warp] = totals.hits;
  __syncthreads();

  if (threadIdx.x == 0) {
    double loss = 0;
    long long hits = 0;
    for (int w = 0; w < kWarps; ++w) loss += warp_loss[w], hits += warp_hits[w];  // fixed order
    *h.loss_sum += loss;
    *h.correct += hits;
  }
  if (h.dweight) head_weight_grads(h);
}

}  // namespace

void classifier_head(const Exec& exec, const ClassifierHead& h) {
  check_classifier_head(h);
  NT_CHECK(classifier_head_fits(h.C), "classifier head: ", h.C, " classes; the CUDA kernel serves 1..",
           kHeadMaxClasses);
  const double B = h.B, K = h.K, C = h.C;
  const bool backward = h.dweight != nullptr;
  // x, W, bias and labels read once; logits written; with the backward dlogits, dW, db and dx written
  // (x and W are read again from cache). Flops: one B·K·C product forward, two backward.
  double bytes = 4.0 * (B * K + C * K + C + B + B * C);
  if (backward) bytes += 4.0 * (B * C + C * K + C + (h.dx ? B * K : 0));
  const double flops = 2.0 * B * K * C * (backward ? (h.dx ? 3 : 2) : 1) + 7.0 * B * C;
  const profile::OpCost cost{bytes, flops};
  auto kernel = h.C <= 16 ? classifier_head_kernel<16> : classifier_head_kernel<kHeadMaxClasses>;
  launch(exec, "classifier_head", cost, kernel, dim3(1), dim3(kThreads), 0, h);
}

}  // namespace nt::kernels::cuda
