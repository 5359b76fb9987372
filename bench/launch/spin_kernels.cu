// Spin kernels of bench_launch (spin_kernels.h): after the dependency wait every kernel opens with
// (kernels/cuda/launch.cuh), thread 0 reads the global timer (kernels/cuda/global_timer.cuh) until kMicros us have
// passed; the other 31 threads and kMicros == 0 return at once.
#include <cstdint>

#include "bench/launch/spin_kernels.h"
#include "kernels/cuda/global_timer.cuh"
#include "kernels/cuda/launch.cuh"

namespace nt::bench {

namespace {

template <int kMicros>
__global__ void spin_kernel(kernels::cuda::StampRing stamps) {
  kernels::cuda::begin_dependent_kernel(stamps);  // as every kernel: a no-op unless launched programmatically
  if constexpr (kMicros > 0) {
    if (threadIdx.x != 0) return;
    const uint64_t t0 = kernels::cuda::global_timer_ns();
    while (kernels::cuda::global_timer_ns() - t0 < uint64_t{kMicros} * 1000) {
    }
  }
}

using Kernel = void (*)(kernels::cuda::StampRing);
constexpr Kernel kKernels[] = {spin_kernel<0>, spin_kernel<2>, spin_kernel<5>, spin_kernel<10>, spin_kernel<20>};
static_assert(sizeof(kKernels) / sizeof(kKernels[0]) == kSpinCount, "one kernel per entry of kSpins");

}  // namespace

void launch_spin(const kernels::Exec& exec, int index) {
  kernels::cuda::launch(exec, kSpins[index].name, profile::OpCost{}, kKernels[index], dim3(1), dim3(32), 0);
}

}  // namespace nt::bench
