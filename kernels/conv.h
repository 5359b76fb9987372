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
// so results are bit-reproducible run to run (no atomics). With Exec::math TF32 (CUDA, sm_80+; PyTorch's default
// for cuDNN convolutions, torch.backends.cudnn.allow_tf32) every product's two operands are first rounded to
// TF32 (kernels/tf32.h: round_to_tf32) and the GEMM passes multiply on tensor cores; sums stay fp32, dbias
// is an fp32 sum of the unrounded dy. With BF16 (--bf16) the operands are rounded to BF16 and dbias sums the
// rounded dy (kernels/operand.h). The CPU twin of either mode is the fp32 pass on operands rounded the same way
// (products of TF32 or BF16 values are exact in fp32).
// Any sizes >= 0 (an empty output launches nothing; an empty sum writes 0, or the bias).
//
// Staged operands (TF32 or BF16, the GPU): where conv2d_takes_staged(backend, shape, math, bias) holds, the layer's
// neighbours may write x and dy as the channels-last kernels multiply them, instead of fp32 NCHW, and the ops read
// them from Conv2dArgs::x_staged and dy_staged (each optional, 16-byte aligned), in the element Exec::math gives
// (kernels/operand.h, stage_channels_last: BF16 bits under BF16, fp32 rounded to TF32 under TF32):
//   x_staged[n][h][w][c]  = round_operand(x[n][c][h][w], math)     (N·H·W·C elements)
//   dy_staged[n][p][q][k] = round_operand(dy[n][k][p][q], math)    (N·P·Q·K)
//   filters[k][r][s][c]   = round_operand(w[k][c][r][s], math)     (K·R·S·C: the forward's, in its workspace)
// The layer that writes x_staged also stages the forward's filters (conv2d_filter_stage says where and how), so that
// the forward, given filters_staged, launches no stage kernel of its own.
// The kernels round x and dy the same way as they stage them, so the results are the same bits as from x and dy
// (dbias under BF16 sums the rounded dy either way; under TF32 it sums dy itself, so a convolution with a bias takes
// no staged operands there). The passes no longer transpose them, and BF16 halves their bytes (docs/bf16.md,
// 'Activations in BF16').
//
// Workspace: the CUDA passes split long sums (K of their GEMM) over several blocks and reduce the partial
// results in a fixed order; the partials live in a caller-provided Conv2dArgs::workspace of
// conv2d_workspace_floats(backend, shape) floats, an upper bound for all three passes and for every batch
// size n' <= shape.n (a layer plans with its full batch and may run a partial last batch). The CPU needs none
// (0, and nullptr may be passed). Kernels and their GEMM mappings: kernels/cuda/conv.cu (implicit GEMM),
// kernels/cuda/conv_direct.cu (few taps), docs/conv.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/channel_partials.h"
#include "kernels/dispatch.h"
#include "kernels/runtime.h"

