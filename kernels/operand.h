// What the products of a convolution or a GEMM see under Exec::math: the operand itself (fp32), or the operand
// rounded to the tensor cores' input format, TF32 (kernels/tf32.h) or BF16 (kernels/bf16.h).
//
// Which ops round which operands (the contract the CPU twin keeps, docs/bf16.md):
//   tf32  the convolutions' three passes, both operands of every product (PyTorch's cudnn.allow_tf32);
//   bf16  the same, and the GEMMs of the Linear layers and of the classifier head (PyTorch's autocast to bfloat16).
// Sums are fp32 in every mode; a bias and the BatchNorm's sums see unrounded values. A bias gradient (Σ dy) differs:
// under TF32 it sums dy itself, since TF32 is only how the tensor cores read a product's fp32 operands (PyTorch keeps
// dy in fp32); under BF16 it sums the rounded dy, since autocast's dy is a bf16 tensor that its bias gradient sums as
// well. The CPU twin rounds the same values (kernels/cpu/rounded_operands.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "kernels/bf16.h"
#include "kernels/exec.h"
#include "kernels/tf32.h"

namespace nt::kernels {

NT_HOST_DEVICE inline float round_operand(float v, Math math) {
  return math == Math::tf32 ? round_to_tf32(v) : math == Math::bf16 ? round_to_bf16(v) : v;
}

// Whether the GEMMs (Linear, the classifier head) round their operands: only under BF16. TF32 is the convolutions'.
inline bool gemm_rounds_operands(Math math) { return math == Math::bf16; }

// A copy of `values`, each rounded (the operands a CPU reference multiplies).
inline std::vector<float> rounded_operands(std::vector<float> values, Math math) {
  for (float& v : values) v = round_operand(v, math);
  return values;
}

// Staged activations (kernels/conv.h, 'Staged operands'): an activation channels-last, each value as the tensor cores
// read it under `math`: BF16 bits (2 bytes) under Math::bf16, an fp32 pattern rounded to TF32 (4 bytes) under
// Math::tf32. fp32 math multiplies NCHW on the FMA units and stages nothing.
inline bool stages_activations(Math math) { return math == Math::bf16 || math == Math::tf32; }
inline size_t staged_element_bytes(Math math) { return math == Math::bf16 ? sizeof(uint16_t) : sizeof(float); }

// f(NCHW index, channels-last index) of every element of an activation (n, c, hw).
template <class F>
void for_each_channels_last(int64_t n, int64_t c, int64_t hw, F&& f) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t e = 0; e < hw; ++e) f((i * c + k) * hw + e, (i * hw + e) * c + k);
}

// The CPU twins of the kernels that write or read a staged activation (n, c, hw):
//   staged[(i·hw + e)·c + k] = round_operand(nchw[(i·c + k)·hw + e], math), stored in the math's element;
// and back, each value the rounded one the element holds.
template <class T>
void stage_channels_last(const T* nchw, int64_t n, int64_t c, int64_t hw, Math math, void* staged) {
  NT_CHECK(stages_activations(math), "stage_channels_last: fp32 math stages no activation");
  for_each_channels_last(n, c, hw, [&](int64_t from, int64_t to) {
    const float v = static_cast<float>(nchw[from]);
    if (math == Math::bf16)
      static_cast<uint16_t*>(staged)[to] = bf16_bits(v);
    else
      static_cast<float*>(staged)[to] = round_to_tf32(v);
  });
}
template <class T>
void unstage_channels_last(const void* staged, int64_t n, int64_t c, int64_t hw, Math math, T* nchw) {
  NT_CHECK(stages_activations(math), "unstage_channels_last: fp32 math stages no activation");
  for_each_channels_last(n, c, hw, [&](int64_t to, int64_t from) {
    nchw[to] = math == Math::bf16 ? from_bf16_bits(static_cast<const uint16_t*>(staged)[from])
                                  : static_cast<const float*>(staged)[from];
  });
}

}  // namespace nt::kernels
