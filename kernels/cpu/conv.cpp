// 2-D convolution on the CPU: the reference twin of kernels/cuda/conv.cu (contract in kernels/conv.h).
//
//   forward:         y[n,k,p,q]  = Σ_{c,r,s} x[n,c,p·st−pad+r,q·st−pad+s] · w[k,c,r,s]  (+ bias[k])
//   backward_data:   dx[n,c,h,w] = Σ_{k,r,s} dy[n,k,p,q] · w[k,c,r,s]   over taps landing on an output (p,q)
//   backward_weight: dw[k,c,r,s] = Σ_{n,p,q} dy[n,k,p,q] · x[n,c,p·st−pad+r,q·st−pad+s];  dbias[k] = Σ dy[n,k,·,·]
// Layouts: x, dx (N,C,H,W); w, dw (K,C,R,S); y, dy (N,K,P,Q); bias, dbias (K); all written with `=`.
//
// Direct loops, no im2col buffer (an op allocates nothing): the innermost loop always runs along an output
// or input row (q, contiguous for stride 1) so it vectorizes, and four channels share each loaded row
// (register blocking: 4 FMAs per load). Padding is handled by clipping each row's q range to the taps that
// land inside the image, so no branch sits in the inner loop; a clipped tap contributes nothing, exactly as
// the zero it stands for (up to the sign of a zero sum and a NaN/inf weight times a padded zero).
//
// Determinism: a parallel task owns whole output planes (forward: (n, 4 k's); backward_data: (n, 4 c's);
// backward_weight: (4 k's, c)) and each output element's sum runs in one fixed order inside its task:
//   y:  taps (c, r, s) ascending, then + bias;
//   dx: taps (k, r, s) ascending (for a fixed tap at most one output (p,q) lands on a given (h,w));
//   dw, dbias: per chunk of kQChunk output columns, lane j = q − q0 sums over (n, p) ascending; the lanes
//       are then added j ascending and the chunks q0 ascending.
// So the results do not depend on the thread count. The f64 ops are the same templates in double.
// Exec::math TF32 or BF16 (the GPU's tensor-core formats): the same loops on rounded copies of x, w and dy
// (kernels/cpu/rounded_operands.h). Under BF16 dbias then sums the rounded dy, as the GPU's does; under TF32 the
// unrounded one (kernels/operand.h says why).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/conv.h"
#include "kernels/cpu/op_scope.h"
#include "kernels/cpu/rounded_operands.h"
#include "kernels/cpu/thread_pool.h"

