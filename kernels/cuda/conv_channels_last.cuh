// The channels-last convolution (kernels/cuda/conv_channels_last.cu), internal to kernels/cuda/conv.cu, which plans it
// with TF32 or BF16 (Exec::math) and calls it for the forward and for backward_data at stride 1 (as the forward of dy
// with the filters flipped: docs/conv.md, 'Tensor cores that are fed'), and for backward_weight on the same staged
// operands (weight_gradient).
//
// One forward convolution y = src ⊛ w, src (N, C, H, W) with C a multiple of the format's vector (4 TF32 or 8 BF16
// values: 16 bytes), runs as two kernels:
//   stage     src into channels-last order (N, H, W, C) and the filters into rows of (r, s, c), both rounded to the
//             format;
//   multiply  the implicit GEMM C(M = K, N = N·P·Q) = A(M, Kg = R·S·C) · B(Kg, N) on m16n8k8 (TF32) or m16n8k16 (BF16)
//             MMAs, or on warpgroup MMAs where the device runs sm_90a code (wgmma.cuh; the same sums, the same bits),
//             both operands fed by 16-byte cp.async copies in a 4-stage pipeline, fp32 sums, and the forward's
//             staged epilogue (y in NCHW, bias, BatchNorm statistics: kernels/cuda/conv_epilogue.cuh).
// With the channels innermost, a vector of consecutive Kg indices is as many channels of one tap of one pixel:
// contiguous in both staged operands, inside the image or not as a whole. So a slab element needs one range check
// per vector and a 16-byte copy, where conv.cu's gathers load and check every value on its own.
#pragma once

#include <cstddef>

#include "kernels/cuda/conv_passes.cuh"
#include "kernels/exec.h"
#include "profile/launch_observer.h"

