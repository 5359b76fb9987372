// interleave_rank_partials on the GPU (contract in kernels/channel_partials.h; CPU twin
// kernels/cpu/channel_partials.cpp). A copy of a few thousand floats once per synchronized BatchNorm: one thread per
// output value, its source index computed from the output's (field·C + c, r, p).
#include "kernels/channel_partials.h"
#include "kernels/cuda/launch.cuh"

namespace nt::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// out (F·C, W·chunks) from gathered (W, F·C, chunks): thread i writes out[i].
__global__ void __launch_bounds__(kThreads)
    interleave_rank_partials_kernel(const float* __restrict__ gathered, float* __restrict__ out, int64_t rows,
                                    int ranks, int chunks, StampRing stamps) {
  begin_dependent_kernel(stamps);
  const int64_t row_out = int64_t(ranks) * chunks;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * row_out) return;
  const int64_t row = i / row_out, k = i % row_out;  // row = field·C + c; k = r·chunks + p
  const int64_t r = k / chunks, p = k % chunks;
  out[i] = gathered[(r * rows + row) * chunks + p];
}

}  // namespace

void interleave_rank_partials(const Exec& exec, const InterleaveRankPartialsArgs& a) {
  const int64_t rows = int64_t(a.fields) * a.channels, total = rows * a.ranks * a.chunks;
  launch(exec, "interleave_rank_partials", {.bytes = double(total) * 2 * sizeof(float)},
         interleave_rank_partials_kernel, dim3(static_cast<unsigned>(div_up<int64_t>(total, kThreads))), dim3(kThreads),
         0, a.gathered, a.out, rows, a.ranks, a.chunks);
}

}  // namespace nt::kernels::cuda
