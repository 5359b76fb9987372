// Per-channel statistics of a tensor as partials, in BatchNorm's layout: the convolution's forward epilogue may
// leave them for its output (kernels/conv.h), and BatchNorm's training forward then skips its own statistics pass
// (kernels/batchnorm.h). For channel c of C and chunk p, (mean, M2 = Σ(v − mean)², count) over the chunk's values
// at data[(field·C + c)·chunks + p], field 0 mean, 1 M2, 2 count.
//
// Synchronized BatchNorm gathers every rank's partials (kernels/collective.h, all_gather), rank after rank:
//   gathered[((r·F + field)·C + c)·chunks + p]      r < W ranks, each laid out as above (F fields)
// interleave_rank_partials lays them out as one rank's partials with W·chunks chunks, rank 0's first:
//   out[(field·C + c)·(W·chunks) + r·chunks + p] = gathered[((r·F + field)·C + c)·chunks + p]
// so that BatchNorm combines them as it combines its own, in one fixed order on every rank. A copy: both backends
// give the same bits.
#pragma once

#include <cstdint>

#include "kernels/dispatch.h"

namespace nt::kernels {

struct ChannelPartials {
  float* data = nullptr;
  int chunks = 0;  // 0: none
};

struct InterleaveRankPartialsArgs {
  const float* gathered = nullptr;  // (W, fields, C, chunks)
  float* out = nullptr;             // (fields, C, W·chunks); must not overlap gathered
  int ranks = 1;                    // W
  int fields = 3;                   // F: 3 for the forward's (mean, M2, count)
  int64_t channels = 0;             // C
  int chunks = 0;                   // each rank's
};

namespace cpu {
void interleave_rank_partials(const Exec& exec, const InterleaveRankPartialsArgs& a);
}
namespace cuda {
void interleave_rank_partials(const Exec& exec, const InterleaveRankPartialsArgs& a);
}
inline void interleave_rank_partials(const Exec& exec, const InterleaveRankPartialsArgs& a) {
  dispatch<cpu::interleave_rank_partials, cuda::interleave_rank_partials>(exec, a);
}

}  // namespace nt::kernels
