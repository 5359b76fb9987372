// The conv kernel lab's entry (kernels/cuda/conv.cu), for bench/bench_conv.cu: one pass of the implicit-GEMM
// convolution with the tile configuration and the split-K factor forced, so every configuration can be timed
// at the cnn's shapes. Not part of the op API: the engine calls kernels::conv2d_*, which pick the plan.
#pragma once

#include <cstddef>

#include "kernels/conv.h"

namespace nt::kernels::cuda::lab {

enum ConvPass : int { forward = 0, backward_data = 1, backward_weight = 2 };
// Block tiles (M × N, micro-tile per thread, k-groups): medium 64×64 (8×4), narrow 32×64 (4×4), narrow_grouped
// (×2), small 32×32 (4×4), small_grouped (×4), tall_grouped 64×32 (8×4, ×3), wide_grouped 32×64 (4×8, ×3);
// TF32 tensor cores (4 warps, BK 32): mma_64x64, mma_64x32, mma_32x64, mma_32x32; the halo tile (stride 1,
// forward and backward_data, split ignored; kernels/cuda/conv_halo.cuh) with 64 or 32 rows: halo_64, halo_32; the
// channels-last TF32 kernels (forward, backward_data at stride 1, split ignored; backward_weight with `split` parts of
// the pixels; kernels/cuda/conv_channels_last.cu) with their four tiles on 4 warps, channels_last_64x64 ...
// channels_last_32x32, two on 8 warps, channels_last_64x64_8w and channels_last_32x64_8w, and four whose 96 or 48
// pixels give 12544 pixels (the cnn's conv2 at batch 64) one block an SM or two, channels_last_64x96_12w,
// channels_last_64x48_6w, channels_last_32x96_12w, channels_last_32x48_6w, and wider or on fewer warps,
// channels_last_64x128_16w, channels_last_32x128_16w, channels_last_64x96_8w (they need the pass's source channels a
// multiple of 4, and backward_weight both x's and dy's); the same kernel with BF16 operands (rounded to nearest even,
// fp32 sums; forward and backward_data; source channels a multiple of 8): channels_last_bf16_64x64_8w,
// channels_last_bf16_32x64_8w, channels_last_bf16_64x32 and the seven above.
// conv.cu's plan picks among the same tiles (its Tile is this enum), so the lab and the engine name each one once.
enum ConvTile : int {
  medium,
  narrow,
  narrow_grouped,
  small,
  small_grouped,
  tall_grouped,
  wide_grouped,  // fp32 FFMA
  mma_64x64,
  mma_64x32,
  mma_32x64,
  mma_32x32,  // TF32 or BF16 MMA
  halo_64,
  halo_32,  // TF32, stride 1: kernel lab only (conv_halo.cuh)
  // The channels-last tiles, last (conv.cu's is_channels_last), TF32 then BF16:
  channels_last_64x64,
  channels_last_64x32,
  channels_last_32x64,
  channels_last_32x32,
  channels_last_64x64_8w,
  channels_last_32x64_8w,
  channels_last_64x96_12w,
  channels_last_64x48_6w,
  channels_last_32x96_12w,
  channels_last_32x48_6w,
  channels_last_64x128_16w,
  channels_last_32x128_16w,
  channels_last_64x96_8w,
  channels_last_bf16_64x64_8w,
  channels_last_bf16_32x64_8w,
  channels_last_bf16_64x32,
  channels_last_bf16_64x96_12w,
  channels_last_bf16_64x48_6w,
  channels_last_bf16_32x96_12w,
  channels_last_bf16_32x48_6w,
  channels_last_bf16_64x128_16w,
  channels_last_bf16_32x128_16w,
  channels_last_bf16_64x96_8w,
  // The same forward and backward_data on warpgroup MMAs (wgmma, sm_90a code only; one warpgroup up to 64 pixels, two
  // above), TF32 then BF16:
  channels_last_wg_64x64,
  channels_last_wg_64x96,
  channels_last_wg_64x128,
  channels_last_wg_32x64,
  channels_last_wg_32x96,
  channels_last_wg_32x128,
  channels_last_bf16_wg_64x64,
  channels_last_bf16_wg_64x96,
  channels_last_bf16_wg_64x128,
  channels_last_bf16_wg_32x64,
  channels_last_bf16_wg_32x96,
  channels_last_bf16_wg_32x128,
  conv_tile_count  // not a tile: how many there are
};

// The pass reads and writes the fields its op does (kernels/conv.h, Conv2dArgs), without the bias: forward x, w -> y;
// backward_data dy, w -> dx; backward_weight x, dy -> dw (bias, dbias and statistics are ignored).
// a.workspace: conv2d_variant_workspace_floats(pass, a.shape, split) floats (nullptr when 0).
void conv2d_variant(const Exec& exec, int pass, const Conv2dArgs<float>& a, int tile, int split);
size_t conv2d_variant_workspace_floats(int pass, const Conv2dShape& s, int split);

}  // namespace nt::kernels::cuda::lab
