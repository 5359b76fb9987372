// Batch assembly from a device-resident dataset: gather rows by a permutation and normalize.
//
// images (N,D) uint8, labels (N) uint8, perm (>= first+B) int32 indices into [0,N).
//   x[b,d] = (images[perm[first+b], d] / 255 - mean) / std      (x: (B,D) float, written =)
//   y[b]   = labels[perm[first+b]]                              (y: (B) int32, written =)
// The arithmetic is exactly ToTensor() then Normalize(mean, std) of torchvision, in fp32, so both
// backends and PyTorch see bit-identical inputs.
//
// Random shift (training augmentation, on when shift = k > 0): the images are (C,H,W) row-major with
// D = C*H*W, and example b, at position p = first + b of the epoch's order, is translated by
// (dy, dx) = batch_shift(*shift_key, p, k), each uniform in [-k, k]:
//   x[b,c,i,j] = norm(images[r, c, i-dy, j-dx])   where 0 <= i-dy < H and 0 <= j-dx < W,
//              = norm(0) = (0 - mean) / std        elsewhere (pixels shifted in from outside are black)
// *shift_key is the epoch's key, counter_key(seed, epoch) of kernels/counter_hash.h, held in memory of
// the executing backend (device memory on CUDA) and written once per epoch by the batcher: the op reads
// it through the pointer, so a captured CUDA graph replays with each epoch's fresh shifts. The shifts are
// integer hashes shared by host and device, so both backends shift alike and the output stays bit-identical.
// With shift == 0 the op is the plain gather and the shift fields are not read.
#pragma once

#include <cstdint>

#include "kernels/counter_hash.h"
#include "kernels/exec.h"

namespace nt::kernels {

struct BatchSource {
  const uint8_t* images = nullptr;
  const uint8_t* labels = nullptr;
  const int32_t* perm = nullptr;
  int D = 0;            // values per image
  float mean = 0.f;     // in [0,1] units
  float std = 1.f;
  // Random shift (see above); unused while shift == 0.
  int height = 0, width = 0;             // H, W of one channel plane; channels = D / (H*W)
  int shift = 0;                         // k >= 0
  const uint64_t* shift_key = nullptr;   // -> the epoch's key, on the executing backend
};

struct PixelShift {
  int dy = 0, dx = 0;
};

// The shift of the example at `position` of an epoch's order: 64 hashed bits, dy from the low 32 and dx
// from the high 32, each mapped to [0, 2k+1) by a multiply-shift (Lemire 2019: floor(u * n / 2^32), no
// division; the bias, under n / 2^32, is immaterial) and then centred.
NT_HOST_DEVICE inline PixelShift batch_shift(uint64_t epoch_key, uint64_t position, int k) {
  const uint64_t bits = counter_bits(epoch_key, position);
  const uint64_t n = static_cast<uint64_t>(2 * k + 1);
  return {static_cast<int>(((bits & 0xFFFFFFFFull) * n) >> 32) - k, static_cast<int>(((bits >> 32) * n) >> 32) - k};
}

// overlaps_previous: the kernel launched just before reads and writes nothing that the gather reads or writes
// (a training step's optimizer update); on the GPU the gather then runs beside it (kernels/cuda/launch.cuh,
// begin_overlapping_kernel). The CPU runs in order anyway.
namespace cpu {
void gather_batch(const Exec& exec, const BatchSource& src, int64_t first, int B, float* x, int32_t* y,
                  bool overlaps_previous = false);
}
namespace cuda {
void gather_batch(const Exec& exec, const BatchSource& src, int64_t first, int B, float* x, int32_t* y,
                  bool overlaps_previous = false);
}
inline void gather_batch(const Exec& exec, const BatchSource& src, int64_t first, int B, float* x, int32_t* y,
                         bool overlaps_previous = false) {
  NT_DISPATCH(exec, gather_batch, src, first, B, x, y, overlaps_previous);
}

}  // namespace nt::kernels
