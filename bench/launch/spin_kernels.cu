// Spin kernels of bench_launch (spin_kernels.h): after the dependency wait every kernel opens with
// (kernels/cuda/launch.cuh), thread 0 reads the global timer (kernels/cuda/global_timer.cuh) until kMicros us have
// passed; the other 31 threads and kMicros == 0 return at once.
#include <cuda.h>

#include <cstdint>

#include "bench/launch/spin_kernels.h"
#include "core/cuda_check.h"
#include "core/error.h"
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

void launch_empty_directly(void* stream, LaunchApi api) {
  static const cudaFunction_t function = [] {
    cudaFunction_t f = nullptr;
    NT_CUDA_CHECK(cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(kKernels[0])));
    return f;
  }();
  kernels::cuda::StampRing ring{};
  void* params[] = {&ring};
  if (api == LaunchApi::runtime) {
    cudaLaunchAttribute programmatic{};
    programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    programmatic.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(1);
    config.blockDim = dim3(32);
    config.stream = static_cast<cudaStream_t>(stream);
    config.attrs = &programmatic;
    config.numAttrs = 1;
    NT_CUDA_CHECK(cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(kKernels[0]), params));
    return;
  }
  CUlaunchAttribute programmatic{};
  programmatic.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  programmatic.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig config{};
  config.gridDimX = config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 32, config.blockDimY = config.blockDimZ = 1;
  config.hStream = static_cast<CUstream>(stream);
  config.attrs = &programmatic;
  config.numAttrs = 1;
  // Through the runtime's entry point, so that the executables need no libcuda at link time.
  static const auto launch_ex = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    NT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &entry, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess) throw InternalError("cuLaunchKernelEx: not found in the driver");
    return reinterpret_cast<decltype(&cuLaunchKernelEx)>(entry);
  }();
  const CUresult r = launch_ex(&config, reinterpret_cast<CUfunction>(function), params, nullptr);
  if (r != CUDA_SUCCESS) throw InternalError(cat("cuLaunchKernelEx: CUresult ", int(r)));
}

}  // namespace nt::bench
