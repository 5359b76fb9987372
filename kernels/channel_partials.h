// Per-channel statistics of a tensor as partials, in BatchNorm's layout: the convolution's forward epilogue may
// leave them for its output (kernels/conv.h), and BatchNorm's training forward then skips its own statistics pass
// (kernels/batchnorm.h). For channel c of C and chunk p, (mean, M2 = Σ(v − mean)², count) over the chunk's values
// at data[(field·C + c)·chunks + p], field 0 mean, 1 M2, 2 count.
#pragma once

namespace nt::kernels {

struct ChannelPartials {
  float* data = nullptr;
  int chunks = 0;  // 0: none
};

}  // namespace nt::kernels
