// A stride-1 convolution pass on TF32 tensor cores from a halo tile in shared memory: the forward and
// backward_data where the padded image row fits the tile (halo_plan). A kernel-lab variant (kernels/conv_lab.h:
// halo_64, halo_32), not chosen by the engine's plan: at the cnn's shapes it is slower than the implicit GEMM
// (docs/conv.md, 'Tried: a halo tile (kernel lab only)', has bench_conv's numbers, where the time goes and what
// would change that).
//
// Both passes are one stride-1 convolution of a source with a filter bank A:
//
//   dst[n, m, p, q] = Σ_{c,r,s} src[n, c, p − pad_h + r, q − pad_w + s] · A[m, c, r, s]   (zero outside src)
//
//   pass             src (Cs planes)   A[m, c, r, s]            pad_h, pad_w            dst (M planes)
//   forward          x  (C)            w[m, c, r, s]            pad, pad                y  (K)
//   backward_data    dy (K)            w[c, m, R−1−r, S−1−s]    R−1−pad, S−1−pad        dx (C)
//
// (the data gradient of a stride-1 convolution is the convolution of dy with the filters transposed and
// turned by 180°; a pad above R − 1 makes the source pad negative, which crops instead). No bias: the lab times
// the passes without one.
//
// The idea: the implicit-GEMM kernel gathers every operand element with its own address and range checks, about
// 9 times per source value (once per tap). Here a block stages the source rows its outputs need once, zero
// padded, and forms the 9 shifted views by address arithmetic alone. The price: every block stages its rows of
// the filter bank too (BM × C·R·S values), which at batch 64 is as much as the source rows.
//
// Block (x = image·bands + band, y = row block): output rows [p0, p0 + PB) of one image and output channels
// [m0, m0 + BM). The source channels go in chunks of Cc (a multiple of 8; channels past Cs are zeros), each
// chunk copied into shared memory (cp.async) and then rounded to TF32 in place (cvt.rna, as the GEMM kernels
// round their fragments):
//
//   planes[c][L]   source rows p0 − pad_h .. p0 − pad_h + PB + R − 2 of channel c, each widened to the padded
//                  width Wp = Ws + 2·pad_w (zeros outside the image), back to back; then zeros up to L.
//                  L >= BN + (R−1)·Wp + S − 1 (the furthest tap of the tile's last column) and L ≡ 8 (mod 32).
//   As[m][kLd]     A's rows for the chunk, column k' = c·RS + r·S + s: the filters' own order, so the forward
//                  copies whole rows of w (coalesced); kLd = Cc·RS + 4 ≡ 4 (mod 8).
//
// The tile is a BM × BN GEMM over the band's padded grid, column n = pr·Wp + q (pr < PB):
//
//   C(m, n) = Σ_{c, r, s} As[m][c·RS + r·S + s] · planes[c][n + r·Wp + s]
//
// so shifting by a tap is an add, and no index is decoded in the loop. Columns q >= Wo (S − 1 per row, 2 of 16
// in the cnn's conv2) and rows pr >= PB are computed and dropped. MMA k-step: 8 channels 8cb .. 8cb+7 at one
// tap; lane (g, t) reads A at column (8cb + t)·RS + tap (+ 4·RS for k = t + 4) of rows g, g + 8, and B at
// planes[8cb + t] (+ 4) column n + g. Banks: A 4g·(kLd/4) + t·RS + const, distinct when RS is odd (kLd/4 is
// odd); B t·L + g + const with L ≡ 8 (mod 32): distinct. The sum of each output runs k-step by k-step (tap
// outer, channels inner, chunk by chunk): one fixed order, bit-reproducible.
//
// Warps: 2 × 2, each a (BM/2) × (BN/2) piece. Shared memory is sized per launch (halo_plan), within
// kSharedBudget whatever the device, so the plan — and the bits — are the same on every GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/fast_divmod.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma_tf32.cuh"

