// kernels/nonfinite.h on the GPU: a grid-stride pass in which each thread counts its values, each warp sums
// its lanes' counts, and lane 0 adds the warp's count to *count. Integer adds: any order gives the same total.
//   x (n) fp32, read once; count (1) int64, accumulated. Grid: enough blocks to fill the device, then striding.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/nonfinite.h"

namespace nt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;

__global__ void __launch_bounds__(kThreads)
    count_nonfinite_kernel(const float* x, int64_t n, int64_t* count, StampRing stamps) {
  begin_dependent_kernel(stamps);
  unsigned long long bad = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) bad += !isfinite(x[i]);
  for (int offset = 16; offset > 0; offset /= 2) bad += __shfl_down_sync(0xffffffffu, bad, offset);
  if (threadIdx.x % 32 == 0 && bad) atomicAdd(reinterpret_cast<unsigned long long*>(count), bad);
}

}  // namespace

void count_nonfinite(const Exec& exec, const NonfiniteCountArgs& a) {
  NT_CHECK(a.n >= 0 && (a.n == 0 || a.x) && a.count, "count_nonfinite: ", a.n, " values, x ", a.x, ", count ", a.count);
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(div_up<int64_t>(a.n, kThreads), 1, kMaxBlocks));
  launch(exec, "count_nonfinite", profile::OpCost{double(a.n) * sizeof(float), double(a.n)}, count_nonfinite_kernel,
         dim3(blocks), dim3(kThreads), 0, a.x, a.n, a.count);
}

}  // namespace nt::kernels::cuda
