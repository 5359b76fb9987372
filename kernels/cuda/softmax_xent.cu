// Fused softmax cross-entropy on the GPU: loss, accuracy count and logits gradient in one launch.
//
// logits (B,C) row-major, labels (B) int32. Per row b, in fp32:
//   (m, k)  = (max_c x_c, argmax_c x_c)    one reduction; NaN ranks above every number and ties take the
//                                          lowest index (torch.argmax), so a NaN row has m = NaN
//   s       = Σ_c expf(x_c - m)            the stable log-sum-exp: every term is in (0, 1], s in [1, C]
//   loss_b  = logf(s) + (m - x_label)      = logsumexp(x) - x_label, without forming the large logsumexp
//   dlogits[b,c] = (expf(x_c - m) / s - [c == label]) / B          written (=), skipped when dlogits == nullptr
// then, by thread 0 at the end:  *loss_sum += Σ_b loss_b (in double);  *correct += #{b : k == label_b}.
// loss_sum and correct live in device memory, so an epoch of steps needs no host readback. dlogits must
// not alias logits (the gradient is computed from the logits after they are read, under __restrict__).
//
// Shape of the launch: ONE block of 1024 threads; warp w handles rows w, w+32, w+64, ...; within a row the
// lanes stride over the classes and combine with xor-butterfly shuffles (every lane ends with the same
// bits, since a+b == b+a). Each warp sums its row losses in double in a fixed slot of shared memory, and
// thread 0 adds the 32 slots in order: the result is bit-reproducible run to run, with no atomics.
// One block is the deliberate choice: a training batch (64 x 10) is far too small to fill a GPU anyway,
// and the deterministic reduction needs no second pass. Its limit: a large evaluation batch is
// serialized on one SM: 10000 x 10 is 625 rows per warp, each a chain of dependent loads and shuffles
// (~1-2k cycles), so some hundreds of microseconds, once per evaluation — acceptable; a multi-block
// version with a second fixed-order pass over per-block partials would be the fix if it ever mattered.
// The row arithmetic is the CPU twin's (kernels/cpu/softmax_xent.cpp), operation for operation, the exp
// sum in the same order; they differ only by expf/logf (a few ulp). A NaN logit makes the row loss NaN
// and so the batch loss: it is never hidden. A label outside [0,C) gives a NaN row loss, and no
// out-of-bounds read.
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/warp_reduce.cuh"
#include "kernels/softmax_xent.h"

namespace nt::kernels::cuda {

namespace {

constexpr int kThreads = 1024;  // 32 warps: at batch 64 each walks 2 rows, not 4 (the row chain is latency-bound)
constexpr int kWarps = kThreads / kWarpSize;

// logits: (B,C) row-major; one warp per row, rows strided over the block's 32 warps; lanes stride over C.
__global__ void __launch_bounds__(kThreads)
    softmax_xent_kernel(const float* __restrict__ logits, const int32_t* __restrict__ labels, int B, int C,
                        float* __restrict__ dlogits, double* loss_sum, int64_t* correct, StampRing stamps) {
  begin_dependent_kernel(stamps);
  __shared__ double warp_loss[kWarps];
  __shared__ long long warp_hits[kWarps];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const float Bf = static_cast<float>(B);

  double loss_acc = 0;  // this warp's rows, in row order (meaningful in lane 0)
  long long hits = 0;
  for (int b = warp; b < B; b += kWarps) {
    const float* x = logits + static_cast<int64_t>(b) * C;  // x: (C) this row
    const int32_t label = labels[b];                        // issued early: its latency hides under the max

    float m = -INFINITY;
    int k = INT_MAX;
    for (int c = lane; c < C; c += kWarpSize)
      if (ranks_above(x[c], c, m, k)) m = x[c], k = c;
    warp_argmax(m, k);

    float part = 0.f;
    for (int c = lane; c < C; c += kWarpSize) part += expf(x[c] - m);
    const float s = warp_sum(part);

    const bool label_ok = label >= 0 && label < C;
    const float x_label = label_ok ? x[label] : __int_as_float(0x7fffffff);  // quiet NaN
    if (lane == 0) {
      loss_acc += static_cast<double>(logf(s) + (m - x_label));
      hits += (label_ok && k == label) ? 1 : 0;
    }

    if (dlogits) {
      float* dx = dlogits + static_cast<int64_t>(b) * C;  // dx: (C) this row's gradient
      for (int c = lane; c < C; c += kWarpSize) {
        float p = expf(x[c] - m) / s;
        dx[c] = (p - (c == label ? 1.f : 0.f)) / Bf;
      }
    }
  }

  if (lane == 0) {
    warp_loss[warp] = loss_acc;
    warp_hits[warp] = hits;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    long long total_hits = 0;
    for (int w = 0; w < kWarps; ++w) {  // fixed order: bit-reproducible
      total += warp_loss[w];
      total_hits += warp_hits[w];
    }
    *loss_sum += total;
    *correct += total_hits;
  }
}

}  // namespace

void softmax_xent(const Exec& exec, const SoftmaxXentArgs<float>& a) {
  const int B = a.B, C = a.C;
  if (B <= 0) return;
  double elems = double(B) * C;
  // Logits read once, labels once, dlogits written once, the two counters read and written.
  // Flops per logit: compare, subtract, exp, add (+ divide, subtract, divide for the gradient).
  profile::OpCost cost{elems * 4 + B * 4.0 + (a.dlogits ? elems * 4 : 0) + 32, elems * (a.dlogits ? 7 : 4)};
  launch(exec, "softmax_xent", cost, softmax_xent_kernel, dim3(1), dim3(kThreads), 0, a.logits, a.labels, B, C,
         a.dlogits, a.loss_sum, a.correct);
}

}  // namespace nt::kernels::cuda