namespace nt::kernels::cuda::halo {

constexpr int kThreads = 128;                // 2 × 2 warps
constexpr int kTileColumns = 112;            // BN: 7 output rows of the cnn's conv2 (Wp = 16)
constexpr size_t kSharedBudget = 96 * 1024;  // within every sm_80+ GPU's opt-in limit (99 KB on sm_86 / sm_89)

// The pass as the kernel sees it (by value).
struct Args {
  int n, cs, hs, ws;  // source: n images of cs planes hs × ws
  int m, ho, wo;      // destination: m planes ho × wo
  int r, s, rs;       // filter taps
  int pad_h, pad_w;   // source padding (negative: cropping)
  bool flipped;       // backward_data: A[m, c, r, s] = w[c, m, R−1−r, S−1−s]
  // the plan (halo_plan)
  int wp, rows, bands, chunk, plane, a_ld;  // padded width, output rows per band (PB), bands per image, Cc, L, kLd
  FastDivmod by_wp, by_plane, by_bands, by_chunk_taps, by_block_taps, by_rs;
  const float* src;
  const float* w;
  float* dst;
};

__device__ __forceinline__ float tf32_value(float v) { return __uint_as_float(mma_tf32::to_tf32(v)); }

// One chunk of source channels [c0, c0 + chunk) into planes and As, every element an asynchronous copy: a thread
// issues all of its share before waiting once (a loop of loads and stores waited for each load in turn).
template <int BM>
__device__ __forceinline__ void stage_chunk(const Args& a, float* planes, float* As, int img, int p0, int m0, int c0) {
  // planes: Cc × L, source row p0 − pad_h + i, column j − pad_w at position i·Wp + j
  const int plane_total = a.chunk * a.plane, rows_staged = a.rows + a.r - 1;
  const float* src_img = a.src + static_cast<size_t>(img) * a.cs * a.hs * a.ws;
  for (int idx = threadIdx.x; idx < plane_total; idx += kThreads) {
    int c, pos, i, j;
    a.by_plane.divmod(idx, c, pos);
    a.by_wp.divmod(pos, i, j);
    const int y = p0 - a.pad_h + i, x = j - a.pad_w;
    c += c0;
    const bool inside = c < a.cs && i < rows_staged && static_cast<unsigned>(y) < unsigned(a.hs) &&
                        static_cast<unsigned>(x) < unsigned(a.ws);
    cp_async::copy4_or_zero(&planes[idx], inside ? &src_img[(c * a.hs + y) * a.ws + x] : a.src, inside);
  }
  // As: BM × (Cc·RS) of the chunk
  const int a_total = BM * a.chunk * a.rs;
  for (int idx = threadIdx.x; idx < a_total; idx += kThreads) {
    if (!a.flipped) {  // source order (m, k'): w[m0 + m][c0·RS + k'], rows of w copied as they lie
      int m, k;
      a.by_chunk_taps.divmod(idx, m, k);
      const bool valid = m0 + m < a.m && c0 * a.rs + k < a.cs * a.rs;
      cp_async::copy4_or_zero(&As[m * a.a_ld + k], valid ? &a.w[(m0 + m) * a.cs * a.rs + c0 * a.rs + k] : a.w, valid);
    } else {  // source order (c, m, tap): w[c0 + c][m0 + m][tap], stored at the turned tap RS − 1 − tap
      int c, rest, m, tap;
      a.by_block_taps.divmod(idx, c, rest);
      a.by_rs.divmod(rest, m, tap);
      const bool valid = m0 + m < a.m && c0 + c < a.cs;
      cp_async::copy4_or_zero(&As[m * a.a_ld + c * a.rs + (a.rs - 1 - tap)],
                              valid ? &a.w[((c0 + c) * a.m + m0) * a.rs + rest] : a.w, valid);
    }
  }
  cp_async::wait_all();
  __syncthreads();
  // Round the whole chunk to TF32 in place (As's pad columns too: never read), four values at a time.
  float4* all = reinterpret_cast<float4*>(As);
  const int quads = (BM * a.a_ld + plane_total) / 4;
  for (int q = threadIdx.x; q < quads; q += kThreads) {
    float4 v = all[q];
    v.x = tf32_value(v.x), v.y = tf32_value(v.y), v.z = tf32_value(v.z), v.w = tf32_value(v.w);
    all[q] = v;
  }
}

// grid (n·bands, ceil(M / BM)), 128 threads, dynamic shared memory: BM·kLd + Cc·L floats.
template <int BM>
__global__ void __launch_bounds__(kThreads) conv_halo_kernel(Args a, StampRing stamps) {
  constexpr int BN = kTileColumns, WM = BM / 2, WN = BN / 2, kTilesM = WM / 16, kTilesN = WN / 8;
  static_assert(WM % 16 == 0 && WN % 8 == 0, "a warp's piece is a whole number of 16x8 MMA tiles");
  begin_dependent_kernel(stamps);
  extern __shared__ __align__(16) float smem[];
  float* As = smem;                    // BM × kLd
  float* planes = smem + BM * a.a_ld;  // Cc × L

  int img, band;
  a.by_bands.divmod(static_cast<int>(blockIdx.x), img, band);
  const int p0 = band * a.rows, m0 = static_cast<int>(blockIdx.y) * BM;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const int wm = (warp / 2) * WM, wn = (warp % 2) * WN;

  float acc[kTilesM][kTilesN][4];
  mma_tf32::zero(acc);

  // Per lane: A at rows wm + 16i + g (+8), column (8cb + t)·RS + tap (+4·RS); B at planes (8cb + t) (+4),
  // column wn + 8j + g + tap offset.
  const float* a_lane = As + (wm + g) * a.a_ld + t * a.rs;
  const float* b_lane = planes + t * a.plane + wn + g;
  const int a_half = 4 * a.rs, b_half = 4 * a.plane;  // k = t + 4: channel 8cb + t + 4
  for (int c0 = 0; c0 < a.cs; c0 += a.chunk) {
    if (c0 > 0) __syncthreads();  // every warp is done with the previous chunk
    stage_chunk<BM>(a, planes, As, img, p0, m0, c0);
    __syncthreads();
    for (int r = 0; r < a.r; ++r)
      for (int s = 0; s < a.s; ++s) {
        const float* a_tap = a_lane + r * a.s + s;
        const float* b_tap = b_lane + r * a.wp + s;
#pragma unroll 2
        for (int cb = 0; cb < a.chunk; cb += 8) {
          const float* ap = a_tap + cb * a.rs;
          const float* bp = b_tap + cb * a.plane;
          uint32_t af[kTilesM][4], bf[kTilesN][2];
#pragma unroll
          for (int i = 0; i < kTilesM; ++i) {
            const float* p = ap + 16 * i * a.a_ld;
            af[i][0] = __float_as_uint(p[0]), af[i][1] = __float_as_uint(p[8 * a.a_ld]);
            af[i][2] = __float_as_uint(p[a_half]), af[i][3] = __float_as_uint(p[8 * a.a_ld + a_half]);
          }
#pragma unroll
          for (int j = 0; j < kTilesN; ++j)
            bf[j][0] = __float_as_uint(bp[8 * j]), bf[j][1] = __float_as_uint(bp[8 * j + b_half]);
#pragma unroll
          for (int i = 0; i < kTilesM; ++i)
#pragma unroll
            for (int j = 0; j < kTilesN; ++j) mma_tf32::mma_16x8x8(acc[i][j], af[i], bf[j]);
        }
      }
  }

  // Epilogue: column n = pr·Wp + q of the band is output (p0 + pr, q) when pr < PB, q < Wo and p0 + pr < Ho.
  float* dst_img = a.dst + static_cast<size_t>(img) * a.m * a.ho * a.wo;
#pragma unroll
  for (int j = 0; j < kTilesN; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int pr, q;
      a.by_wp.divmod(wn + 8 * j + 2 * t + half, pr, q);
      const int p = p0 + pr;
      if (pr >= a.rows || q >= a.wo || p >= a.ho) continue;
#pragma unroll
      for (int i = 0; i < kTilesM; ++i)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const int m = m0 + wm + 16 * i + g + 8 * hi;
          if (m >= a.m) continue;
          dst_img[(m * a.ho + p) * a.wo + q] = acc[i][j][2 * hi + half];
        }
    }
}

