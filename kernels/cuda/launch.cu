#include "kernels/cuda/launch.cuh"

namespace nt::kernels::cuda {

void throw_launch_error(const char* kernel, cudaError_t err, dim3 grid, dim3 block, size_t smem, bool after_sync) {
  throw InternalError(cat("CUDA kernel ", kernel, after_sync ? " failed while running: " : " failed to launch: ",
                          cudaGetErrorName(err), " (", cudaGetErrorString(err), "), grid (", grid.x, ",", grid.y,
                          ",", grid.z, "), block (", block.x, ",", block.y, ",", block.z, "), ", smem,
                          " B shared memory"));
}

}  // namespace nt::kernels::cuda