namespace nt::kernels {

struct Conv2dShape {
  int n = 0, c = 0, h = 0, w = 0;  // input  x (N,C,H,W)
  int k = 0, r = 0, s = 0;         // weight w (K,C,R,S); optional bias (K)
  int stride = 1, pad = 0;         // same in both spatial dims, zero padding
  int p() const { return h + 2 * pad < r ? 0 : (h + 2 * pad - r) / stride + 1; }  // output height
  int q() const { return w + 2 * pad < s ? 0 : (w + 2 * pad - s) / stride + 1; }  // output width
  size_t x_size() const { return size_t(n) * c * h * w; }                         // elements of x (and dx)
  size_t w_size() const { return size_t(k) * c * r * s; }                         // elements of w (and dw)
  size_t y_size() const { return size_t(n) * k * p() * q(); }                     // elements of y (and dy)
};

// The arguments of every convolution op, by name. Each op reads and writes only the fields its line names; the
// others are ignored (leave them nullptr):
//   conv2d_forward          reads x, w, bias (nullable)         writes y; workspace; statistics (nullable)
//   conv2d_backward_data    reads dy, w                         writes dx; workspace
//   conv2d_backward_weight  reads x, dy                         writes dw, dbias (nullable); workspace
//   conv2d_backward         reads x, dy, w (with dx)            writes dw, dbias (nullable), dx (nullable); workspace
// f64 (the gradient checks) runs on the CPU only, and never writes statistics.
template <class T>
struct Conv2dArgs {
  Conv2dShape shape;
  const T* x = nullptr;     // (N,C,H,W)
  const T* w = nullptr;     // (K,C,R,S)
  const T* bias = nullptr;  // (K); nullptr: no bias
  T* y = nullptr;           // (N,K,P,Q)
  const T* dy = nullptr;    // (N,K,P,Q)
  T* dx = nullptr;          // (N,C,H,W); conv2d_backward: nullptr for the weight gradient alone
  T* dw = nullptr;          // (K,C,R,S)
  T* dbias = nullptr;       // (K); nullptr: no bias gradient
  T* workspace = nullptr;   // conv2d_workspace_floats(backend, shape) elements; the CPU needs none (nullptr)
  // Forward only (nullable): room for conv2d_statistics_floats(backend, shape) floats, where the forward may leave
  // y's per-channel statistics as ChannelPartials (C = K): see conv2d_forward.
  float* statistics = nullptr;
  // The GPU with Exec::math TF32 or BF16, where conv2d_takes_staged (nullable; see 'Staged operands' above): x
  // channels-last (N,H,W,C) in the math's element, which the forward and backward_weight read instead of x; dy
  // (N,P,Q,K), which backward_data and backward_weight read instead of dy.
  const void* x_staged = nullptr;
  const void* dy_staged = nullptr;
  // The caller's promise that the kernel launched just before reads and writes neither w nor the workspace: the
  // layer's neighbour that wrote x_staged (forward) or dy_staged (backward). The filters' stage then runs beside it.
  bool overlaps_previous = false;
  // conv2d_forward with x_staged: the writer of x_staged staged the filters too (conv2d_filter_stage), after w last
  // changed and with nothing written to the workspace since, so the forward stages nothing.
  bool filters_staged = false;
  // conv2d_backward on the GPU (nullable): a side stream of exec's (kernels/runtime.h) on which the weight gradient
  // runs beside the input gradient and whatever the caller enqueues after it. The op forks it (after staging what both
  // passes read); the caller joins it before anything reads dw or dbias. Ignored where backward_data does not run as a
  // GEMM of its own (no dx, or the direct kernels of few taps).
  const SideStream* weight_side = nullptr;
};

// Where and how the forward's filters go in the staged form (the 'Staged operands' above), for the layer that writes
// x_staged and stages them beside it: element e = ((k·R + r)·S + s)·C + c of `filters`, in the math's element, is
// round_operand(w[k][c][r][s], math). filters is nullptr where the forward stages nothing (the CPU, fp32, a plan that
// does not take staged operands): then nobody stages them, and the forward is not given filters_staged.
struct Conv2dFilterStage {
  const float* w = nullptr;  // (K, C, R, S)
  void* filters = nullptr;   // in the convolution's workspace
  int k = 0, c = 0, r = 0, s = 0;
};

namespace cpu {
template <class T>
int conv2d_forward(const Exec& exec, const Conv2dArgs<T>& a);  // float, double (all four: plain loops)
template <class T>
void conv2d_backward_data(const Exec& exec, const Conv2dArgs<T>& a);
template <class T>
void conv2d_backward_weight(const Exec& exec, const Conv2dArgs<T>& a);
template <class T>
bool conv2d_backward(const Exec& exec, const Conv2dArgs<T>& a);
}  // namespace cpu

namespace cuda {
bool conv2d_takes_staged(const Conv2dShape& s, Math math, bool bias);
size_t conv2d_workspace_floats(const Conv2dShape& s);
size_t conv2d_statistics_floats(const Conv2dShape& s);
Conv2dFilterStage conv2d_filter_stage(const Conv2dShape& s, Math math, const float* w, float* workspace);
int conv2d_forward(const Exec& exec, const Conv2dArgs<float>& a);
void conv2d_backward_data(const Exec& exec, const Conv2dArgs<float>& a);
void conv2d_backward_weight(const Exec& exec, const Conv2dArgs<float>& a);
bool conv2d_backward(const Exec& exec, const Conv2dArgs<float>& a);
}  // namespace cuda

// Whether the passes of this shape (and batch) multiply x and dy channels-last, so that Conv2dArgs::x_staged and
// dy_staged may replace them: the GPU with Math::tf32 or Math::bf16, where the forward, backward_data and
// backward_weight all run on the channels-last kernels (under TF32 only without a bias: its dbias sums the unrounded
// dy). Never on the CPU.
inline bool conv2d_takes_staged(Backend backend, const Conv2dShape& s, Math math, bool bias) {
  if constexpr (kCudaBuilt)
    return backend == Backend::cuda && cuda::conv2d_takes_staged(s, math, bias);
  else
    return false;
}

// The forward's staged filters for a batch of this shape (see Conv2dFilterStage): their place in `workspace` (the
// layer's conv2d_workspace_floats), or none.
inline Conv2dFilterStage conv2d_filter_stage(Backend backend, const Conv2dShape& s, Math math, const float* w,
                                             float* workspace) {
  if constexpr (kCudaBuilt)
    if (backend == Backend::cuda) return cuda::conv2d_filter_stage(s, math, w, workspace);
  return {};
}

// The CPU needs neither (0).
inline size_t conv2d_workspace_floats(Backend backend, const Conv2dShape& s) {
  return by_backend<nullptr, cuda::conv2d_workspace_floats>(backend, s);
}
inline size_t conv2d_statistics_floats(Backend backend, const Conv2dShape& s) {
  return by_backend<nullptr, cuda::conv2d_statistics_floats>(backend, s);
}

// Returns the chunks of the statistics it left (ChannelPartials::chunks): > 0 where the CUDA forward's epilogue
// wrote them (an implicit-GEMM plan without a split: a block per tile of output pixels, a chunk per column
// tile), 0 where it did not (no a.statistics, the CPU, the direct kernel of few taps, a split plan).
template <class T>
int conv2d_forward(const Exec& exec, const Conv2dArgs<T>& a) {
  return dispatch<cpu::conv2d_forward<T>, cuda::conv2d_forward>(exec, a);
}
template <class T>
void conv2d_backward_data(const Exec& exec, const Conv2dArgs<T>& a) {
  dispatch<cpu::conv2d_backward_data<T>, cuda::conv2d_backward_data>(exec, a);
}
template <class T>
void conv2d_backward_weight(const Exec& exec, const Conv2dArgs<T>& a) {
  dispatch<cpu::conv2d_backward_weight<T>, cuda::conv2d_backward_weight>(exec, a);
}

// Both backward passes of a layer (a.dx nullable: backward_weight alone): backward_weight then backward_data on
// the CPU; on the GPU backward_data's kernel runs beside backward_weight's GEMM (the two are independent), then
// the split-K reductions. The same outputs as the two calls. Returns true when the last kernel it launched is
// backward_weight's split-K reduction, an ordinary kernel that reads only the workspace and writes only dw and
// dbias (Layer::backward_ends_on_own_gradients); false on the CPU.
template <class T>
bool conv2d_backward(const Exec& exec, const Conv2dArgs<T>& a) {
  return dispatch<cpu::conv2d_backward<T>, cuda::conv2d_backward>(exec, a);
}

}  // namespace nt::kernels
