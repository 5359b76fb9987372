// Fused softmax cross-entropy, CPU twin of kernels/cuda/softmax_xent.cu.
//
// logits (B,C) row-major, labels (B) int32. Per row b, in fp32 (an f64 overload serves gradient checks):
//   (m, k)  = (max_c x_c, argmax_c x_c)    one pass; NaN ranks above every number and ties take the lowest
//                                          index (torch.argmax), so a NaN row has m = NaN
//   s       = Σ_c expf(x_c - m)            the stable log-sum-exp: every term is in (0, 1], s in [1, C]
//   loss_b  = logf(s) + (m - x_label)      = logsumexp(x) - x_label, without forming the large logsumexp
//   dlogits[b,c] = (expf(x_c - m) / s - [c == label]) / B          written (=), skipped when dlogits == nullptr
// and then   *loss_sum += Σ_b loss_b (in double, rows in order);   *correct += #{b : k == label_b}.
//
// The row arithmetic is the CUDA kernel's, operation for operation: s is summed in the order the kernel's
// warp sums it (32 lane-strided partials, then the butterfly tree), so the two backends differ only by
// their expf/logf (a few ulp). A NaN logit makes the row loss NaN (m or s is NaN) and so the batch loss:
// it is never hidden. A label outside [0,C) gives a NaN row loss, and no out-of-bounds read. dlogits
// must not alias logits, as on the GPU.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/op_scope.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/softmax_xent.h"

namespace nt::kernels::cpu {

namespace {

constexpr int kWarpWidth = 32;                // the CUDA kernel's summation shape, mirrored here
constexpr int64_t kRowsPerTask = 256;         // parallel grain for large (evaluation) batches
constexpr int64_t kSerialElements = 1 << 15;  // below this many logits one thread is faster

// Argmax order: NaN above every number, then larger value, then lower index. A total order, so any
// reduction order finds the same winner (the CUDA warp reduces in a tree, this loop in sequence).
template <class T>
bool ranks_above(T v, int i, T best_v, int best_i) {
  bool v_nan = std::isnan(v), best_nan = std::isnan(best_v);
  if (v_nan != best_nan) return v_nan;
  if (!v_nan && v != best_v) return v > best_v;
  return i < best_i;
}

// Σ_c expf(x_c - m), summed as the CUDA warp does: lane l accumulates c = l, l+32, ... in order, then
// the xor-butterfly halves the 32 partials (lane i adds lane i+k's partial for k = 16, 8, 4, 2, 1).
template <class T>
T warp_ordered_exp_sum(const T* x, int C, T m) {
  T part[kWarpWidth] = {};
  for (int c = 0; c < C; ++c) part[c % kWarpWidth] += std::exp(x[c] - m);
  for (int k = kWarpWidth / 2; k >= 1; k /= 2)
    for (int i = 0; i < k; ++i) part[i] = part[i] + part[i + k];
  return part[0];
}

template <class T>
struct RowResult {
  T loss;
  bool correct;
};

// One row: loss, argmax hit, and (when dlogits_row != nullptr) its gradient row.
template <class T>
RowResult<T> softmax_xent_row(const T* x, int32_t label, int B, int C, T* dlogits_row) {
  T m = -std::numeric_limits<T>::infinity();
  int k = std::numeric_limits<int>::max();
  for (int c = 0; c < C; ++c)
    if (ranks_above(x[c], c, m, k)) m = x[c], k = c;

  T s = warp_ordered_exp_sum(x, C, m);
  bool label_ok = label >= 0 && label < C;
  T x_label = label_ok ? x[label] : std::numeric_limits<T>::quiet_NaN();
  T loss = std::log(s) + (m - x_label);

  if (dlogits_row) {
    T Bf = static_cast<T>(B);
    for (int c = 0; c < C; ++c) {
      T p = std::exp(x[c] - m) / s;
      dlogits_row[c] = (p - (c == label ? T(1) : T(0))) / Bf;
    }
  }
  return {loss, label_ok && k == label};
}

}  // namespace

template <class T>
void softmax_xent(const Exec& exec, const SoftmaxXentArgs<T>& a) {
  const int B = a.B, C = a.C;
  const T* logits = a.logits;  // (B, C)
  T* dlogits = a.dlogits;      // (B, C) or nullptr
  if (B <= 0) return;
  double elems = double(B) * C;
  // Logits read once, labels once, dlogits written once, the two counters read and written.
  // Flops per logit: compare, subtract, exp, add (+ divide, subtract, divide for the gradient).
  const double bytes = elems * sizeof(T) * (dlogits ? 2 : 1) + B * 4.0 + 32;
  profile::OpCost cost{bytes, elems * (dlogits ? 7 : 4)};
  OpScope scope(exec, "softmax_xent", cost);

  auto grad_row = [&](int64_t b) { return dlogits ? dlogits + b * C : nullptr; };
  double total = 0;
  int64_t hits = 0;
  if (elems < kSerialElements) {
    for (int b = 0; b < B; ++b) {
      RowResult<T> r = softmax_xent_row(logits + int64_t(b) * C, a.labels[b], B, C, grad_row(b));
      total += r.loss;
      hits += r.correct;
    }
  } else {
    // Rows in parallel, their losses kept so that the sum still runs in row order (deterministic and
    // independent of the thread count). The buffers belong to the calling thread and grow once, not
    // per call; the workers write into the caller's buffers through these references.
    thread_local std::vector<T> row_loss_buffer;
    thread_local std::vector<uint8_t> row_hit_buffer;
    std::vector<T>& row_loss = row_loss_buffer;
    std::vector<uint8_t>& row_hit = row_hit_buffer;
    row_loss.resize(static_cast<size_t>(B));
    row_hit.resize(static_cast<size_t>(B));
    int64_t tasks = (B + kRowsPerTask - 1) / kRowsPerTask;
    parallel_for(exec.pool, tasks, [&](int64_t t) {
      int64_t end = std::min<int64_t>(B, (t + 1) * kRowsPerTask);
      for (int64_t b = t * kRowsPerTask; b < end; ++b) {
        RowResult<T> r = softmax_xent_row(logits + b * C, a.labels[b], B, C, grad_row(b));
        row_loss[b] = r.loss;
        row_hit[b] = r.correct;
      }
    });
    for (int b = 0; b < B; ++b) {
      total += row_loss[b];
      hits += row_hit[b];
    }
  }
  *a.loss_sum += total;
  *a.correct += hits;
}
template void softmax_xent(const Exec&, const SoftmaxXentArgs<float>&);
template void softmax_xent(const Exec&, const SoftmaxXentArgs<double>&);

}  // namespace nt::kernels::cpu