namespace nt::kernels::cpu {

namespace {

constexpr int kBlock = 4;    // channels computed together (register blocking)
constexpr int kQChunk = 64;  // output columns per lane accumulator (stack arrays, no allocation)

double conv_flops(const Conv2dShape& s) { return 2.0 * s.n * s.k * s.p() * s.q() * double(s.c) * s.r * s.s; }

// The output columns q in [q0, q1) whose input column q·st − pad + tap lies in [0, width): [*lo, *hi).
void clip_columns(int q0, int q1, int stride, int pad, int tap, int width, int* lo, int* hi) {
  int first = 0, end = 0;  // smallest q with column >= 0; one past the largest with column < width
  if (stride == 1) {       // the common case, without divisions (this runs once per tap and row)
    first = std::max(pad - tap, 0);
    end = std::max(width + pad - tap, 0);
  } else {
    first = pad - tap <= 0 ? 0 : (pad - tap + stride - 1) / stride;
    const int last_num = width - 1 + pad - tap;  // q·st <= this
    end = last_num < 0 ? 0 : last_num / stride + 1;
  }
  *lo = std::max(q0, first);
  *hi = std::min(q1, end);
  if (*hi < *lo) *hi = *lo;
}

// ---- forward ------------------------------------------------------------------------------------------

// One task: image n, output channels k0 .. k0+kBlock-1 (lanes past K repeat channel K-1 and are not stored).
template <class T>
void forward_task(const Conv2dShape& s, const T* x, const T* w, const T* bias, T* y, int n, int k0) {
  const int P = s.p(), Q = s.q(), H = s.h, W = s.w, C = s.c, R = s.r, S = s.s, st = s.stride, pad = s.pad;
  const int kb = std::min(kBlock, s.k - k0);
  const T* wk[kBlock];  // w[k] as (C,R,S)
  for (int l = 0; l < kBlock; ++l) wk[l] = w + static_cast<size_t>(k0 + std::min(l, kb - 1)) * C * R * S;
  const T* xn = x + static_cast<size_t>(n) * C * H * W;  // x[n] (C,H,W)
  for (int p = 0; p < P; ++p) {
    for (int q0 = 0; q0 < Q; q0 += kQChunk) {
      const int q1 = std::min(Q, q0 + kQChunk);
      T acc[kBlock][kQChunk] = {};
      for (int c = 0; c < C; ++c) {
        for (int r = 0; r < R; ++r) {
          const int h = p * st - pad + r;
          if (h < 0 || h >= H) continue;
          const T* xrow = xn + (static_cast<size_t>(c) * H + h) * W;  // x[n,c,h,:]
          for (int t = 0; t < S; ++t) {
            int lo, hi;
            clip_columns(q0, q1, st, pad, t, W, &lo, &hi);
            const size_t widx = (static_cast<size_t>(c) * R + r) * S + t;
            const T w0 = wk[0][widx], w1 = wk[1][widx], w2 = wk[2][widx], w3 = wk[3][widx];
            const ptrdiff_t off = t - pad;  // x[n,c,h,q·st−pad+t] = xrow[q·st + off]
            if (st == 1) {
              for (int q = lo; q < hi; ++q) {
                const T v = xrow[q + off];
                acc[0][q - q0] += w0 * v, acc[1][q - q0] += w1 * v, acc[2][q - q0] += w2 * v, acc[3][q - q0] += w3 * v;
              }
            } else {
              for (int q = lo; q < hi; ++q) {
                const T v = xrow[static_cast<ptrdiff_t>(q) * st + off];
                acc[0][q - q0] += w0 * v, acc[1][q - q0] += w1 * v, acc[2][q - q0] += w2 * v, acc[3][q - q0] += w3 * v;
              }
            }
          }
        }
      }
      for (int l = 0; l < kb; ++l) {
        const T b = bias ? bias[k0 + l] : T(0);
        T* yrow = y + ((static_cast<size_t>(n) * s.k + k0 + l) * P + p) * Q;  // y[n,k,p,:]
        for (int q = q0; q < q1; ++q) yrow[q] = bias ? acc[l][q - q0] + b : acc[l][q - q0];
      }
    }
  }
}

template <class T>
void forward_impl(const Exec& exec, const Conv2dShape& s, const T* x, const T* w, const T* bias, T* y) {
  const int P = s.p(), Q = s.q();
  if (s.n == 0 || s.k == 0 || P == 0 || Q == 0) return;
  const double bytes =
      sizeof(T) * (double(s.n) * s.c * s.h * s.w + double(s.k) * s.c * s.r * s.s + double(s.n) * s.k * P * Q);
  OpScope scope(exec, "conv2d_forward", profile::OpCost{bytes, conv_flops(s)});
  const int kblocks = (s.k + kBlock - 1) / kBlock;
  parallel_for(exec.pool, int64_t(s.n) * kblocks, [&](int64_t t) {
    forward_task(s, x, w, bias, y, static_cast<int>(t / kblocks), static_cast<int>(t % kblocks) * kBlock);
  });
}

// ---- backward data ------------------------------------------------------------------------------------

// r_l[i] += w[l] · src[i] for i < count, l < 4: four distinct dx rows (restrict lets it vectorize).
template <class T>
void scatter_row4(int count, const T* __restrict__ src, const T (&w)[kBlock], T* __restrict__ r0, T* __restrict__ r1,
                  T* __restrict__ r2, T* __restrict__ r3) {
  const T w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
  for (int q = 0; q < count; ++q) {
    const T v = src[q];
    r0[q] += w0 * v, r1[q] += w1 * v, r2[q] += w2 * v, r3[q] += w3 * v;
  }
}

// One task: image n, input channels c0 .. c0+kBlock-1: scatter every output row back through every tap.
template <class T>
void backward_data_task(const Conv2dShape& s, const T* dy, const T* w, T* dx, int n, int c0) {
  const int P = s.p(), Q = s.q(), H = s.h, W = s.w, C = s.c, K = s.k, R = s.r, S = s.s, st = s.stride, pad = s.pad;
  const int cb = std::min(kBlock, C - c0);
  T* dxc[kBlock];  // dx[n,c] (H,W) planes; lanes past C alias the last one and receive no stores
  for (int l = 0; l < kBlock; ++l) dxc[l] = dx + (static_cast<size_t>(n) * C + c0 + std::min(l, cb - 1)) * H * W;
  for (int l = 0; l < cb; ++l) std::fill(dxc[l], dxc[l] + static_cast<size_t>(H) * W, T(0));
  for (int k = 0; k < K; ++k) {
    const T* dyk = dy + (static_cast<size_t>(n) * K + k) * P * Q;  // dy[n,k] (P,Q)
    for (int r = 0; r < R; ++r) {
      for (int t = 0; t < S; ++t) {
        T wv[kBlock];
        for (int l = 0; l < kBlock; ++l)
          wv[l] = l < cb ? w[((static_cast<size_t>(k) * C + c0 + l) * R + r) * S + t] : T(0);
        int lo, hi;
        clip_columns(0, Q, st, pad, t, W, &lo, &hi);
        for (int p = 0; p < P; ++p) {
          const int h = p * st - pad + r;
          if (h < 0 || h >= H) continue;
          const T* dyrow = dyk + static_cast<size_t>(p) * Q;
          const ptrdiff_t base = static_cast<ptrdiff_t>(h) * W + t - pad;  // dx[n,c,h,q·st−pad+t] = row[base + q·st]
          T* rows[kBlock];
          for (int l = 0; l < kBlock; ++l) rows[l] = dxc[l];
          if (cb < kBlock) {  // tail block: one lane at a time (lanes past C alias the last plane)
            for (int l = 0; l < cb; ++l)
              for (int q = lo; q < hi; ++q) rows[l][base + static_cast<ptrdiff_t>(q) * st] += wv[l] * dyrow[q];
            continue;
          }
          if (st == 1) {
            const ptrdiff_t o = base + lo;  // >= 0: lo is the first output column whose tap is inside
            scatter_row4(hi - lo, dyrow + lo, wv, rows[0] + o, rows[1] + o, rows[2] + o, rows[3] + o);
          } else {
            for (int q = lo; q < hi; ++q) {
              const T v = dyrow[q];
              const ptrdiff_t o = base + static_cast<ptrdiff_t>(q) * st;
              rows[0][o] += wv[0] * v, rows[1][o] += wv[1] * v, rows[2][o] += wv[2] * v, rows[3][o] += wv[3] * v;
            }
          }
        }
      }
    }
  }
}

template <class T>
void backward_data_impl(const Exec& exec, const Conv2dShape& s, const T* dy, const T* w, T* dx) {
  if (s.n == 0 || s.c == 0 || s.h == 0 || s.w == 0) return;
  const int P = s.p(), Q = s.q();
  const double bytes =
      sizeof(T) * (double(s.n) * s.c * s.h * s.w + double(s.k) * s.c * s.r * s.s + double(s.n) * s.k * P * Q);
  OpScope scope(exec, "conv2d_backward_data", profile::OpCost{bytes, conv_flops(s)});
  const int cblocks = (s.c + kBlock - 1) / kBlock;
  parallel_for(exec.pool, int64_t(s.n) * cblocks, [&](int64_t t) {
    backward_data_task(s, dy, w, dx, static_cast<int>(t / cblocks), static_cast<int>(t % cblocks) * kBlock);
  });
}

// ---- backward weight ----------------------------------------------------------------------------------

// One task: output channels k0 .. k0+kBlock-1 (lanes past K repeat K-1, not stored), input channel c.
template <class T>
void backward_weight_task(const Conv2dShape& s, const T* x, const T* dy, T* dw, int k0, int c) {
  const int P = s.p(), Q = s.q(), H = s.h, W = s.w, C = s.c, K = s.k, R = s.r, S = s.s, st = s.stride, pad = s.pad;
  const int kb = std::min(kBlock, K - k0);
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < S; ++t) {
      T total[kBlock] = {};
      for (int q0 = 0; q0 < Q; q0 += kQChunk) {
        const int q1 = std::min(Q, q0 + kQChunk);
        int lo, hi;
        clip_columns(q0, q1, st, pad, t, W, &lo, &hi);
        T acc[kBlock][kQChunk] = {};
        for (int n = 0; n < s.n; ++n) {
          const T* dyk[kBlock];
          for (int l = 0; l < kBlock; ++l)
            dyk[l] = dy + (static_cast<size_t>(n) * K + k0 + std::min(l, kb - 1)) * P * Q;
          const T* xc = x + (static_cast<size_t>(n) * C + c) * H * W;  // x[n,c] (H,W)
          for (int p = 0; p < P; ++p) {
            const int h = p * st - pad + r;
            if (h < 0 || h >= H) continue;
            const T* xrow = xc + static_cast<size_t>(h) * W;
            const ptrdiff_t off = t - pad;  // x[n,c,h,q·st−pad+t] = xrow[q·st + off]
            const size_t row = static_cast<size_t>(p) * Q;
            const T *d0 = dyk[0] + row, *d1 = dyk[1] + row, *d2 = dyk[2] + row, *d3 = dyk[3] + row;
            if (st == 1) {
              for (int q = lo; q < hi; ++q) {
                const T v = xrow[q + off];
                acc[0][q - q0] += d0[q] * v, acc[1][q - q0] += d1[q] * v, acc[2][q - q0] += d2[q] * v,
                    acc[3][q - q0] += d3[q] * v;
              }
            } else {
              for (int q = lo; q < hi; ++q) {
                const T v = xrow[static_cast<ptrdiff_t>(q) * st + off];
                acc[0][q - q0] += d0[q] * v, acc[1][q - q0] += d1[q] * v, acc[2][q - q0] += d2[q] * v,
                    acc[3][q - q0] += d3[q] * v;
              }
            }
          }
        }
        for (int l = 0; l < kBlock; ++l)
          for (int j = 0; j < q1 - q0; ++j) total[l] += acc[l][j];
      }
      for (int l = 0; l < kb; ++l) dw[((static_cast<size_t>(k0 + l) * C + c) * R + r) * S + t] = total[l];
    }
  }
}

