// The GEMM kernel lab's entry (kernels/cuda/gemm.cu), for bench/bench_gemm.cu and the CUDA tests: the
// same op as kernels::gemm with the tile configuration forced, so every configuration can be checked
// and timed. Not part of the op API: the engine calls kernels::gemm, which picks the configuration.
#pragma once

#include "kernels/gemm.h"

namespace nt::kernels::cuda::lab {

// 128×128, 64×64, 32×32 block tiles; small_grouped: 32×32 with 64-deep slabs over 4 k-groups (256 threads)
enum GemmTile : int { large = 0, medium = 1, small = 2, small_grouped = 3 };

// split_k: 1, or 2/4/8 (a thread-block cluster, sm_90) with either small tile.
void gemm_variant(const Exec& exec, const GemmDesc& d, int tile, int split_k);
// split_k (2..256) blocks of a small tile through d.workspace, which holds
// gemm_workspace_variant_floats(M, N, split_k) floats; then the reduction kernel.
void gemm_workspace_variant(const Exec& exec, const GemmDesc& d, int tile, int split_k);
size_t gemm_workspace_variant_floats(int M, int N, int split_k);

}  // namespace nt::kernels::cuda::lab
