// Which code of this binary the current device runs. Asking the runtime for a kernel's attributes fails with
// cudaErrorNoKernelImageForDevice when the binary has none for it; otherwise ptxVersion names the virtual
// architecture the image came from (90 for sm_90 machine code or compute_90 PTX), which is what decides the
// code path: the preprocessor's __CUDA_ARCH__ in every kernel is that number. All kernels are compiled for one
// list of architectures, so one probe speaks for all of them.
//
// ptxVersion says 90 for sm_90a code as well, whose kernels may use wgmma (kernels/cuda/wgmma.cuh). The second probe
// tells the two apart by an attribute its images differ in: its launch bound is 32 threads in sm_90a code, 64 in
// every other. Asking for attributes is no stream operation, so either question may come during a graph capture.
#include <cuda_runtime.h>

#include "kernels/cuda/wgmma.cuh"

namespace nt::kernels::cuda {

namespace {
__global__ void probe_kernel() {}
__global__ void __launch_bounds__(NT_WGMMA ? 32 : 64) warpgroup_mma_probe_kernel() {}
}  // namespace

int running_code_arch() {
  cudaFuncAttributes attr{};
  cudaError_t err = cudaFuncGetAttributes(&attr, probe_kernel);
  cudaGetLastError();  // a failed query is an answer (none), not a sticky error
  return err == cudaSuccess ? attr.ptxVersion : 0;
}

bool running_warpgroup_mma_code() {
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, warpgroup_mma_probe_kernel);
  cudaGetLastError();
  return err == cudaSuccess && attr.maxThreadsPerBlock == 32;
}

}  // namespace nt::kernels::cuda
