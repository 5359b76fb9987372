#if NT_WITH_CUDA
#include "core/cuda_check.h"

namespace nt {

void throw_cuda(cudaError_t err, const char* what, const char* file, int line) {
  int device = -1;
  cudaGetDevice(&device);
  throw InternalError(cat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") from ", what, " at ",
                          file, ":", line, " on device ", device));
}

}  // namespace nt
#endif  // NT_WITH_CUDA
