// The GEMM kernel lab's entry (kernels/cuda/gemm.cu), for bench/bench_gemm.cu and the CUDA tests: the
// same op as kernels::gemm with the tile configuration forced, so every configuration can be checked
// and timed. Not part of the op API: the engine calls kernels::gemm, which picks the configuration.
#pragma once

#include "kernels/gemm.h"

namespace nt::kernels::cuda::lab {

// FFMA tiles: 128×128, 64×64, 32×32 block tiles; small_grouped: 32×32 with 64-deep slabs over 4 k-groups (256
// threads). BF16 tensor-core tiles (Exec::math BF16 only): 64×64, 32×64, 32×32 on 4 warps.
enum GemmTile : int {
  large = 0,
  medium = 1,
  small = 2,
  small_grouped = 3,
  mma_64x64 = 4,
  mma_32x64 = 5,
  mma_32x32 = 6,
  gemm_tile_count
};

// split_k: 1, or 2/4/8 (a thread-block cluster, sm_90) with either small FFMA tile.
void gemm_variant(const Exec& exec, const GemmDesc& d, int tile, int split_k);
// The FFMA tiles' own plan whatever Exec::math (under BF16 they round the operands as they stage them): what
// kernels::gemm ran under BF16 before the tensor-core tiles, kept for comparison.
void gemm_ffma_plan(const Exec& exec, const GemmDesc& d);
// split_k (2..256) blocks of a small FFMA tile or a tensor-core tile through d.workspace, which holds
// gemm_workspace_variant_floats(M, N, split_k) floats; then the reduction kernel.
void gemm_workspace_variant(const Exec& exec, const GemmDesc& d, int tile, int split_k);
size_t gemm_workspace_variant_floats(int M, int N, int split_k);

}  // namespace nt::kernels::cuda::lab
