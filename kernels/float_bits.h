// An fp32 value's bit pattern and back, on the host and the device alike: the formats' rounding twins
// (kernels/tf32.h, kernels/bf16.h) work on the bits.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define NT_FLOAT_BITS_FN __host__ __device__ inline
#else
#define NT_FLOAT_BITS_FN inline
#endif

namespace nt::kernels {

NT_FLOAT_BITS_FN uint32_t bits_of(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}

NT_FLOAT_BITS_FN float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}

}  // namespace nt::kernels

#undef NT_FLOAT_BITS_FN
