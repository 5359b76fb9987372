// Batch gather + normalize on the GPU, from the device-resident dataset: one launch per training step.
//
// images (N,D) uint8, D = C*P (C planes of P values), labels (N) uint8, perm int32; for b in [0,B),
// row r = perm[first + b], value d of plane c:
//   x[b,d] = (float(images[r,d]) / 255.0f - mean[c]) / std[c]      x: (B,D) fp32, written (=)
//   y[b]   = labels[r]                                              y: (B) int32, written (=) by the row's first thread
// Exactly torchvision's ToTensor (a division by 255, not a multiplication by its reciprocal) then
// Normalize (subtract, then divide), in fp32: correctly rounded operations (nvcc's default -prec-div)
// with no multiply-add to contract, so this kernel, the CPU twin and PyTorch give bit-identical inputs.
// perm entries are trusted to lie in [0,N) (the batcher builds them). mean and std come by value in the
// arguments (kernels/batch.h: a captured graph keeps them, and they never change).
//
// Launch: a 3D grid, x over the columns of a plane, y over the rows (grid-stride, for batches beyond the
// grid's y limit), z over the C planes (one for MNIST). When P % 4 == 0, images is 4-byte and x 16-byte
// aligned (MNIST: P = D = 784; CIFAR-10: P = 1024; the dataset and arena buffers are aligned) a column is 4
// values: a uchar4 load from the source plane (consecutive threads read consecutive words of it) and a float4
// store. Otherwise a column is one value. No integer division in the index math; the label is written by the
// row's first thread.
//
// Augmentation (src.flip, src.shift = k > 0; the contract is in kernels/batch.h): the image is (C,H,W)
// row-major, example b at position p = first + b is mirrored when batch_flip(*src.flip_key, p), then translated
// by (dy, dx) = batch_shift(*src.shift_key, p, k):
//   x[b,c,i,j] = norm_c(images[r, c, i-dy, f ? W-1-(j-dx) : j-dx]) inside the source image, norm_c(0) outside
// The keys are read from device memory by every thread (broadcast 8-byte loads, after the dependency wait),
// so a captured whole-epoch graph picks up the keys its epoch uploaded; the draws are integer arithmetic shared
// with the host. Launch: threads x over the columns j of an image row (striding when W > blockDim.x), threads y
// and blockIdx.x over the image rows i, blockIdx.z over the channels, blockIdx.y over the batch rows
// (grid-stride). A warp reads one contiguous source row segment (backwards when mirrored) and writes one
// contiguous output row segment; no integer division in the index math.
//
// Overlapping (GatherBatchArgs::overlaps_previous): the kernels open and close with launch.cuh's begin_kernel and
// end_kernel, so a training step's gather runs beside the previous step's optimizer update (which touches
// neither the data nor the batch) rather than after it.
#include <algorithm>
#include <cstdint>

#include "kernels/batch.h"
#include "kernels/cuda/launch.cuh"

