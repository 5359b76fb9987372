// Batch assembly from a device-resident dataset: gather rows by a permutation and normalize per channel.
//
// images (N,D) uint8 with D = C*P (C planes of P = H*W values each, planar), labels (N) uint8, perm (>= first+B)
// int32 indices into [0,N). For b in [0,B), r = perm[first+b], value d of plane c = d / P:
//   x[b,d] = (images[r, d] / 255 - mean[c]) / std[c]            (x: (B,D) float, written =)
//   y[b]   = labels[r]                                          (y: (B) int32, written =)
// The arithmetic is exactly ToTensor() then Normalize(mean, std) of torchvision, in fp32, so both
// backends and PyTorch see bit-identical inputs. One channel with mean[0], std[0] is the single-channel
// normalization of before, bit for bit.
//
// Planes: with height and width set (H, W > 0) an image is (C,H,W) row-major and C = D / (H*W); with them
// left at 0 it is one plane of D values (C = 1, mean[0] and std[0]; shift and flip must then be off).
//
// Training augmentation, for example b at position p = first + b of the epoch's order:
//   flip (src.flip):        mirrored left-right when batch_flip(*flip_key, p) says so;
//   shift (src.shift = k):  then translated by (dy, dx) = batch_shift(*shift_key, p, k), each uniform in [-k, k].
// Flip first, then shift: with f = 1 for a flipped example (0 otherwise) and sj = j - dx,
//   x[b,c,i,j] = norm_c(images[r, c, i-dy, f ? W-1-sj : sj])   where 0 <= i-dy < H and 0 <= sj < W,
//              = norm_c(0) = (0 - mean[c]) / std[c]               elsewhere (pixels shifted in from outside are black)
// *shift_key and *flip_key are the epoch's keys, counter_key(seed', epoch) of kernels/counter_hash.h with
// independent seeds' (the batcher derives them for distinct purposes), held in memory of the executing backend
// (device memory on CUDA) and written once per epoch by the batcher: the op reads them through the pointers, so
// a captured CUDA graph replays with each epoch's fresh draws. The draws are integer hashes shared by host and
// device, so both backends agree and the output stays bit-identical. With shift == 0 the shift key is not read,
// with flip off the flip key is not read; with both off the op is the plain gather.
//
// mean and std are per channel, by value in this struct (ChannelValues, at most kMaxBatchChannels): a captured
// CUDA graph keeps the values of its capture, which is right because a data set's normalization never changes.
#pragma once

#include <cstdint>

#include "kernels/counter_hash.h"
#include "kernels/dispatch.h"

namespace nt::kernels {

// The most channels (planes) an image may have for the batch kernels: RGBA. Data sets with more are refused at
// the data set boundary (data/dataset.h).
inline constexpr int kMaxBatchChannels = 4;

// One float per channel, by value. A single float converts to the same value for every channel (what a
// single-channel data set gives), so `.mean = 0.1307f` reads as it always did.
struct ChannelValues {
  float value[kMaxBatchChannels] = {};

  ChannelValues() = default;
  ChannelValues(float all) {  // NOLINT(google-explicit-constructor): the one-channel case, on purpose
    for (float& v : value) v = all;
  }
  // values[0..channels), channels in [1, kMaxBatchChannels] (the caller checks); the rest stay 0.
  ChannelValues(const float* values, int channels) {
    for (int c = 0; c < channels && c < kMaxBatchChannels; ++c) value[c] = values[c];
  }
};

struct BatchSource {
  const uint8_t* images = nullptr;
  const uint8_t* labels = nullptr;
  const int32_t* perm = nullptr;
  int D = 0;                 // values per image
  ChannelValues mean = 0.f;  // per channel, in [0,1] units
  ChannelValues std = 1.f;
  int height = 0, width = 0;  // H, W of one channel plane, C = D / (H*W); 0, 0: one plane of D values
  // Random shift (see above); unused while shift == 0.
  int shift = 0;                        // k >= 0
  const uint64_t* shift_key = nullptr;  // -> the epoch's shift key, on the executing backend
  // Random left-right flip (see above); unused while flip is false.
  bool flip = false;
  const uint64_t* flip_key = nullptr;  // -> the epoch's flip key, on the executing backend
};

// One value of the batch: ToTensor then Normalize, in fp32 (above). A division by 255, not a multiplication by its
// reciprocal, as torchvision does.
NT_HOST_DEVICE inline float normalize_pixel(uint8_t pixel, float mean, float std_dev) {
  return (static_cast<float>(pixel) / 255.0f - mean) / std_dev;
}

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

// Whether the example at `position` of an epoch's order is mirrored: the top bit of its hashed word, so each
// example flips with probability 1/2, independently of its shift (another key).
NT_HOST_DEVICE inline bool batch_flip(uint64_t epoch_key, uint64_t position) {
  return (counter_bits(epoch_key, position) >> 63) != 0;
}

// gather_batch reads src's images, labels, perm (and its keys, as above) and writes x and y.
struct GatherBatchArgs {
  BatchSource src;       // the data set and its normalization and augmentation
  int64_t first = 0;     // the batch's first position in src.perm
  int B = 0;             // rows of the batch
  float* x = nullptr;    // (B, src.D)  written (=)
  int32_t* y = nullptr;  // (B)         written (=)
  // The kernel launched just before reads and writes nothing that the gather reads or writes (a training
  // step's optimizer update); on the GPU the gather then runs beside it (kernels/cuda/launch.cuh,
  // begin_overlapping_kernel). The CPU runs in order anyway.
  bool overlaps_previous = false;
};

namespace cpu {
void gather_batch(const Exec& exec, const GatherBatchArgs& a);
}
namespace cuda {
void gather_batch(const Exec& exec, const GatherBatchArgs& a);
}
inline void gather_batch(const Exec& exec, const GatherBatchArgs& a) {
  dispatch<cpu::gather_batch, cuda::gather_batch>(exec, a);
}

}  // namespace nt::kernels
