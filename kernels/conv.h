// 2-D convolution (cross-correlation, as torch.nn.functional.conv2d), NCHW, the three passes of a layer.
//
//   forward:         y[n,k,p,q]  = Σ_{c,r,s} x[n,c, p·stride−pad+r, q·stride−pad+s] · w[k,c,r,s]  (+ bias[k])
//   backward_data:   dx[n,c,h,w] = Σ_{k,r,s} dy[n,k,p,q] · w[k,c,r,s]  over the taps with h = p·stride−pad+r,
//                                  w = q·stride−pad+s for an output (p,q) inside the output
//   backward_weight: dw[k,c,r,s] = Σ_{n,p,q} dy[n,k,p,q] · x[n,c, p·stride−pad+r, q·stride−pad+s]
//                    dbias[k]    = Σ_{n,p,q} dy[n,k,p,q]                           (when dbias != nullptr)
// Input pixels outside [0,H)×[0,W) are zero (zero padding). Layouts (PyTorch's, row-major):
//   x, dx (N,C,H,W)   w, dw (K,C,R,S)   bias, dbias (K)   y, dy (N,K,P,Q), P = (H+2·pad−R)/stride + 1 (0 if negative)
// Every output is written with `=` (never accumulated); the outputs must not alias the inputs.
// Numerics: fp32 products summed in fp32, each output's sum in one fixed order on a given backend and device,
// so results are bit-reproducible run to run (no atomics). With Exec::tf32 (CUDA, sm_80+; PyTorch's default
// for cuDNN convolutions, torch.backends.cudnn.allow_tf32) every product's two operands are first rounded to
// TF32 (kernels/tf32.h: round_to_tf32) and the GEMM passes multiply on tensor cores; sums stay fp32, dbias
// is an fp32 sum of the unrounded dy. The CPU backend always computes in fp32; its reference for a TF32
// pass is the fp32 pass on operands rounded by round_to_tf32 (products of TF32 values are exact in fp32). Any sizes >= 0 (an empty output launches nothing;
// an empty sum writes 0, or the bias).
//
// Workspace: the CUDA passes split long sums (K of their GEMM) over several blocks and reduce the partial
// results in a fixed order; the partials live in a caller-provided workspace of
// conv2d_workspace_floats(backend, shape) floats, an upper bound for all three passes and for every batch
// size n' <= shape.n (a layer plans with its full batch and may run a partial last batch). The CPU needs none
// (0, and nullptr may be passed). Kernels and their GEMM mappings: kernels/cuda/conv.cu, docs/conv.md.
#pragma once

#include <cstddef>

#include "kernels/channel_partials.h"
#include "kernels/exec.h"

