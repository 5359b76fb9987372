// The GPU's global timer (%globaltimer): nanoseconds, the same clock on every SM (about 32 ns resolution on
// recent GPUs). Kernels that wait for a wall-clock time use it: the profiler's hold (profile_delay.cu) bounds
// its spin with it, and bench_launch's spin kernels run for a known length by it.
#pragma once

#include <cstdint>

namespace nt::kernels::cuda {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace nt::kernels::cuda
