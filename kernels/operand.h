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

#include <vector>

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

}  // namespace nt::kernels
