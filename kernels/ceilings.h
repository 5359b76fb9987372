// Measuring a GPU's ceilings: the peak copy bandwidth and arithmetic rates that a profile's GB/s and GFLOP/s are
// compared with (profile/ceilings.h holds the result and its cache). What runs, and why each number is a ceiling,
// is at the top of kernels/cuda/ceilings.cu.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/exec.h"
#include "profile/ceilings.h"

namespace nt::kernels {

// Measures the current CUDA device, on exec's stream (which must belong to it): a device-to-device copy, an FFMA
// loop, and on sm_80 code the TF32 and BF16 mma.sync loops (0 below). Takes about a second, and up to 1 GiB of the
// device's memory for a moment. Every kernel goes through the one launch path, so a profiler on exec sees them.
// Throws nt::Error on the CPU backend, in a build without CUDA, and when the device has too little free memory.
profile::Ceilings measure_ceilings(const Exec& exec);

// nvidia-smi's name for a GPU (nvidia-smi -L): "GPU-" and its 16 UUID bytes as 8-4-4-4-12 lowercase hex digits.
std::string gpu_uuid_text(const uint8_t (&bytes)[16]);
// The UUID of CUDA device `device` in that form: the key of its ceilings in the cache. Throws nt::Error in a build
// without CUDA.
std::string cuda_device_uuid(int device);

namespace cuda {
profile::Ceilings measure_ceilings(const Exec& exec);  // kernels/cuda/ceilings.cu
}

}  // namespace nt::kernels
