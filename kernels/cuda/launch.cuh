// The one launch path for every CUDA kernel of the engine.
//
//   launch(exec, "gemm_bias_relu", cost, kernel, grid, block, smem, args...);
//
// It opens an NVTX range named after the kernel, tells the profiler (when one observes), checks the
// launch error and names the kernel in the message, and with exec.debug_sync synchronizes and checks
// again so that an asynchronous fault is pinned to the kernel that caused it. Adding a kernel never
// means adding timing or checking code.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/cuda_check.h"
#include "kernels/exec.h"
#include "profile/nvtx.h"

namespace nt::kernels::cuda {

[[noreturn]] void throw_launch_error(const char* kernel, cudaError_t err, dim3 grid, dim3 block, size_t smem,
                                     bool after_sync);

inline cudaStream_t stream_of(const Exec& exec) { return static_cast<cudaStream_t>(exec.stream); }

template <class... KernelParams, class... Args>
void launch(const Exec& exec, const char* name, const profile::OpCost& cost, void (*kernel)(KernelParams...),
            dim3 grid, dim3 block, size_t smem, Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;  // empty problem: nothing to launch
  profile::NvtxRange range(name);
  cudaStream_t stream = stream_of(exec);
  if (exec.observer) exec.observer->begin(name, stream);
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw_launch_error(name, err, grid, block, smem, false);
  if (exec.observer) exec.observer->end(name, stream, cost);
  if (exec.debug_sync) {
    err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) throw_launch_error(name, err, grid, block, smem, true);
  }
}

// Ceiling division for grid sizes.
template <class T>
constexpr T div_up(T a, T b) {
  return (a + b - 1) / b;
}

}  // namespace nt::kernels::cuda