namespace nt::kernels {

struct Conv2dShape {
  int n = 0, c = 0, h = 0, w = 0;  // input  x (N,C,H,W)
  int k = 0, r = 0, s = 0;         // weight w (K,C,R,S); optional bias (K)
  int stride = 1, pad = 0;         // same in both spatial dims, zero padding
  int p() const { return h + 2 * pad < r ? 0 : (h + 2 * pad - r) / stride + 1; }  // output height
  int q() const { return w + 2 * pad < s ? 0 : (w + 2 * pad - s) / stride + 1; }  // output width
  size_t x_size() const { return size_t(n) * c * h * w; }        // elements of x (and dx)
  size_t w_size() const { return size_t(k) * c * r * s; }        // elements of w (and dw)
  size_t y_size() const { return size_t(n) * k * p() * q(); }    // elements of y (and dy)
};

namespace cpu {
size_t conv2d_workspace_floats(const Conv2dShape& s);  // 0
size_t conv2d_statistics_floats(const Conv2dShape& s);  // 0
int conv2d_forward(const Exec& exec, const Conv2dShape& s, const float* x, const float* w, const float* bias,
                   float* y, float* workspace, float* statistics = nullptr);
void conv2d_backward_data(const Exec& exec, const Conv2dShape& s, const float* dy, const float* w, float* dx,
                          float* workspace);
void conv2d_backward_weight(const Exec& exec, const Conv2dShape& s, const float* x, const float* dy, float* dw,
                            float* dbias, float* workspace);
bool conv2d_backward(const Exec& exec, const Conv2dShape& s, const float* x, const float* dy, const float* w,
                     float* dw, float* dbias, float* dx, float* workspace);
// f64, for finite-difference gradient checks (plain loops)
void conv2d_forward(const Exec& exec, const Conv2dShape& s, const double* x, const double* w, const double* bias,
                    double* y, double* workspace);
void conv2d_backward_data(const Exec& exec, const Conv2dShape& s, const double* dy, const double* w, double* dx,
                          double* workspace);
void conv2d_backward_weight(const Exec& exec, const Conv2dShape& s, const double* x, const double* dy, double* dw,
                            double* dbias, double* workspace);
bool conv2d_backward(const Exec& exec, const Conv2dShape& s, const double* x, const double* dy, const double* w,
                     double* dw, double* dbias, double* dx, double* workspace);
}  // namespace cpu

namespace cuda {
size_t conv2d_workspace_floats(const Conv2dShape& s);
size_t conv2d_statistics_floats(const Conv2dShape& s);
int conv2d_forward(const Exec& exec, const Conv2dShape& s, const float* x, const float* w, const float* bias,
                   float* y, float* workspace, float* statistics);
void conv2d_backward_data(const Exec& exec, const Conv2dShape& s, const float* dy, const float* w, float* dx,
                          float* workspace);
void conv2d_backward_weight(const Exec& exec, const Conv2dShape& s, const float* x, const float* dy, float* dw,
                            float* dbias, float* workspace);
bool conv2d_backward(const Exec& exec, const Conv2dShape& s, const float* x, const float* dy, const float* w,
                     float* dw, float* dbias, float* dx, float* workspace);
}  // namespace cuda

inline size_t conv2d_workspace_floats(Backend backend, const Conv2dShape& s) {
#if NT_WITH_CUDA
  if (backend == Backend::cuda) return cuda::conv2d_workspace_floats(s);
#else
  if (backend == Backend::cuda) throw ::nt::Error("this build of nanotrain has no CUDA backend");
#endif
  return cpu::conv2d_workspace_floats(s);
}

inline size_t conv2d_statistics_floats(Backend backend, const Conv2dShape& s) {
#if NT_WITH_CUDA
  if (backend == Backend::cuda) return cuda::conv2d_statistics_floats(s);
#else
  if (backend == Backend::cuda) throw ::nt::Error("this build of nanotrain has no CUDA backend");
#endif
  return cpu::conv2d_statistics_floats(s);
}

// statistics (nullable): room for conv2d_statistics_floats(backend, s) floats, where the forward may leave y's
// per-channel statistics as ChannelPartials (C = K). Returns their chunks: > 0 where the CUDA forward's epilogue
// wrote them (an implicit-GEMM plan without a split: a block per tile of output pixels, a chunk per column
// tile), 0 where it did not (the CPU, the direct kernel of few taps, a split plan).
inline int conv2d_forward(const Exec& exec, const Conv2dShape& s, const float* x, const float* w, const float* bias,
                          float* y, float* workspace, float* statistics = nullptr) {
  return NT_DISPATCH(exec, conv2d_forward, s, x, w, bias, y, workspace, statistics);
}
inline void conv2d_backward_data(const Exec& exec, const Conv2dShape& s, const float* dy, const float* w, float* dx,
                                 float* workspace) {
  NT_DISPATCH(exec, conv2d_backward_data, s, dy, w, dx, workspace);
}
inline void conv2d_backward_weight(const Exec& exec, const Conv2dShape& s, const float* x, const float* dy,
                                   float* dw, float* dbias, float* workspace) {
  NT_DISPATCH(exec, conv2d_backward_weight, s, x, dy, dw, dbias, workspace);
}

inline void conv2d_forward(const Exec& exec, const Conv2dShape& s, const double* x, const double* w,
                           const double* bias, double* y, double* workspace) {
  NT_CPU_ONLY(exec, conv2d_forward, s, x, w, bias, y, workspace);
}
inline void conv2d_backward_data(const Exec& exec, const Conv2dShape& s, const double* dy, const double* w,
                                 double* dx, double* workspace) {
  NT_CPU_ONLY(exec, conv2d_backward_data, s, dy, w, dx, workspace);
}
inline void conv2d_backward_weight(const Exec& exec, const Conv2dShape& s, const double* x, const double* dy,
                                   double* dw, double* dbias, double* workspace) {
  NT_CPU_ONLY(exec, conv2d_backward_weight, s, x, dy, dw, dbias, workspace);
}

// Both backward passes of a layer (dx nullable: backward_weight alone): backward_weight then backward_data on the
// CPU; on the GPU backward_data's kernel runs beside backward_weight's GEMM (the two are independent), then
// the split-K reductions. The same outputs as the two calls. Returns true when the last kernel it launched is
// backward_weight's split-K reduction, an ordinary kernel that reads only the workspace and writes only dw and
// dbias (Layer::backward_ends_on_own_gradients); false on the CPU.
inline bool conv2d_backward(const Exec& exec, const Conv2dShape& s, const float* x, const float* dy, const float* w,
                            float* dw, float* dbias, float* dx, float* workspace) {
  return NT_DISPATCH(exec, conv2d_backward, s, x, dy, w, dw, dbias, dx, workspace);
}
inline bool conv2d_backward(const Exec& exec, const Conv2dShape& s, const double* x, const double* dy,
                            const double* w, double* dw, double* dbias, double* dx, double* workspace) {
  return NT_CPU_ONLY(exec, conv2d_backward, s, x, dy, w, dw, dbias, dx, workspace);
}
}  // namespace nt::kernels
