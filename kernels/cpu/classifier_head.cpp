// The classifier head on the CPU: the composition of the unfused ops, in the order Linear's forward,
// SoftmaxCrossEntropy and Linear's backward run them (kernels/classifier_head.h), so that a CPU run gives
// the same bits with the head fused or not; each op opens its own profiler scope.
#include "kernels/classifier_head.h"
#include "kernels/gemm.h"
#include "kernels/softmax_xent.h"

namespace nt::kernels::cpu {

void classifier_head(const Exec& exec, const ClassifierHead& h) {
  check_classifier_head(h);
  GemmDesc forward;                                          // logits (B,C) = x·Wᵀ + b
  forward.M = h.B, forward.N = h.C, forward.K = h.K;
  forward.A = h.x, forward.lda = h.K;
  forward.B = h.weight, forward.ldb = h.K, forward.trans_b = true;
  forward.C = h.logits, forward.ldc = h.C;
  forward.epilogue = h.bias ? Epilogue::bias : Epilogue::none;
  forward.bias = h.bias;
  cpu::gemm(exec, forward);

  cpu::softmax_xent(exec, h.logits, h.labels, h.B, h.C, h.dlogits, h.loss_sum, h.correct);
  if (!h.dweight) return;

  GemmDesc dw;                                               // dW (C,K) = dlogitsᵀ·x, db = Σ_b dlogits
  dw.M = h.C, dw.N = h.K, dw.K = h.B;
  dw.A = h.dlogits, dw.lda = h.C, dw.trans_a = true;
  dw.B = h.x, dw.ldb = h.K;
  dw.C = h.dweight, dw.ldc = h.K;
  dw.a_row_sums = h.dbias;
  cpu::gemm(exec, dw);
  if (!h.dx) return;

  GemmDesc dx;                                               // dx (B,K) = dlogits·W, through x's ReLU
  dx.M = h.B, dx.N = h.K, dx.K = h.C;
  dx.A = h.dlogits, dx.lda = h.C;
  dx.B = h.weight, dx.ldb = h.K;
  dx.C = h.dx, dx.ldc = h.K;
  if (h.mask_dx) dx.epilogue = Epilogue::relu_mask, dx.mask = h.x;
  cpu::gemm(exec, dx);
}

}  // namespace nt::kernels::cpu
