// Which code of this binary the current device runs. Asking the runtime for a kernel's attributes fails with
// cudaErrorNoKernelImageForDevice when the binary has none for it; otherwise ptxVersion names the virtual
// architecture the image came from (90 for sm_90 machine code or compute_90 PTX), which is what decides the
// code path: the preprocessor's __CUDA_ARCH__ in every kernel is that number. All kernels are compiled for one
// list of architectures, so one probe speaks for all of them.
#include <cuda_runtime.h>

namespace nt::kernels::cuda {

namespace {
__global__ void probe_kernel() {}
}  // namespace

int running_code_arch() {
  cudaFuncAttributes attr{};
  cudaError_t err = cudaFuncGetAttributes(&attr, probe_kernel);
  cudaGetLastError();  // a failed query is an answer (none), not a sticky error
  return err == cudaSuccess ? attr.ptxVersion : 0;
}

}  // namespace nt::kernels::cuda
