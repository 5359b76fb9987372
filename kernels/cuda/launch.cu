#include "kernels/cuda/launch.cuh"

namespace nt::kernels::cuda {

void throw_launch_error(const char* kernel, cudaError_t err, dim3 grid, dim3 block, size_t smem, bool after_sync) {
  throw InternalError(cat("CUDA kernel ", kernel, after_sync ? " failed while running: " : " failed to launch: ",
                          cudaGetErrorName(err), " (", cudaGetErrorString(err), "), grid (", grid.x, ",", grid.y,
                          ",", grid.z, "), block (", block.x, ",", block.y, ",", block.z, "), ", smem,
                          " B shared memory"));
}

namespace {
// An attribute of the current device, asked once per thread and device: launchers call these every step.
template <cudaDeviceAttr Attribute>
int current_device_attribute() {
  thread_local int device = -1;
  thread_local int value = 0;
  int current = 0;
  NT_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) {
    NT_CUDA_CHECK(cudaDeviceGetAttribute(&value, Attribute, current));
    device = current;
  }
  return value;
}
}  // namespace

bool programmatic_launch_supported() { return current_device_attribute<cudaDevAttrComputeCapabilityMajor>() >= 9; }

int multiprocessor_count() { return current_device_attribute<cudaDevAttrMultiProcessorCount>(); }

size_t max_shared_bytes_per_block() {
  return static_cast<size_t>(current_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>());
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