// The plan of a pass, or !fits where the halo kernel does not serve it (the implicit GEMM does).
struct Plan {
  bool fits = false;
  int bm = 64;
  Args args{};  // the geometry filled in
  size_t smem_bytes = 0;
};

// a: the pass (n, cs, hs, ws, m, ho, wo, r, s, pad_h, pad_w, flipped) without the plan's fields. bm: the row block (32
// or 64), 0 to choose: 64 where M exceeds 32.
inline Plan halo_plan(Args a, int bm = 0) {
  Plan plan;
  a.wp = a.ws + 2 * a.pad_w;
  if (a.n <= 0 || a.m <= 0 || a.cs <= 0 || a.ho <= 0 || a.wo <= 0 || a.wp < a.s || a.wp > kTileColumns) return plan;
  plan.bm = bm ? bm : a.m > 32 ? 64 : 32;
  a.rs = a.r * a.s;
  const int most_rows = kTileColumns / a.wp;
  a.bands = div_up(a.ho, most_rows);
  a.rows = div_up(a.ho, a.bands);
  // L: past the furthest tap of the last column, ≡ 8 (mod 32)
  const int need = kTileColumns + (a.r - 1) * a.wp + a.s - 1;
  a.plane = need <= 8 ? 8 : div_up(need - 8, 32) * 32 + 8;
  auto bytes = [&](int chunk) { return 4 * (size_t(plan.bm) * (chunk * a.rs + 4) + size_t(chunk) * a.plane); };
  const int channels = div_up(a.cs, 8) * 8;
  int most = channels;
  while (most >= 8 && bytes(most) > kSharedBudget) most -= 8;
  if (most < 8) return plan;
  const int chunks = div_up(channels, most);
  a.chunk = div_up(div_up(channels, chunks), 8) * 8;
  a.a_ld = a.chunk * a.rs + 4;
  a.by_wp = FastDivmod(a.wp), a.by_plane = FastDivmod(a.plane), a.by_bands = FastDivmod(a.bands);
  a.by_chunk_taps = FastDivmod(a.chunk * a.rs), a.by_block_taps = FastDivmod(plan.bm * a.rs),
  a.by_rs = FastDivmod(a.rs);
  plan.fits = true;
  plan.args = a;
  plan.smem_bytes = bytes(a.chunk);
  return plan;
}

inline dim3 halo_grid(const Plan& plan) {
  return dim3(static_cast<unsigned>(plan.args.n * plan.args.bands),
              static_cast<unsigned>(div_up(plan.args.m, plan.bm)));
}

}  // namespace nt::kernels::cuda::halo
