// Batch gather + normalize, CPU twin of kernels/cuda/batch.cu.
//
// images (N,D) uint8, labels (N) uint8, perm int32; for b in [0,B), row r = perm[first + b]:
//   x[b,d] = (float(images[r,d]) / 255.0f - mean) / std      x: (B,D) fp32, written (=)
//   y[b]   = labels[r]                                       y: (B) int32, written (=)
// Exactly torchvision's ToTensor (a division by 255, not a multiplication by its reciprocal) then
// Normalize (subtract, then divide), in fp32: three correctly rounded operations with no multiply-add to
// contract, so this backend, the CUDA one and PyTorch produce bit-identical inputs. perm entries are
// trusted to lie in [0,N) (the batcher builds them).
#include <algorithm>
#include <cstdint>

#include "kernels/batch.h"
#include "kernels/cpu/op_scope.h"
#include "kernels/cpu/thread_pool.h"

namespace nt::kernels::cpu {

namespace {

constexpr int64_t kRowsPerTask = 16;  // 16 MNIST rows ≈ 12 KB in, 50 KB out per task

// One sample: pixels (D) uint8 -> x_row (D) fp32.
void normalize_row(const uint8_t* pixels, int D, float mean, float std_dev, float* x_row) {
  for (int d = 0; d < D; ++d) x_row[d] = (static_cast<float>(pixels[d]) / 255.0f - mean) / std_dev;
}

}  // namespace

void gather_batch(const Exec& exec, const BatchSource& src, int64_t first, int B, float* x, int32_t* y) {
  if (B <= 0 || src.D <= 0) return;
  const int D = src.D;
  const double values = double(B) * D;
  // Pixels read once (uint8), perm and labels entries read, x and y written; subtract and two divides.
  profile::OpCost cost{values * (1 + 4) + B * (4.0 + 1 + 4), values * 3};
  OpScope scope(exec, "gather_batch", cost);

  const int64_t tasks = (B + kRowsPerTask - 1) / kRowsPerTask;
  parallel_for(exec.pool, tasks, [&](int64_t t) {
    const int64_t end = std::min<int64_t>(B, (t + 1) * kRowsPerTask);
    for (int64_t b = t * kRowsPerTask; b < end; ++b) {
      const int64_t r = src.perm[first + b];
      normalize_row(src.images + r * D, D, src.mean, src.std, x + b * D);
      y[b] = src.labels[r];
    }
  });
}

}  // namespace nt::kernels::cpu