namespace nt::kernels::cuda::channels_last {

// The operands' format: TF32 (fp32 bit patterns rounded as cvt.rna.tf32 rounds, m16n8k8 MMAs; what the planner
// takes with Exec::math TF32), or BF16 (rounded to nearest even, m16n8k16 MMAs; with Exec::math BF16). Both sum in
// fp32, and both need sm_80 code.
enum class Format { tf32, bf16 };

// The tensor-core instruction of the multiply: mma.sync (sm_80 on, fragments loaded into registers: mma_tf32.cuh,
// mma_bf16.cuh) or wgmma (sm_90a, operands read from shared memory: wgmma.cuh). fastest: wgmma where the device runs
// sm_90a code and the tile has a wgmma kernel, else mma.sync; the planner's tiles leave it so, and the kernel lab names
// the one it times. backward_weight has a wgmma kernel in BF16 only, for 64-row tiles (its operands are MN-major).
enum class Mma { fastest, sync, warpgroup };

// A block's tile of C: BM output channels (64 or 32) × BN output pixels (the planner's 128, 96, 64 or 32; the lab's
// also 48), on 2 × (BN / 16) warps in the planner's tiles (4 warps for 32 columns) under mma.sync; under wgmma on
// one warpgroup up to 64 pixels, two above (the `warps` field is then not read).
struct Tile {
  int bm = 64, bn = 64, warps = 4;
  Format format = Format::tf32;
  Mma mma = Mma::fastest;
};

// The forward convolution `a` describes (conv.cu's ConvArgs of a forward, or backward_data's flipped forward): its
// source channels allow 16-byte copies (a multiple of 4 in TF32, of 8 in BF16), and its GEMM has any work.
bool serves(const ConvArgs& a, Format format = Format::tf32);
// The format Exec::math multiplies in (TF32 or BF16; fp32 has no channels-last kernel).
constexpr Format format_of(Math math) { return math == Math::bf16 ? Format::bf16 : Format::tf32; }
// The kernel has no split-K: the planner (conv.cu) takes it only where its tiles give about every SM of a 132-SM H100
// or H200 a block (128 tiles: 12544 pixels make 131 of 96). Fixed, so that plans do not depend on the device (the
// same bits on every GPU).
constexpr int64_t kMinTiles = 128;
// The tile: 64 rows where M exceeds 32; the widest of 128 columns on 16 warps, 96 on 12, 64 on 8 and 32 on 4 that
// still gives kMinTiles tiles (at the cnn's conv2 the widest were the fastest in both passes and both formats, at
// batch 64 and 256: docs/conv.md, 'Wider tiles').
Tile choose_tile(int M, int N);
int64_t tiles(const Tile& tile, int M, int N);
// Floats of workspace the staged operands take: the source channels-last, then the filters (half in BF16).
size_t staging_floats(const ConvArgs& a, Format format = Format::tf32);

// Stages a's operands into `staging` (staging_floats(a, format)): src (a.n, a.c, a.h, a.w) channels-last, and the
// filters w as rows of (r, s, c), both rounded to the format. flipped: w is a backward_data's (a.c, a.k, R, S) and
// row m takes w[c][m][R−1−r][S−1−s] (the forward of dy that is that backward_data); else w is (a.k, a.c, R, S).
// w nullptr: the filters are not staged (backward_weight alone). x, x_cl (a flipped stage only, both or neither): also
// x, the convolution's input (a.n, a.M, a.p, a.q), into x_cl channels-last and rounded, for weight_gradient (x_cl:
// input_floats(a, format) floats, 16-byte aligned). src nullptr: the source is not staged (its layer's neighbour
// wrote it: conv2d's staged input). overlaps_previous (the filters alone: no src, no x): the kernel runs beside the
// one launched just before, which must read and write neither w nor `staging` (launch.cuh).
void stage(const Exec& exec, const ConvArgs& a, Format format, const float* src, const float* w, bool flipped,
           float* staging, const float* x = nullptr, float* x_cl = nullptr, bool overlaps_previous = false);
// The floats of x channels-last in the format, for a flipped stage's args.
size_t input_floats(const ConvArgs& flipped, Format format);
// Where stage() puts the (unflipped) filters in `staging`, after the source: a writer of the staged input that stages
// them itself puts them there (kernels/conv.h, conv2d_filter_stage).
void* staged_filters(const ConvArgs& a, Format format, float* staging);

// ---- backward_weight ------------------------------------------------------------------------------------------
// The GEMM dw(m, (r, s, c)) = Σ_pixel dy(pixel, m) · x(pixel's tap (r, s), c) on k-major tiles: M = K, columns
// R·S·C, the reduction over the N·P·Q output pixels in `split` parts (each a contiguous run of 32-pixel slabs), whose
// partials conv.cu's split-K reduction sums in part order. Without a split each output goes to its place in dw's
// (c, r, s) order; a split's partials keep the (r, s, c) columns (whole rows a block, coalesced) and the reduction
// (ChannelsLastWeightPass, conv_passes.cuh) reorders them. With dbias, its rows are the sums of the staged (rounded)
// dy. conv.cu plans it where backward_data runs channels-last (conv2d_backward stages dy and x in one kernel).
struct WeightPlan {
  Tile tile;
  int split = 1;
};
// Whether a weight kernel has the tile: on mma.sync, its k-major fragment loads are conflict-free (a TF32 tile's
// columns a multiple of 32, a BF16 tile's of 16); on wgmma, a BF16 tile of 64 rows and 32, 64, 96 or 128 columns.
bool serves_weight(const Tile& tile);
// Whether the weight kernel serves f (the forward's args) in the format: x's and dy's channels (f.c, f.M) allow
// 16-byte copies, and the GEMM has any work.
bool serves_weight(const ConvArgs& f, Format format);
// Floats of partials a split takes (f: the forward's args; bias_rows: dbias is written).
size_t weight_partial_floats(const ConvArgs& f, int split, bool bias_rows);
// dw = f.out (f.M, f.c, f.r, f.s) and dbias = f.out_rows (nullable) from dy_cl (f.n·f.p·f.q, f.M) and x_cl (f.n, f.h,
// f.w, f.c), both staged in plan.tile.format; f conv.cu's make_args of the forward shape. plan.split > 1: through
// the partials at f.partial (weight_partial_floats), which the caller's reduction then sums with
// ChannelsLastWeightPass. Returns the partials' stride, M·K + (dbias ? M : 0), the reduction's partial_stride.
int weight_gradient(const Exec& exec, const char* name, const profile::OpCost& cost, ConvArgs f, const float* dy_cl,
                    const float* x_cl, const WeightPlan& plan);

// y = the forward of a from the staged operands (a.out, a.bias, a.stats as conv.cu's forward; no split).
// Launched after its predecessor, as conv.cu's TF32 tiles, unless a.overlaps_previous. source (nullable, in the
// format): the source channels-last where its layer's neighbour wrote it; else staging's.
void multiply(const Exec& exec, const char* name, const profile::OpCost& cost, ConvArgs a, const float* staging,
              const Tile& tile, const void* source = nullptr);

}  // namespace nt::kernels::cuda::channels_last