// dbias[k] = Σ_{n,p,q} dy[n,k,p,q], in the lane order of backward_weight_task.
template <class T>
void bias_grad_task(const Conv2dShape& s, const T* dy, T* dbias, int k) {
  const int P = s.p(), Q = s.q();
  T total = 0;
  for (int q0 = 0; q0 < Q; q0 += kQChunk) {
    const int q1 = std::min(Q, q0 + kQChunk);
    T acc[kQChunk] = {};
    for (int n = 0; n < s.n; ++n) {
      const T* dyk = dy + (static_cast<size_t>(n) * s.k + k) * P * Q;
      for (int p = 0; p < P; ++p)
        for (int q = q0; q < q1; ++q) acc[q - q0] += dyk[static_cast<size_t>(p) * Q + q];
    }
    for (int j = 0; j < q1 - q0; ++j) total += acc[j];
  }
  dbias[k] = total;
}

template <class T>
void backward_weight_impl(const Exec& exec, const Conv2dShape& s, const T* x, const T* dy, const T* dy_summed, T* dw,
                          T* dbias) {
  if (s.k == 0) return;
  const int P = s.p(), Q = s.q();
  const double bytes =
      sizeof(T) * (double(s.n) * s.c * s.h * s.w + double(s.k) * s.c * s.r * s.s + double(s.n) * s.k * P * Q);
  OpScope scope(exec, "conv2d_backward_weight", profile::OpCost{bytes, conv_flops(s)});
  const int kblocks = (s.k + kBlock - 1) / kBlock;
  if (s.c > 0 && s.r > 0 && s.s > 0) {
    parallel_for(exec.pool, int64_t(kblocks) * s.c, [&](int64_t t) {
      backward_weight_task(s, x, dy, dw, static_cast<int>(t / s.c) * kBlock, static_cast<int>(t % s.c));
    });
  }
  if (dbias) parallel_for(exec.pool, s.k, [&](int64_t k) { bias_grad_task(s, dy_summed, dbias, static_cast<int>(k)); });
}

}  // namespace

