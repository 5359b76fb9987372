// TF32, the tensor cores' fp32 input format: fp32's sign and 8-bit exponent with 10 of its 23 mantissa bits.
//
// round_to_tf32 is the twin of PTX's cvt.rna.tf32.f32, which the CUDA convolutions apply to each operand
// element under Exec::math TF32 (kernels/cuda/mma_tf32.cuh; a GPU test checks that the two agree bit for bit):
// round to nearest, ties away from zero, the result still an fp32 bit pattern whose low 13 bits are zero.
// Adding half of the dropped range (0x1000) to the magnitude bits and truncating does exactly that, a carry
// into the exponent included (the largest values round to infinity); infinities and NaNs pass unchanged.
//
// The CPU reference of a TF32 convolution is the fp32 one on rounded operands: a product of two TF32
// values has at most 22 significant bits, so it is exact in fp32, and the two backends then differ only in
// the order of their fp32 additions (the tolerance of an fp32 sum).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/float_bits.h"

namespace nt::kernels {

// Host and device (the CUDA kernels that multiply on the FMA units under Exec::math TF32 round with it as well).
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline float
    round_to_tf32(float v) {
  const uint32_t u = bits_of(v);
  if ((u & 0x7f800000u) == 0x7f800000u) return v;
  return float_of((u + 0x1000u) & 0xffffe000u);
}

// A copy of `values`, each rounded (the operands a CPU reference multiplies).
inline std::vector<float> rounded_to_tf32(std::vector<float> values) {
  for (float& v : values) v = round_to_tf32(v);
  return values;
}

}  // namespace nt::kernels
