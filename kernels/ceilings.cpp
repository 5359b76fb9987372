// The backend-neutral side of the ceilings (kernels/ceilings.h): UUIDs, and the error a build without CUDA gives.
#include "kernels/ceilings.h"

#include <cstdio>
#include <cstring>

#include "kernels/dispatch.h"

#if NT_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#endif

namespace nt::kernels {

std::string gpu_uuid_text(const uint8_t (&b)[16]) {
  char text[64];
  std::snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return text;
}

std::string cuda_device_uuid(int device) {
#if NT_WITH_CUDA
  cudaDeviceProp prop{};
  NT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  uint8_t bytes[16];
  static_assert(sizeof prop.uuid.bytes == sizeof bytes);
  std::memcpy(bytes, prop.uuid.bytes, sizeof bytes);
  return gpu_uuid_text(bytes);
#else
  (void)device;
  throw_no_cuda_backend();
#endif
}

profile::Ceilings measure_ceilings(const Exec& exec) {
  if (!kCudaBuilt) throw_no_cuda_backend();
  if (!exec.on_cuda()) throw Error("measuring ceilings needs a CUDA device; this execution handle is on the CPU");
#if NT_WITH_CUDA
  return cuda::measure_ceilings(exec);
#else
  throw_no_cuda_backend();
#endif
}

}  // namespace nt::kernels
