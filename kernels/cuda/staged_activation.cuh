// A staged activation on the device (kernels/operand.h, 'Staged activations'; kernels/conv.h, 'Staged operands'):
// channels-last, each value as the next convolution's tensor cores read it: __nv_bfloat16 under Math::bf16, or float
// rounded to TF32 under Math::tf32. The writers (the fused stem's forward, the pooled BatchNorm's backward) and the
// stem's backward take the element as a template parameter: a run-time branch on the format inside their loops cost
// the stem's backward reduce 1.4–1.7 µs in every math mode (the cnn at batch 64 on an H200, docs/bf16.md).
#pragma once

#include <cstdint>
#include <cstring>

#include <cuda_bf16.h>

#include "kernels/cuda/mma_tf32.cuh"
#include "kernels/exec.h"
#include "kernels/operand.h"

namespace nt::kernels::cuda {

// V consecutive channels of one pixel, rounded, from `to` on (V = 4 or 8 need `to` 8- or 16-byte aligned: the writers'
// channels are a multiple of 8 and the data 16-byte aligned). BF16: one 8- or 16-byte store.
template <int V>
__device__ __forceinline__ void store_staged(__nv_bfloat16* to, const float (&v)[V]) {
  if constexpr (V == 4 || V == 8) {
    __nv_bfloat162 pairs[V / 2];
#pragma unroll
    for (int j = 0; j < V / 2; ++j) pairs[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
    if constexpr (V == 4) {
      uint2 packed;
      memcpy(&packed, pairs, sizeof(packed));
      *reinterpret_cast<uint2*>(to) = packed;
    } else {
      uint4 packed;
      memcpy(&packed, pairs, sizeof(packed));
      *reinterpret_cast<uint4*>(to) = packed;
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) to[j] = __float2bfloat16_rn(v[j]);
  }
}

// TF32: a 16-byte store per 4 channels, each rounded as the channels-last stage rounds (cvt.rna), so that a staged
// activation holds the stage's bits.
template <int V>
__device__ __forceinline__ void store_staged(float* to, const float (&v)[V]) {
  const auto tf32 = [](float x) { return __uint_as_float(mma_tf32::to_tf32(x)); };
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 4)
      *reinterpret_cast<float4*>(to + j) = make_float4(tf32(v[j]), tf32(v[j + 1]), tf32(v[j + 2]), tf32(v[j + 3]));
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) to[j] = tf32(v[j]);
  }
}

// Staged filters (kernels/conv.h, Conv2dFilterStage): element e of rows × (r, s, cin), row m's tap (r, s) of input
// channel ci, comes from w[m][ci][r][s] of w (rows, cin, R, S); flipped (a backward_data's filters, w (cin, rows, R,
// S)), from w[ci][m][R−1−r][S−1−s]. The channels-last stage (conv_channels_last.cu) and the fused stem, which stages
// the next convolution's filters beside its staged output, both index them so.
__device__ __forceinline__ size_t staged_filter_source(int e, int rows, int cin, int r, int s, bool flipped) {
  const int row_len = r * s * cin;
  const int m = e / row_len, rest = e % row_len, tap = rest / cin, ci = rest % cin;
  const int tr = tap / s, ts = tap % s;
  return flipped ? ((size_t(ci) * rows + m) * r + (r - 1 - tr)) * s + (s - 1 - ts)
                 : ((size_t(m) * cin + ci) * r + tr) * s + ts;
}

__device__ __forceinline__ float staged_value(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float staged_value(float v) { return v; }

// Host: f(element pointer) with `data` as the math's element. fp32 math stages nothing: f gets BF16's type, and data
// must be nullptr (the kernels then take their fp32 NCHW path).
template <class F>
void with_staged_element(Math math, void* data, F&& f) {
  if (math == Math::tf32) return f(static_cast<float*>(data));
  f(static_cast<__nv_bfloat16*>(data));
}

}  // namespace nt::kernels::cuda
