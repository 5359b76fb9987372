// Batch assembly from a device-resident dataset: gather rows by a permutation and normalize.
//
// images (N,D) uint8, labels (N) uint8, perm (>= first+B) int32 indices into [0,N).
//   x[b,d] = (images[perm[first+b], d] / 255 - mean) / std      (x: (B,D) float, written =)
//   y[b]   = labels[perm[first+b]]                              (y: (B) int32, written =)
// The arithmetic is exactly ToTensor() then Normalize(mean, std) of torchvision, in fp32, so both
// backends and PyTorch see bit-identical inputs.
#pragma once

#include <cstdint>

#include "kernels/exec.h"

namespace nt::kernels {

struct BatchSource {
  const uint8_t* images = nullptr;
  const uint8_t* labels = nullptr;
  const int32_t* perm = nullptr;
  int D = 0;            // values per image
  float mean = 0.f;     // in [0,1] units
  float std = 1.f;
};

namespace cpu {
void gather_batch(const Exec& exec, const BatchSource& src, int64_t first, int B, float* x, int32_t* y);
}
namespace cuda {
void gather_batch(const Exec& exec, const BatchSource& src, int64_t first, int B, float* x, int32_t* y);
}
inline void gather_batch(const Exec& exec, const BatchSource& src, int64_t first, int B, float* x, int32_t* y) {
  NT_DISPATCH(exec, gather_batch, src, first, B, x, y);
}

}  // namespace nt::kernels
