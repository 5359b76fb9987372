// BF16, the tensor cores' 16-bit input format: fp32's sign and 8-bit exponent with 7 of its 23 mantissa bits.
//
// round_to_bf16 is the twin of __float2bfloat16_rn (cvt.rn.bf16.f32), which the channels-last convolution's BF16
// operands go through as they are staged (kernels/cuda/conv_channels_last.cu): round to nearest, ties to even, the
// result an fp32 bit pattern whose low 16 bits are zero (the bf16 value widened back). Adding 0x7fff plus the lowest
// kept bit to the bits and truncating does exactly that, a carry into the exponent included (the largest values round
// to infinity); infinities pass unchanged, NaNs stay NaNs (quiet).
//
// A BF16 value is also a TF32 value (TF32 keeps 10 mantissa bits), so a kernel that loads fp32 may round each operand
// to BF16 and multiply on the TF32 MMAs: the products are the BF16 products, exactly.
//
// As for TF32 (kernels/tf32.h), the CPU reference of a BF16 convolution is the fp32 one on rounded operands: a
// product of two BF16 values has at most 16 significant bits, exact in fp32, so the backends differ only in the
// order of their fp32 additions.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/float_bits.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

namespace nt::kernels {

// Host and device (the CUDA kernels that round their operands to BF16 as they load them use it as well).
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline float
    round_to_bf16(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __bfloat162float(__float2bfloat16_rn(v));  // cvt.rn.bf16.f32: the same rounding in one instruction
#else
  uint32_t u = bits_of(v);
  if ((u & 0x7f800000u) == 0x7f800000u) {  // infinity, or NaN made quiet (its payload's high bits may all be 0)
    if (u & 0x007fffffu) u |= 0x00400000u;
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
  }
  return float_of(u & 0xffff0000u);
#endif
}

// The 16 bits a BF16 store keeps of round_to_bf16(v), and the value they hold (host code: the CPU twins of the kernels
// that store BF16 activations, kernels/operand.h's stage_channels_last).
inline uint16_t bf16_bits(float v) { return static_cast<uint16_t>(bits_of(round_to_bf16(v)) >> 16); }
inline float from_bf16_bits(uint16_t bits) { return float_of(uint32_t(bits) << 16); }

// A copy of `values`, each rounded (the operands a CPU reference multiplies).
inline std::vector<float> rounded_to_bf16(std::vector<float> values) {
  for (float& v : values) v = round_to_bf16(v);
  return values;
}

}  // namespace nt::kernels