namespace nt::kernels::cuda {

namespace {

constexpr int kMaxThreads = 256;
constexpr int kMaxRowBlocks = 65535;  // the grid's y limit; more rows stride

struct Normalize {
  float mean, std;
  __device__ float operator()(uint8_t pixel) const { return normalize_pixel(pixel, mean, std); }
};

__device__ __forceinline__ Normalize channel_norm(const ChannelValues& mean, const ChannelValues& std, int c) {
  return {mean.value[c], std.value[c]};
}

// x: (B,C,P) fp32; threads over the P/4 columns of 4 values of plane c = blockIdx.z (blockIdx.x, threadIdx.x),
// rows over blockIdx.y. The 256 values norm_c(p) go into a shared table first, with the same correctly rounded
// divisions: two per pixel value instead of two per pixel, built before the dependency wait (it reads only the
// kernel's arguments), so under programmatic dependent launch it overlaps the predecessor's tail.
__global__ void __launch_bounds__(kMaxThreads)
    gather_batch_vec4_kernel(const uint8_t* __restrict__ images, const uint8_t* __restrict__ labels,
                             const int32_t* __restrict__ perm, int64_t first, int B, int D, int P, ChannelValues mean,
                             ChannelValues std, bool overlap, float* __restrict__ x, int32_t* __restrict__ y,
                             StampRing stamps) {
  __shared__ float value_of[256];  // value_of[p] = norm_c(p)
  const int c = blockIdx.z;
  const Normalize norm = channel_norm(mean, std, c);
  for (int p = threadIdx.x; p < 256; p += blockDim.x) value_of[p] = norm(static_cast<uint8_t>(p));
  __syncthreads();
  begin_kernel(overlap, stamps);
  const int q = blockIdx.x * blockDim.x + threadIdx.x;  // which 4 values of the plane
  const int64_t plane = int64_t(c) * P;                 // offset of plane c in an image
  const bool row_leader = blockIdx.x == 0 && c == 0 && threadIdx.x == 0;
  for (int b = blockIdx.y; b < B; b += gridDim.y) {
    const int64_t r = perm[first + b];
    if (row_leader) y[b] = labels[r];
    if (q < P / 4) {
      const uchar4 px = reinterpret_cast<const uchar4*>(images + r * D + plane)[q];
      reinterpret_cast<float4*>(x + int64_t(b) * D + plane)[q] =
          float4{value_of[px.x], value_of[px.y], value_of[px.z], value_of[px.w]};
    }
  }
  end_kernel(overlap, stamps);
}

// x: (B,C,P) fp32; threads over the P columns of plane c = blockIdx.z (blockIdx.x, threadIdx.x), rows over
// blockIdx.y.
__global__ void __launch_bounds__(kMaxThreads)
    gather_batch_kernel(const uint8_t* __restrict__ images, const uint8_t* __restrict__ labels,
                        const int32_t* __restrict__ perm, int64_t first, int B, int D, int P, ChannelValues mean,
                        ChannelValues std, bool overlap, float* __restrict__ x, int32_t* __restrict__ y,
                        StampRing stamps) {
  begin_kernel(overlap, stamps);
  const int c = blockIdx.z;
  const Normalize norm = channel_norm(mean, std, c);
  const int d = blockIdx.x * blockDim.x + threadIdx.x;  // column within plane c
  const int64_t at = int64_t(c) * P + d;                // its index in an image
  const bool row_leader = blockIdx.x == 0 && c == 0 && threadIdx.x == 0;
  for (int b = blockIdx.y; b < B; b += gridDim.y) {
    const int64_t r = perm[first + b];
    if (row_leader) y[b] = labels[r];
    if (d < P) x[int64_t(b) * D + at] = norm(images[r * D + at]);
  }
  end_kernel(overlap, stamps);
}

// x: (B,C,H,W) fp32, mirrored and/or translated images; see the file's comment for the thread mapping.
__global__ void __launch_bounds__(kMaxThreads)
    gather_batch_transform_kernel(const uint8_t* __restrict__ images, const uint8_t* __restrict__ labels,
                                  const int32_t* __restrict__ perm, int64_t first, int B, int D, int H, int W, int k,
                                  const uint64_t* __restrict__ shift_key, bool flip,
                                  const uint64_t* __restrict__ flip_key, ChannelValues mean, ChannelValues std,
                                  bool overlap, float* __restrict__ x, int32_t* __restrict__ y, StampRing stamps) {
  begin_kernel(overlap, stamps);
  const uint64_t skey = k > 0 ? *shift_key : 0, fkey = flip ? *flip_key : 0;
  const int i = blockIdx.x * blockDim.y + threadIdx.y;  // output image row
  const int64_t plane = int64_t(blockIdx.z) * H;        // first row of channel c in (C*H, W)
  const bool row_leader = blockIdx.x == 0 && blockIdx.z == 0 && threadIdx.x == 0 && threadIdx.y == 0;
  const Normalize norm = channel_norm(mean, std, blockIdx.z);
  const float fill = norm(uint8_t{0});
  for (int b = blockIdx.y; b < B; b += gridDim.y) {
    const int64_t r = perm[first + b];
    if (row_leader) y[b] = labels[r];
    if (i >= H) continue;
    const uint64_t p = uint64_t(first + b);
    const PixelShift s = k > 0 ? batch_shift(skey, p, k) : PixelShift{};
    const bool mirrored = flip && batch_flip(fkey, p);
    const int si = i - s.dy;  // source image row
    const bool row_inside = si >= 0 && si < H;
    const uint8_t* in = images + r * D + (plane + (row_inside ? si : 0)) * W;  // images[r,c,si,:]
    float* out = x + int64_t(b) * D + (plane + i) * W;                         // x[b,c,i,:]
    for (int j = threadIdx.x; j < W; j += blockDim.x) {
      const int sj = j - s.dx;  // source column of the mirrored image
      out[j] = row_inside && sj >= 0 && sj < W ? norm(in[mirrored ? W - 1 - sj : sj]) : fill;
    }
  }
  end_kernel(overlap, stamps);
}

bool aligned(const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// Threads per block: the plane's columns rounded up to whole warps, at most kMaxThreads (D = 784 as
// float4: 196 columns, 224 threads, one block per row).
int threads_for(int columns) { return std::min(kMaxThreads, div_up(columns, 32) * 32); }

}  // namespace

void gather_batch(const Exec& exec, const GatherBatchArgs& a) {
  const BatchSource& src = a.src;
  const int64_t first = a.first;
  const int B = a.B;
  float* x = a.x;    // (B, D)
  int32_t* y = a.y;  // (B)
  const bool overlaps_previous = a.overlaps_previous;
  if (B <= 0 || src.D <= 0) return;
  const int D = src.D;
  const double values = double(B) * D;
  // Pixels read once (uint8), perm and labels entries read, x and y written; subtract and two divides.
  profile::OpCost cost{
      .bytes = values * (1 + 4) + B * (4.0 + 1 + 4), .flops = values * 3, .overlaps_previous = overlaps_previous};
  if (src.shift > 0 || src.flip) {
    // Threads x over a row's columns (whole warps, at most 128), y over rows up to kMaxThreads in all
    // (MNIST: 32 x 8 threads, 4 blocks per image).
    const int H = src.height, W = src.width;
    const int tx = std::min(128, div_up(W, 32) * 32), ty = std::min(kMaxThreads / tx, H);
    const dim3 grid(div_up(H, ty), std::min(B, kMaxRowBlocks), D / (H * W));
    launch(exec, "gather_batch", cost, gather_batch_transform_kernel, grid, dim3(tx, ty), 0, src.images, src.labels,
           src.perm, first, B, D, H, W, src.shift, src.shift_key, src.flip, src.flip_key, src.mean, src.std,
           overlaps_previous, x, y);
    return;
  }
  // Planes: C = D / (H*W) when the shape is given, else one plane of D values.
  const int C = src.height > 0 && src.width > 0 ? std::max(1, D / (src.height * src.width)) : 1;
  const int P = D / C;
  const bool vec = P % 4 == 0 && aligned(src.images, 4) && aligned(x, 16);
  const int columns = vec ? P / 4 : P;
  const int threads = threads_for(columns);
  const dim3 grid(div_up(columns, threads), std::min(B, kMaxRowBlocks), C);
  if (vec)
    launch(exec, "gather_batch", cost, gather_batch_vec4_kernel, grid, dim3(threads), 0, src.images, src.labels,
           src.perm, first, B, D, P, src.mean, src.std, overlaps_previous, x, y);
  else
    launch(exec, "gather_batch", cost, gather_batch_kernel, grid, dim3(threads), 0, src.images, src.labels, src.perm,
           first, B, D, P, src.mean, src.std, overlaps_previous, x, y);
}

}  // namespace nt::kernels::cuda
