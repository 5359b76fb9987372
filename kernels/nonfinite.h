// Counting the non-finite values of a tensor: the divergence check that runs after an epoch whose loss total
// was not finite, to name the first layer whose parameters or gradients went bad (engine/divergence.h). It never
// runs inside a training step.
//
//   *count += #{ i < n : x[i] is NaN, +inf or -inf }      x (n) fp32; count one int64 on exec's device, accumulated
//
// Integer counts: the GPU's blocks may add in any order and still give the CPU twin's number exactly.
#pragma once

#include <cstdint>

#include "kernels/dispatch.h"

namespace nt::kernels {

struct NonfiniteCountArgs {
  const float* x = nullptr;  // (n)
  int64_t n = 0;
  int64_t* count = nullptr;  // (1), accumulated (+=)
};

namespace cpu {
void count_nonfinite(const Exec& exec, const NonfiniteCountArgs& a);
}
namespace cuda {
void count_nonfinite(const Exec& exec, const NonfiniteCountArgs& a);
}
inline void count_nonfinite(const Exec& exec, const NonfiniteCountArgs& a) {
  dispatch<cpu::count_nonfinite, cuda::count_nonfinite>(exec, a);
}

}  // namespace nt::kernels
