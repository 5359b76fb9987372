// The persistent mlp step's arithmetic (kernels/persistent_mlp.h), one definition for the CPU twin and the GPU kernel:
// the same operations in the same order on both backends, each one correctly rounded (kernels/rounded.h).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/exec.h"
#include "kernels/float_bits.h"
#include "kernels/optim.h"
#include "kernels/persistent_mlp.h"
#include "kernels/rounded.h"

namespace nt::kernels::persistent {

using kernels::adam_element_step;
using kernels::AdamElementStep;
using kernels::AdamHyper;
using kernels::add_rn;
using kernels::fma_rn;
using kernels::mul_rn;
using kernels::PersistentMlpArgs;

// 2^e as a float, e in [-126, 127] (a normal number: its exponent field alone).
NT_HOST_DEVICE inline float pow2(int e) { return kernels::float_of(static_cast<uint32_t>(e + 127) << 23); }

// e^x with the same bits on both backends, where expf is not: glibc's and CUDA's differ by an ulp on some x, and 30
// steps of momentum SGD on random labels once grew that into a different trajectory (a ReLU or an argmax on the
// other side). Cody-Waite: x = k·ln2 + r with k = rint(x·log2 e) and ln2 in two parts (the first exact in 11 bits, so
// k·ln2_hi is exact), |r| <= ln2/2; e^r by Cephes' degree-7 polynomial for expf (within 2 ulp); then 2^k as one
// exponent field, or two where e^x is subnormal. Every step one correctly rounded operation.
NT_HOST_DEVICE inline float exp_rn(float x) {
  if (!(x > -104.f)) return x != x ? x : 0.f;  // NaN stays NaN; below the smallest subnormal's half, 0
  if (x > 88.72283f) return INFINITY;
  const float k = rintf(mul_rn(x, 1.44269504088896341f));
  float r = fma_rn(-k, 0.693359375f, x);
  r = fma_rn(-k, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fma_rn(p, r, 1.3981999507e-3f);
  p = fma_rn(p, r, 8.3334519073e-3f);
  p = fma_rn(p, r, 4.1665795894e-2f);
  p = fma_rn(p, r, 1.6666665459e-1f);
  p = fma_rn(p, r, 5.0000001201e-1f);
  p = fma_rn(p, mul_rn(r, r), add_rn(r, 1.f));  // 1 + r + r²·q(r)
  const int e = static_cast<int>(k);
  if (e > 127) return mul_rn(mul_rn(p, pow2(127)), pow2(e - 127));    // the first product is exact
  if (e < -126) return mul_rn(mul_rn(p, pow2(e + 126)), pow2(-126));  // the subnormal result rounds once
  return mul_rn(p, pow2(e));
}

// Σ_k a[k]·w[k·w_stride] over k in [0, K), for the short dot products (the head's input gradient, C ≤ 32 terms):
// four chains by k mod 4, each in increasing k, then (p0 + p1) + (p2 + p3). w_stride: a column of a row-major matrix.
NT_HOST_DEVICE inline float dot4(const float* a, const float* w, int K, int w_stride = 1) {
  float p0 = 0.f, p1 = 0.f, p2 = 0.f, p3 = 0.f;
  int k = 0;
  for (; k + 4 <= K; k += 4) {
    p0 = fma_rn(a[k], w[int64_t(k) * w_stride], p0);
    p1 = fma_rn(a[k + 1], w[int64_t(k + 1) * w_stride], p1);
    p2 = fma_rn(a[k + 2], w[int64_t(k + 2) * w_stride], p2);
    p3 = fma_rn(a[k + 3], w[int64_t(k + 3) * w_stride], p3);
  }
  if (k < K) p0 = fma_rn(a[k], w[int64_t(k) * w_stride], p0);
  if (k + 1 < K) p1 = fma_rn(a[k + 1], w[int64_t(k + 1) * w_stride], p1);
  if (k + 2 < K) p2 = fma_rn(a[k + 2], w[int64_t(k + 2) * w_stride], p2);
  return add_rn(add_rn(p0, p1), add_rn(p2, p3));
}

// Σ_k a[k]·w[k·w_stride] over k in [0, K), for the wide dot products (a layer's inputs against a weight row, the
// gradient at a layer's outputs against a weight column). K is cut into groups of four consecutive k; chain c of
// kDotChains takes groups c, c + 16, c + 32, ... in increasing k, one FMA a k; then the chains are added as a
// butterfly, p[c] += p[c + h] for c < h, h = 8, 4, 2, 1. The order is the GPU's (kernels/cuda/persistent_mlp.cu,
// tiled_dots): 16 lanes a dot product, lane c running chain c with one 16-byte load a group, so that a lane's loads
// reuse across a tile of outputs and the 16 lanes read 256 contiguous bytes; the butterfly is its shfl_xor steps
// (a + b = b + a exactly, so every lane ends with these bits). Chains of K/16 instead of dot4's K/4 (49 FMAs for the
// mlp's 784 inputs): the GPU runs 4x more of them at once.
inline constexpr int kDotChains = 16;
NT_HOST_DEVICE inline float dot16(const float* a, const float* w, int K, int w_stride = 1) {
  float p[kDotChains] = {};
  for (int k = 0; k < K; ++k) {
    float& chain = p[(k / 4) % kDotChains];
    chain = fma_rn(a[k], w[int64_t(k) * w_stride], chain);
  }
  for (int h = kDotChains / 2; h >= 1; h /= 2)
    for (int c = 0; c < h; ++c) p[c] = add_rn(p[c], p[c + h]);
  return p[0];
}

// A Linear output with its bias and the ReLU of a hidden layer (relu: the head's logits have none). NaN stays NaN.
NT_HOST_DEVICE inline float linear_out(float dot, float bias, bool relu) {
  const float z = add_rn(dot, bias);
  return relu && z < 0.f ? 0.f : z;
}

// The SGD step of kernels/optim.h (kernels/cuda/optim.cu, sgd_step), for one weight and its gradient.
struct SgdStep {
  float lr, momentum, weight_decay;
  NT_HOST_DEVICE void apply(float& p, float g, float& v) const {
    const float gi = weight_decay != 0.f ? fma_rn(weight_decay, p, g) : g;
    if (momentum != 0.f) {
      v = fma_rn(momentum, v, gi);
      p = fma_rn(-lr, v, p);
    } else {
      p = fma_rn(-lr, gi, p);
    }
  }
};

// One parameter's step of step t (t counts from 1 since the optimizer started; Adam's bias corrections use it): SGD's
// or Adam's (kernels/optim.h's AdamElementStep, the engine's own), with the parameter's state `first` (SGD: the
// velocity, untouched without momentum; Adam: the first moment) and `second` (Adam's second moment).
struct ParamStep {
  SgdStep sgd;
  AdamElementStep adam;
  bool is_adam;
  NT_HOST_DEVICE void apply(float& p, float g, float& first, float& second) const {
    if (is_adam)
      adam.apply(p, g, first, second);
    else
      sgd.apply(p, g, first);
  }
};
// The step's scalars from the op's arguments; *lr_scale is read on the executing backend.
NT_HOST_DEVICE inline ParamStep param_step(const PersistentMlpArgs& a, uint64_t t) {
  ParamStep s{};
  s.is_adam = a.adam_step != nullptr;
  s.sgd = {a.lr_scale ? mul_rn(a.lr, *a.lr_scale) : a.lr, a.momentum, a.weight_decay};
  if (s.is_adam) {
    AdamHyper h = a.adam;
    h.lr_scale = a.lr_scale;
    s.adam = adam_element_step(h, h.lr_scale ? h.lr * double(*h.lr_scale) : h.lr, t);
  }
  return s;
}

// One row of softmax cross-entropy (kernels/softmax_xent.h): logits[0..C) in, dlogits[0..C) = (softmax - onehot) / B
// out (may alias logits), the row's loss returned; *hit: the argmax (lowest index on ties, NaN above all) is the label.
NT_HOST_DEVICE inline float softmax_xent_row(float* logits, int C, int label, int B, bool* hit) {
  float m = logits[0];
  int k = 0;
  for (int c = 1; c < C; ++c) {
    const float x = logits[c];
    if (x > m || (x != x && m == m)) m = x, k = c;
  }
  float s = 0.f;
  for (int c = 0; c < C; ++c) s = add_rn(s, exp_rn(logits[c] - m));
  const bool label_ok = label >= 0 && label < C;
  const float picked = label_ok ? logits[label] : NAN;
  const float loss = add_rn(logf(s), m - picked);
  *hit = label_ok && k == label;
  const float batch = static_cast<float>(B);
  for (int c = 0; c < C; ++c) {
    const float p = exp_rn(logits[c] - m) / s;
    logits[c] = (p - (c == label ? 1.f : 0.f)) / batch;
  }
  return loss;
}

}  // namespace nt::kernels::persistent
