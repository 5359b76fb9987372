#include "kernels/classifier_head.h"

#include "core/error.h"
#include "kernels/gemm.h"
#include "kernels/softmax_xent.h"

namespace nt::kernels {

void check_classifier_head(const ClassifierHeadArgs& h) {
  NT_CHECK(h.B >= 1 && h.K >= 1 && h.C >= 1, "classifier head: sizes must be positive, got B=", h.B, " K=", h.K,
           " C=", h.C);
  NT_CHECK(h.x && h.weight && h.labels && h.logits && h.loss_sum && h.correct,
           "classifier head: an input or forward output is null");
  const bool backward = h.dweight != nullptr;
  NT_CHECK(backward == (h.dlogits != nullptr), "classifier head: dweight and dlogits come together");
  NT_CHECK(!backward || (h.dbias != nullptr) == (h.bias != nullptr), "classifier head: dbias iff bias");
  NT_CHECK(backward || (!h.dbias && !h.dx), "classifier head: dbias or dx without dweight");
  NT_CHECK(!h.mask_dx || h.dx, "classifier head: mask_dx without dx");
}

void classifier_head_unfused(const Exec& exec, const ClassifierHeadArgs& h) {
  check_classifier_head(h);
  GemmDesc forward;  // logits (B,C) = x·Wᵀ + b
  forward.M = h.B, forward.N = h.C, forward.K = h.K;
  forward.A = h.x, forward.lda = h.K;
  forward.B = h.weight, forward.ldb = h.K, forward.trans_b = true;
  forward.C = h.logits, forward.ldc = h.C;
  forward.epilogue = h.bias ? Epilogue::bias : Epilogue::none;
  forward.bias = h.bias;
  gemm(exec, forward);

  softmax_xent(exec, SoftmaxXentArgs<float>{.B = h.B,
                                            .C = h.C,
                                            .logits = h.logits,
                                            .labels = h.labels,
                                            .dlogits = h.dlogits,
                                            .loss_sum = h.loss_sum,
                                            .correct = h.correct});
  if (!h.dweight) return;

  GemmDesc dw;  // dW (C,K) = dlogitsᵀ·x, db = Σ_b dlogits
  dw.M = h.C, dw.N = h.K, dw.K = h.B;
  dw.A = h.dlogits, dw.lda = h.C, dw.trans_a = true;
  dw.B = h.x, dw.ldb = h.K;
  dw.C = h.dweight, dw.ldc = h.K;
  dw.a_row_sums = h.dbias;
  gemm(exec, dw);
  if (!h.dx) return;

  GemmDesc dx;  // dx (B,K) = dlogits·W, through x's ReLU
  dx.M = h.B, dx.N = h.K, dx.K = h.C;
  dx.A = h.dlogits, dx.lda = h.C;
  dx.B = h.weight, dx.ldb = h.K;
  dx.C = h.dx, dx.ldc = h.K;
  if (h.mask_dx) dx.epilogue = Epilogue::relu_mask, dx.mask = h.x;
  gemm(exec, dx);
}

}  // namespace nt::kernels
