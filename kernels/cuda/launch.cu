#include "kernels/cuda/launch.cuh"

#include <vector>
#include "kernels/runtime.h"

namespace nt::kernels::cuda {

void throw_launch_error(const char* kernel, cudaError_t err, dim3 grid, dim3 block, size_t smem, bool after_sync) {
  throw InternalError(cat("CUDA kernel ", kernel, after_sync ? " failed while running: " : " failed to launch: ",
                          cudaGetErrorName(err), " (", cudaGetErrorString(err), "), grid (", grid.x, ",", grid.y, ",",
                          grid.z, "), block (", block.x, ",", block.y, ",", block.z, "), ", smem, " B shared memory"));
}

int running_code_arch();            // kernels/cuda/probe.cu
bool running_warpgroup_mma_code();  // kernels/cuda/probe.cu

namespace {
// A fact about the current device, asked once per thread and device: launchers call these every step.
template <class Ask>
int per_device(Ask ask) {
  thread_local int device = -1;
  thread_local int value = 0;
  int current = 0;
  NT_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) value = ask(current), device = current;
  return value;
}

template <cudaDeviceAttr Attribute>
int current_device_attribute() {
  return per_device([](int device) {
    int value = 0;
    NT_CUDA_CHECK(cudaDeviceGetAttribute(&value, Attribute, device));
    return value;
  });
}

// The virtual architecture of the code the current device runs (kernels/runtime.h, DeviceInfo::code_arch).
int current_code_arch() {
  return per_device([](int) { return running_code_arch(); });
}
}  // namespace

// The chip and the code: a compute_80 image on an H100 has no griddepcontrol, so its kernels could not wait.
bool programmatic_launch_supported() {
  return current_device_attribute<cudaDevAttrComputeCapabilityMajor>() >= 9 && current_code_arch() >= 90;
}

bool runs_tensor_core_code() { return current_code_arch() >= 80; }

bool runs_warpgroup_mma() {
  return per_device([](int) { return running_warpgroup_mma_code() ? 1 : 0; }) != 0;
}

void require_tf32_code(const char* kernel) {
  NT_CHECK(runs_tensor_core_code(), kernel,
           ": the TF32 tensor-core kernels need sm_80 code, and this device runs compute_", current_code_arch(),
           " code");
}

int multiprocessor_count() { return current_device_attribute<cudaDevAttrMultiProcessorCount>(); }

int resident_blocks(const void* kernel, int threads, size_t smem) {
  struct Asked {
    int device;
    const void* kernel;
    int threads;
    size_t smem;
    int blocks;
  };
  thread_local std::vector<Asked> asked;
  int device = 0;
  NT_CUDA_CHECK(cudaGetDevice(&device));
  for (const Asked& a : asked)
    if (a.device == device && a.kernel == kernel && a.threads == threads && a.smem == smem) return a.blocks;
  int per_sm = 0;
  NT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  asked.push_back({device, kernel, threads, smem, per_sm * multiprocessor_count()});
  return asked.back().blocks;
}

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

namespace {
__global__ void launch_stamps_close_kernel(StampRing stamps) { begin_dependent_kernel(stamps); }
}  // namespace

}  // namespace nt::kernels::cuda

namespace nt::kernels {

void prepare_launch_stamps() { cuda::load_stamping_twins(); }

void close_launch_stamps(const Exec& exec) {
  cuda::launch(exec, profile::kLaunchStampsClose, profile::OpCost{}, cuda::launch_stamps_close_kernel, dim3(1), dim3(1),
               0);
}

}  // namespace nt::kernels
