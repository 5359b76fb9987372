// What the convolution's kernels share (internal to kernels/cuda/conv.cu and kernels/cuda/conv_direct.cu): ConvArgs,
// the one by-value argument of every kernel, and the three passes as GEMMs C(M,N) = A(M,Kg) · B(Kg,N), each an
// operand gather (where A(m, kg) and B(kg, n) live, nullptr for a zero of the padding) and a store (where C(m, n)
// goes). The mapping of each pass onto its GEMM is tabled at the top of conv.cu; the direct kernels of few taps
// (conv_direct.cu) reuse the forward's gathers and store, so that they sum the same products in the same order.
// Host side: the direct kernels' launchers, for conv.cu's ops to call.
#pragma once

#include <cuda_runtime.h>

#include "kernels/conv.h"
#include "kernels/cuda/fast_divmod.cuh"
#include "kernels/exec.h"
#include "profile/launch_observer.h"

namespace nt::kernels::cuda {

constexpr int kInvalid = -(1 << 30);  // an image coordinate that fails every range check, even doubled

// Everything a kernel needs, by value.
struct ConvArgs {
  int n, c, h, w, k, r, s, stride, pad, p, q;  // the convolution
  int hw, pq, rs, chw, kpq;                    // products used in the indexing
  int M, N, K;                                 // the pass's GEMM (K = Kg)
  int split, slabs_per_split;                  // split-K: S and L (S == 1: no split)
  int partial_stride;                          // floats per split in the workspace
  Math math;                                   // the direct kernels: round the operands of every product
  bool overlaps_previous;                      // runs beside its predecessor (launch.cuh; conv2d_backward)
  const float* a_src;                          // forward: w   backward_data: w   backward_weight: dy
  const float* b_src;                          // forward: x   backward_data: dy  backward_weight: x
  const float* bias;                           // forward, nullable
  float* out;                                  // y, dx or dw
  float* out_rows;                             // backward_weight: dbias, nullable
  float* partial;                              // workspace (split > 1)
  float* stats;                                // forward without split, nullable: ChannelPartials' data
  FastDivmod by_rs, by_s, by_pq, by_q, by_hw, by_w, by_n;
  // The channels-last kernel (conv_channels_last.cu) only: the source's channels, and the width's pad, which
  // differs from the height's in backward_data's flipped convolution of an R×S filter with R != S.
  FastDivmod by_c;
  int pad_w;
};

// 0 <= v < limit, in one unsigned compare (a negative v wraps to a huge unsigned value).
__device__ __forceinline__ bool inside(int v, int limit) {
  return static_cast<unsigned>(v) < static_cast<unsigned>(limit);
}

// An operand element from its a_at / b_at address: 0 where there is none.
__device__ __forceinline__ float load_or_zero(const float* p) { return p ? __ldg(p) : 0.f; }

// ---- the three passes: operand gathers and epilogues -----------------------------------------------------
// k_info(kg): what a thread needs about its Kg index for this slab. column(n): the per-block table entry of
// GEMM column n (int4). a_at / b_at: where one operand element lives, nullptr where it is 0 (outside);
// load_a / load_b read it (the FFMA kernels), the TF32 kernel copies it with cp.async. store: C(m, n) to its place.

struct ForwardPass {  // M = K, N = N·P·Q (pixel), Kg = C·R·S (tap)
  static constexpr bool kRowSums = false;
  static constexpr bool kStaged = true;  // C(m, n) at out[column(n).w + m·plane()] (store_staged)
  __device__ static int plane(const ConvArgs& a) { return a.pq; }
  struct KInfo {
    int kg, off, r, s;  // off = c·H·W + r·W + s
  };
  __device__ static KInfo k_info(const ConvArgs& a, int kg) {
    KInfo ki{.kg = kg, .off = 0, .r = kInvalid, .s = kInvalid};
    if (kg < a.K) {
      int c, rs, r, s;
      a.by_rs.divmod(kg, c, rs);
      a.by_s.divmod(rs, r, s);
      ki.off = c * a.hw + r * a.w + s, ki.r = r, ki.s = s;
    }
    return ki;
  }
  // pixel (img, p, q): {x offset of its (0,0) tap, h0 = p·st − pad, w0 = q·st − pad, y offset of channel 0}
  __device__ static int4 column(const ConvArgs& a, int col) {
    if (col >= a.N) return make_int4(0, kInvalid, kInvalid, 0);
    int img, pq, oh, ow;
    a.by_pq.divmod(col, img, pq);
    a.by_q.divmod(pq, oh, ow);
    const int h0 = oh * a.stride - a.pad, w0 = ow * a.stride - a.pad;
    return make_int4(img * a.chw + h0 * a.w + w0, h0, w0, img * a.kpq + pq);
  }
  __device__ static const float* a_at(const ConvArgs& a, const KInfo& ki, int m) {  // w (K, C·R·S)
    return m < a.M && ki.kg < a.K ? &a.a_src[m * a.K + ki.kg] : nullptr;
  }
  __device__ static const float* b_at(const ConvArgs& a, const KInfo& ki, const int4& col) {  // x
    const int ih = col.y + ki.r, iw = col.z + ki.s;
    return inside(ih, a.h) && inside(iw, a.w) ? &a.b_src[col.x + ki.off] : nullptr;
  }
  __device__ static float finish(const ConvArgs& a, int m, float v) { return a.bias ? v + __ldg(&a.bias[m]) : v; }
  __device__ static void store(const ConvArgs& a, int m, int, const int4& col, float v) {
    a.out[col.w + m * a.pq] = finish(a, m, v);  // y[img, m, pq]
  }
  __device__ static void store_flat(const ConvArgs& a, int m, int n, float v) {
    int img, pq;
    a.by_pq.divmod(n, img, pq);
    a.out[img * a.kpq + m * a.pq + pq] = finish(a, m, v);
  }
};

struct BackwardDataPass {  // M = C, N = N·H·W (input pixel), Kg = K·R·S (k, tap)
  static constexpr bool kRowSums = false;
  static constexpr bool kStaged = false;  // staged: no faster with TF32, slower in fp32 (docs/conv.md)
  struct KInfo {
    int kg, w_off, dy_off, r, s;  // w_off = k·C·R·S + r·S + s (w index of channel 0), dy_off = k·P·Q
  };
  __device__ static KInfo k_info(const ConvArgs& a, int kg) {
    KInfo ki{.kg = kg, .w_off = 0, .dy_off = 0, .r = 0, .s = 0};
    if (kg < a.K) {
      int k, rs;
      a.by_rs.divmod(kg, k, rs);
      a.by_s.divmod(rs, ki.r, ki.s);
      ki.w_off = k * a.c * a.rs + rs, ki.dy_off = k * a.pq;
    }
    return ki;
  }
  // input pixel (img, h, w): {dy offset of image img, h + pad, w + pad, dx offset of channel 0}
  __device__ static int4 column(const ConvArgs& a, int col) {
    if (col >= a.N) return make_int4(0, kInvalid, kInvalid, 0);
    int img, hw, ih, iw;
    a.by_hw.divmod(col, img, hw);
    a.by_w.divmod(hw, ih, iw);
    return make_int4(img * a.kpq, ih + a.pad, iw + a.pad, img * a.chw + hw);
  }
  __device__ static const float* a_at(const ConvArgs& a, const KInfo& ki, int m) {  // w[k, c = m, r, s]
    return m < a.M && ki.kg < a.K ? &a.a_src[ki.w_off + m * a.rs] : nullptr;
  }
  __device__ static const float* b_at(const ConvArgs& a, const KInfo& ki, const int4& col) {  // dy
    int oh = col.y - ki.r, ow = col.z - ki.s;  // = p·stride, q·stride if the tap lands on an output
    if (a.stride != 1) {
      if (oh < 0 || ow < 0 || oh % a.stride != 0 || ow % a.stride != 0) return nullptr;
      oh /= a.stride, ow /= a.stride;
    }
    const bool lands = ki.kg < a.K && inside(oh, a.p) && inside(ow, a.q);
    return lands ? &a.b_src[col.x + ki.dy_off + oh * a.q + ow] : nullptr;
  }
  __device__ static void store(const ConvArgs& a, int m, int, const int4& col, float v) {
    a.out[col.w + m * a.hw] = v;  // dx[img, c = m, h, w]
  }
  __device__ static void store_flat(const ConvArgs& a, int m, int n, float v) {
    int img, hw;
    a.by_hw.divmod(n, img, hw);
    a.out[img * a.chw + m * a.hw + hw] = v;
  }
};

struct BackwardWeightPass {               // M = K, N = C·R·S (tap), Kg = N·P·Q (output pixel)
  static constexpr bool kRowSums = true;  // dbias = row sums of A = dy
  static constexpr bool kStaged = false;  // dw's rows are contiguous already
  struct KInfo {
    int kg, dy_off, x_off, h0, w0;  // dy_off = img·K·P·Q + pq; x_off = img·C·H·W + h0·W + w0
  };
  __device__ static KInfo k_info(const ConvArgs& a, int kg) {
    KInfo ki{.kg = kg, .dy_off = 0, .x_off = 0, .h0 = kInvalid, .w0 = kInvalid};
    if (kg < a.K) {
      int img, pq, oh, ow;
      a.by_pq.divmod(kg, img, pq);
      a.by_q.divmod(pq, oh, ow);
      ki.h0 = oh * a.stride - a.pad, ki.w0 = ow * a.stride - a.pad;
      ki.dy_off = img * a.kpq + pq, ki.x_off = img * a.chw + ki.h0 * a.w + ki.w0;
    }
    return ki;
  }
  // tap (c, r, s): {c·H·W + r·W + s, r, s, unused}
  __device__ static int4 column(const ConvArgs& a, int col) {
    if (col >= a.N) return make_int4(0, kInvalid, kInvalid, 0);
    int c, rs, r, s;
    a.by_rs.divmod(col, c, rs);
    a.by_s.divmod(rs, r, s);
    return make_int4(c * a.hw + r * a.w + s, r, s, 0);
  }
  __device__ static const float* a_at(const ConvArgs& a, const KInfo& ki, int m) {  // dy[img, k = m, pq]
    return m < a.M && ki.kg < a.K ? &a.a_src[ki.dy_off + m * a.pq] : nullptr;
  }
  __device__ static const float* b_at(const ConvArgs& a, const KInfo& ki, const int4& col) {  // x
    const int ih = ki.h0 + col.y, iw = ki.w0 + col.z;
    return inside(ih, a.h) && inside(iw, a.w) ? &a.b_src[ki.x_off + col.x] : nullptr;
  }
  __device__ static void store(const ConvArgs& a, int m, int n, const int4&, float v) { a.out[m * a.N + n] = v; }
  __device__ static void store_flat(const ConvArgs& a, int m, int n, float v) { a.out[m * a.N + n] = v; }
};

// The channels-last backward_weight's split (conv_channels_last.cu): its partials keep the kernel's columns in
// (r, s, c) order, so that a block stores whole rows of its tile (a column pair a lane); the reduction puts C(m, n =
// (r·S + s)·C + c) at dw's (c, r, s) place.
struct ChannelsLastWeightPass {
  __device__ static void store_flat(const ConvArgs& a, int m, int n, float v) {
    int tap, c;
    a.by_c.divmod(n, tap, c);
    a.out[m * a.N + c * a.rs + tap] = v;
  }
};

// ---- the direct kernels of few taps (conv_direct.cu) -----------------------------------------------------------

// Few taps and a small filter bank: the forward and backward_weight run the direct kernels, not the GEMM.
bool direct_taps(const Conv2dShape& s);
// The partials conv_direct_backward_weight_kernel writes: one per block column of its grid.
int direct_weight_blocks(const Conv2dShape& s);
// y = the forward of a: the forward GEMM's args (M = K, N = N·P·Q, K = C·R·S), a_src = w, b_src = x.
void launch_direct_forward(const Exec& exec, const profile::OpCost& cost, const ConvArgs& a);
// direct_weight_blocks(s) partials of backward_weight (dw (K, C·R·S), then dbias (K)) into d.partial, stride
// d.partial_stride; d: the forward GEMM's args with a_src = dy, b_src = x. conv_split_reduce_kernel adds them.
void launch_direct_backward_weight(const Exec& exec, const profile::OpCost& cost, const Conv2dShape& s,
                                   const ConvArgs& d);

}  // namespace nt::kernels::cuda
