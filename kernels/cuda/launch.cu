#include "kernels/cuda/launch.cuh"

namespace nt::kernels::cuda {

void throw_launch_error(const char* kernel, cudaError_t err, dim3 grid, dim3 block, size_t smem, bool after_sync) {
  throw InternalError(cat("CUDA kernel ", kernel, after_sync ? " failed while running: " : " failed to launch: ",
                          cudaGetErrorName(err), " (", cudaGetErrorString(err), "), grid (", grid.x, ",", grid.y,
                          ",", grid.z, "), block (", block.x, ",", block.y, ",", block.z, "), ", smem,
                          " B shared memory"));
}

bool programmatic_launch_supported() {
  // Asked once per thread and device: the launch path runs for every kernel.
  thread_local int device = -1;
  thread_local bool supported = false;
  int current = 0;
  NT_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) {
    int major = 0;
    NT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, current));
    device = current;
    supported = major >= 9;
  }
  return supported;
}

size_t max_shared_bytes_per_block() {
  int dev = 0, bytes = 0;
  NT_CUDA_CHECK(cudaGetDevice(&dev));
  NT_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return static_cast<size_t>(bytes);
}

bool cluster_kernels_run(const void* kernel) {
  int dev = 0, major = 0;
  cudaFuncAttributes attr{};
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    cudaGetLastError();  // a failed query is an answer (no), not a sticky error
    return false;
  }
  return major >= 9 && attr.ptxVersion >= 90;
}

}  // namespace nt::kernels::cuda
