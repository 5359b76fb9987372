// interleave_rank_partials on the CPU (contract in kernels/channel_partials.h; GPU twin
// kernels/cuda/channel_partials.cu).
#include <algorithm>

#include "kernels/channel_partials.h"
#include "kernels/cpu/op_scope.h"

namespace nt::kernels::cpu {

void interleave_rank_partials(const Exec& exec, const InterleaveRankPartialsArgs& a) {
  const int64_t rows = int64_t(a.ranks) * a.fields * a.channels;  // (r, field, c): one rank's chunks each
  const OpScope scope(exec, "interleave_rank_partials", {.bytes = double(rows) * a.chunks * 2 * sizeof(float)});
  const int64_t row_out = int64_t(a.ranks) * a.chunks;  // an output row: (field, c), every rank's chunks
  for (int64_t r = 0; r < a.ranks; ++r)
    for (int64_t fc = 0; fc < int64_t(a.fields) * a.channels; ++fc) {
      const float* from = a.gathered + (r * a.fields * a.channels + fc) * a.chunks;
      std::copy(from, from + a.chunks, a.out + fc * row_out + r * a.chunks);
    }
}

}  // namespace nt::kernels::cpu
