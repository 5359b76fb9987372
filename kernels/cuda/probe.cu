// Does this binary carry code the current device can run? Asking the runtime for a kernel's
// attributes fails with cudaErrorNoKernelImageForDevice when it does not.
#include <cuda_runtime.h>

namespace nt::kernels::cuda {

namespace {
__global__ void probe_kernel() {}
}  // namespace

bool kernel_image_available() {
  cudaFuncAttributes attr{};
  cudaError_t err = cudaFuncGetAttributes(&attr, probe_kernel);
  cudaGetLastError();
  return err == cudaSuccess;
}

}  // namespace nt::kernels::cuda