// The operands as the products see them: themselves (fp32, f64), or rounded copies (Exec::math TF32 or BF16).
template <class T>
struct Operands {
  const T *x, *w, *dy;
  const T* dy_summed;  // what dbias sums: the rounded dy under BF16, else dy itself
};
template <class T>
Operands<T> operands(const Exec& exec, const Conv2dArgs<T>& a, bool x, bool w, bool dy) {
  Operands<T> o{a.x, a.w, a.dy, a.dy};
  if constexpr (std::is_same_v<T, float>) {
    if (exec.math == Math::fp32) return o;
    const Conv2dShape& s = a.shape;
    if (x) o.x = rounded_copy(a.x, s.x_size(), exec.math, 0);
    if (w) o.w = rounded_copy(a.w, s.w_size(), exec.math, 1);
    if (dy) o.dy = rounded_copy(a.dy, s.y_size(), exec.math, 2);
    if (exec.math == Math::bf16) o.dy_summed = o.dy;
  }
  return o;
}

// The workspace and the statistics are the GPU's (the CPU needs no workspace and leaves no statistics).
template <class T>
int conv2d_forward(const Exec& exec, const Conv2dArgs<T>& a) {
  const Operands<T> o = operands(exec, a, /*x=*/true, /*w=*/true, /*dy=*/false);
  forward_impl(exec, a.shape, o.x, o.w, a.bias, a.y);
  return 0;  // no statistics: the BatchNorm computes its own
}
template <class T>
void conv2d_backward_data(const Exec& exec, const Conv2dArgs<T>& a) {
  const Operands<T> o = operands(exec, a, /*x=*/false, /*w=*/true, /*dy=*/true);
  backward_data_impl(exec, a.shape, o.dy, o.w, a.dx);
}
template <class T>
void conv2d_backward_weight(const Exec& exec, const Conv2dArgs<T>& a) {
  const Operands<T> o = operands(exec, a, /*x=*/true, /*w=*/false, /*dy=*/true);
  backward_weight_impl(exec, a.shape, o.x, o.dy, o.dy_summed, a.dw, a.dbias);
}
template <class T>
bool conv2d_backward(const Exec& exec, const Conv2dArgs<T>& a) {
  cpu::conv2d_backward_weight(exec, a);
  if (a.dx) cpu::conv2d_backward_data(exec, a);
  return false;  // no kernels
}

template int conv2d_forward(const Exec&, const Conv2dArgs<float>&);
template int conv2d_forward(const Exec&, const Conv2dArgs<double>&);
template void conv2d_backward_data(const Exec&, const Conv2dArgs<float>&);
template void conv2d_backward_data(const Exec&, const Conv2dArgs<double>&);
template void conv2d_backward_weight(const Exec&, const Conv2dArgs<float>&);
template void conv2d_backward_weight(const Exec&, const Conv2dArgs<double>&);
template bool conv2d_backward(const Exec&, const Conv2dArgs<float>&);
template bool conv2d_backward(const Exec&, const Conv2dArgs<double>&);

}  // namespace nt::kernels::cpu
