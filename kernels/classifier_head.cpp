#include "kernels/classifier_head.h"

#include "core/error.h"

namespace nt::kernels {

void check_classifier_head(const ClassifierHead& h) {
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

}  // namespace nt::kernels
