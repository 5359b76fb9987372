// Warp-wide reductions of the softmax cross-entropy kernels (softmax_xent.cu, classifier_head.cu): the same
// butterfly in both, so a row's loss and argmax come out the same whichever kernel computed them.
#pragma once

#include <cuda_runtime.h>

namespace nt::kernels::cuda {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

// Argmax order: NaN above every number, then larger value, then lower index (torch.argmax). A total order,
// so the butterfly's pairing does not change the winner, and the CPU's sequential scan finds the same one.
__device__ __forceinline__ bool ranks_above(float v, int i, float best_v, int best_i) {
  bool v_nan = isnan(v), best_nan = isnan(best_v);
  if (v_nan != best_nan) return v_nan;
  if (!v_nan && v != best_v) return v > best_v;
  return i < best_i;
}

// Every lane ends with the warp's winner.
__device__ __forceinline__ void warp_argmax(float& best_v, int& best_i) {
  for (int k = kWarpSize / 2; k >= 1; k /= 2) {
    float v = __shfl_xor_sync(kFullMask, best_v, k);
    int i = __shfl_xor_sync(kFullMask, best_i, k);
    if (ranks_above(v, i, best_v, best_i)) best_v = v, best_i = i;
  }
}

// xor butterfly: every lane ends with the same bits, since a+b == b+a.
__device__ __forceinline__ float warp_sum(float v) {
  for (int k = kWarpSize / 2; k >= 1; k /= 2) v = v + __shfl_xor_sync(kFullMask, v, k);
  return v;
}

}  // namespace nt::kernels::cuda
