#include "engine/optimizer.h"

#include <cmath>

namespace nt {

Sgd::Sgd(const kernels::Exec& exec, ParamStore& params, const kernels::SgdHyper& hyper)
    : params_(params), hyper_(hyper) {
  if (!(std::isfinite(hyper.lr) && hyper.lr > 0)) throw Error(cat("--lr: must be a positive number, got ", hyper.lr));
  if (!(std::isfinite(hyper.momentum) && hyper.momentum >= 0 && hyper.momentum < 1))
    throw Error(cat("--momentum: must be in [0, 1), got ", hyper.momentum));
  if (!(std::isfinite(hyper.weight_decay) && hyper.weight_decay >= 0))
    throw Error(cat("--weight-decay: must be >= 0, got ", hyper.weight_decay));
  if (hyper.momentum != 0) velocity_ = params.make_state_block(exec, state_arena_);
}

void Sgd::step(const kernels::Exec& exec) {
  kernels::sgd_update(exec, params_.values().f32(), params_.grads().f32(),
                      velocity_.defined() ? velocity_.f32() : nullptr, params_.total(), hyper_);
}

std::string Sgd::describe() const {
  return cat("sgd(lr=", hyper_.lr, ", momentum=", hyper_.momentum, ", weight_decay=", hyper_.weight_decay, ")");
}

}  // namespace nt
