// Batch gather + normalize, CPU twin of kernels/cuda/batch.cu.
//
// images (N,D) uint8, D = C*P (C planes of P values), labels (N) uint8, perm int32; for b in [0,B),
// row r = perm[first + b], value d of plane c:
//   x[b,d] = (float(images[r,d]) / 255.0f - mean[c]) / std[c]      x: (B,D) fp32, written (=)
//   y[b]   = labels[r]                                              y: (B) int32, written (=)
// Exactly torchvision's ToTensor (a division by 255, not a multiplication by its reciprocal) then
// Normalize (subtract, then divide), in fp32: three correctly rounded operations with no multiply-add to
// contract, so this backend, the CUDA one and PyTorch produce bit-identical inputs. perm entries are
// trusted to lie in [0,N) (the batcher builds them).
//
// Augmentation (src.flip, src.shift = k > 0; the contract is in kernels/batch.h): the image is (C,H,W)
// row-major; example b at position p = first + b is mirrored when batch_flip(*src.flip_key, p), then
// translated by (dy, dx) = batch_shift(*src.shift_key, p, k):
//   x[b,c,i,j] = norm_c(images[r, c, i-dy, f ? W-1-(j-dx) : j-dx]) inside the source image, norm_c(0) outside
// The keys are read once per call (host memory on this backend); the draws are integer arithmetic shared
// with the CUDA kernel and the values go through the same normalization, so the backends agree bit for bit.
// Rows are independent: the result does not depend on the thread count.
#include <algorithm>
#include <cstdint>

#include "kernels/batch.h"
#include "kernels/cpu/op_scope.h"
#include "kernels/cpu/thread_pool.h"

namespace nt::kernels::cpu {

namespace {

constexpr int64_t kRowsPerTask = 16;  // 16 MNIST rows ≈ 12 KB in, 50 KB out per task

// One sample: pixels (C,P) uint8 -> x_row (C,P) fp32, plane c with (mean[c], std[c]).
void normalize_row(const uint8_t* pixels, int C, int64_t P, const ChannelValues& mean, const ChannelValues& std_dev,
                   float* x_row) {
  for (int c = 0; c < C; ++c) {
    const float m = mean.value[c], s = std_dev.value[c];
    const uint8_t* in = pixels + c * P;  // images[r,c,:]
    float* out = x_row + c * P;          // x[b,c,:]
    for (int64_t d = 0; d < P; ++d) out[d] = normalize_pixel(in[d], m, s);
  }
}

// One sample mirrored when `flip`, then translated by s: pixels (C,H,W) uint8 -> x_row (C,H,W) fp32, norm_c(0)
// where the source pixel (i - dy, j - dx) of the mirrored image lies outside it.
void transform_row(const uint8_t* pixels, int C, int H, int W, PixelShift s, bool flip, const ChannelValues& mean,
                   const ChannelValues& std_dev, float* x_row) {
  const int j_begin = std::clamp(s.dx, 0, W), j_end = std::clamp(W + s.dx, 0, W);  // j - dx in [0, W)
  for (int c = 0; c < C; ++c) {
    const float m = mean.value[c], sd = std_dev.value[c];
    const float fill = normalize_pixel(0, m, sd);
    for (int i = 0; i < H; ++i) {
      float* out = x_row + (int64_t(c) * H + i) * W;  // x[b,c,i,:]
      const int si = i - s.dy;
      if (si < 0 || si >= H) {
        std::fill(out, out + W, fill);
        continue;
      }
      const uint8_t* in = pixels + (int64_t(c) * H + si) * W;  // images[r,c,si,:]
      for (int j = 0; j < j_begin; ++j) out[j] = fill;
      if (flip)
        for (int j = j_begin; j < j_end; ++j) out[j] = normalize_pixel(in[W - 1 - (j - s.dx)], m, sd);
      else
        for (int j = j_begin; j < j_end; ++j) out[j] = normalize_pixel(in[j - s.dx], m, sd);
      for (int j = std::max(j_begin, j_end); j < W; ++j) out[j] = fill;
    }
  }
}

}  // namespace

void gather_batch(const Exec& exec, const GatherBatchArgs& a) {
  const BatchSource& src = a.src;
  const int64_t first = a.first;
  const int B = a.B;
  float* x = a.x;    // (B, D)
  int32_t* y = a.y;  // (B)
  if (B <= 0 || src.D <= 0) return;
  const int D = src.D;
  const double values = double(B) * D;
  // Pixels read once (uint8), perm and labels entries read, x and y written; subtract and two divides.
  profile::OpCost cost{values * (1 + 4) + B * (4.0 + 1 + 4), values * 3};
  OpScope scope(exec, "gather_batch", cost);

  const int k = src.shift;
  const bool flip = src.flip, spatial = k > 0 || flip;
  const uint64_t shift_key = k > 0 ? *src.shift_key : 0, flip_key = flip ? *src.flip_key : 0;
  const int H = src.height, W = src.width;
  const int C = H > 0 && W > 0 ? std::max(1, D / (H * W)) : 1;
  const int64_t P = D / C;  // values per plane
  const int64_t tasks = (B + kRowsPerTask - 1) / kRowsPerTask;
  parallel_for(exec.pool, tasks, [&](int64_t t) {
    const int64_t end = std::min<int64_t>(B, (t + 1) * kRowsPerTask);
    for (int64_t b = t * kRowsPerTask; b < end; ++b) {
      const int64_t r = src.perm[first + b];
      const uint64_t p = uint64_t(first + b);
      if (spatial)
        transform_row(src.images + r * D, C, H, W, k > 0 ? batch_shift(shift_key, p, k) : PixelShift{},
                      flip && batch_flip(flip_key, p), src.mean, src.std, x + b * D);
      else
        normalize_row(src.images + r * D, C, P, src.mean, src.std, x + b * D);
      y[b] = src.labels[r];
    }
  });
}

}  // namespace nt::kernels::cpu
