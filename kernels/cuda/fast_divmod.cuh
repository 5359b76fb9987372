// Division by a divisor fixed per launch, for the index decoding of the convolution and pooling kernels: a
// 32-bit integer division costs ~20 instructions on the GPU (a 64-bit one far more), a multiply-high and a
// shift cost two.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace nt::kernels::cuda {

// x / d and x % d for 0 <= x < 2^31 with a multiply and a shift (d fixed per launch; d <= 0 acts as 1).
// The magic number: m = ceil(2^(31+l) / d), l = ceil(log2 d), quotient = umulhi(x, m) >> (l − 1).
struct FastDivmod {
  int d = 1;
  unsigned mul = 0, shr = 0;

  FastDivmod() = default;
  explicit FastDivmod(int divisor) : d(std::max(divisor, 1)) {
    if (d == 1) return;
    unsigned l = 0;
    while ((1u << l) < static_cast<unsigned>(d)) ++l;
    const unsigned p = 31u + l;
    mul = static_cast<unsigned>(((uint64_t(1) << p) + static_cast<unsigned>(d) - 1) / static_cast<unsigned>(d));
    shr = p - 32u;
  }
  __device__ __forceinline__ int div(int x) const {
    return d == 1 ? x : static_cast<int>(__umulhi(static_cast<unsigned>(x), mul) >> shr);
  }
  __device__ __forceinline__ void divmod(int x, int& q, int& r) const {
    q = div(x);
    r = x - q * d;
  }
};

}  // namespace nt::kernels::cuda
