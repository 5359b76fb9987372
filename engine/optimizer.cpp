#include "engine/optimizer.h"

#include <cmath>

namespace nt {

void Optimizer::set_lr_factor(const kernels::Exec& exec, float factor) const {
  if (!(std::isfinite(factor) && factor >= 0)) throw Error(cat("learning-rate factor must be >= 0, got ", factor));
  lr_factor_.copy_from_host(exec, &factor, sizeof factor);
}

void Optimizer::schedule_per_step(const kernels::LrSchedule& schedule) {
  if (schedule.total_steps < 1)
    throw Error(cat("a per-step schedule needs at least 1 step, got ", schedule.total_steps));
  if (!(schedule.warmup >= 0 && schedule.warmup < 1))
    throw Error(cat("--warmup: must be in [0, 1), got ", schedule.warmup));
  schedule_ = schedule;
}

void Optimizer::begin_step(const kernels::Exec& exec) const {
  if (schedule_)
    kernels::lr_schedule_step(
        exec, {.schedule = *schedule_, .step = schedule_step_.data<int64_t>(), .factor = lr_factor_.f32()});
}

void Optimizer::add_schedule_state(std::vector<std::pair<std::string, Tensor>>& out) const {
  if (schedule_) out.emplace_back("optimizer.lr_schedule_step", schedule_step_);
}

Sgd::Sgd(const kernels::Exec& exec, ParamStore& params, const kernels::SgdHyper& hyper)
    : params_(params), hyper_(hyper) {
  if (!(std::isfinite(hyper.lr) && hyper.lr > 0)) throw Error(cat("--lr: must be a positive number, got ", hyper.lr));
  if (!(std::isfinite(hyper.momentum) && hyper.momentum >= 0 && hyper.momentum < 1))
    throw Error(cat("--momentum: must be in [0, 1), got ", hyper.momentum));
  if (!(std::isfinite(hyper.weight_decay) && hyper.weight_decay >= 0))
    throw Error(cat("--weight-decay: must be >= 0, got ", hyper.weight_decay));
  ArenaPlan plan;
  if (hyper.momentum != 0) plan.request(&velocity_, Shape{static_cast<int64_t>(params.total())}, params.dtype());
  plan.request(&lr_factor_, Shape{1}, DType::f32);
  plan.request(&schedule_step_, Shape{1}, DType::i64);
  state_arena_ = plan.commit(exec);
  set_lr_factor(exec, 1.f);
  hyper_.lr_scale = lr_factor_.f32();
}

void Sgd::step(const kernels::Exec& exec) {
  begin_step(exec);
  kernels::sgd_update(exec, {.n = params_.total(),
                             .params = params_.values().f32(),
                             .grads = params_.grads().f32(),
                             .velocity = velocity_.defined() ? velocity_.f32() : nullptr,
                             .hyper = hyper_});
}

std::string Sgd::describe() const {
  return cat("sgd(lr=", hyper_.lr, ", momentum=", hyper_.momentum, ", weight_decay=", hyper_.weight_decay, ")");
}

Adam::Adam(const kernels::Exec& exec, ParamStore& params, const kernels::AdamHyper& hyper)
    : params_(params), hyper_(hyper) {
  if (!(std::isfinite(hyper.lr) && hyper.lr > 0)) throw Error(cat("--lr: must be a positive number, got ", hyper.lr));
  if (!(hyper.beta1 >= 0 && hyper.beta1 < 1)) throw Error(cat("--beta1: must be in [0, 1), got ", hyper.beta1));
  if (!(hyper.beta2 >= 0 && hyper.beta2 < 1)) throw Error(cat("--beta2: must be in [0, 1), got ", hyper.beta2));
  if (!(std::isfinite(hyper.eps) && hyper.eps > 0)) throw Error(cat("--eps: must be positive, got ", hyper.eps));
  if (!(std::isfinite(hyper.weight_decay) && hyper.weight_decay >= 0))
    throw Error(cat("--weight-decay: must be >= 0, got ", hyper.weight_decay));
  NT_CHECK(params.dtype() == DType::f32, "Adam updates f32 parameters");
  ArenaPlan plan;  // zero-filled: m = v = 0 and t = 0, as PyTorch's fresh state
  const Shape block{static_cast<int64_t>(params.total())};
  plan.request(&m_, block, DType::f32);
  plan.request(&v_, block, DType::f32);
  plan.request(&steps_, Shape{2}, DType::i64);
  plan.request(&lr_factor_, Shape{1}, DType::f32);
  plan.request(&schedule_step_, Shape{1}, DType::i64);
  state_arena_ = plan.commit(exec);
  set_lr_factor(exec, 1.f);
  hyper_.lr_scale = lr_factor_.f32();
}

void Adam::step(const kernels::Exec& exec) {
  begin_step(exec);
  kernels::adam_update(exec, {.n = params_.total(),
                              .params = params_.values().f32(),
                              .grads = params_.grads().f32(),
                              .m = m_.f32(),
                              .v = v_.f32(),
                              .hyper = hyper_,
                              .step = reinterpret_cast<uint64_t*>(steps_.data<int64_t>())});
}

std::string Adam::describe() const {
  return cat(hyper_.decoupled ? "adamw(lr=" : "adam(lr=", hyper_.lr, ", betas=(", hyper_.beta1, ", ", hyper_.beta2,
             "), eps=", hyper_.eps, ", weight_decay=", hyper_.weight_decay, ")");
}

namespace {
// Per-parameter views of a state block laid out as the parameters, named optimizer.state.<i>.<name>.
void add_views(std::vector<std::pair<std::string, Tensor>>& out, const ParamStore& params, const Tensor& block,
               const char* name) {
  const auto* values = static_cast<const uint8_t*>(params.values().raw());
  auto* base = static_cast<uint8_t*>(block.raw());
  const auto& list = params.params();
  for (size_t i = 0; i < list.size(); ++i) {
    const auto offset = static_cast<const uint8_t*>(list[i].value.raw()) - values;
    out.emplace_back(cat("optimizer.state.", i, ".", name),
                     Tensor::view(base + offset, list[i].value.shape(), block.dtype(), block.backend()));
  }
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> Sgd::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (velocity_.defined()) add_views(out, params_, velocity_, "momentum_buffer");
  add_schedule_state(out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Adam::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  add_views(out, params_, m_, "exp_avg");
  add_views(out, params_, v_, "exp_avg_sq");
  out.emplace_back("optimizer.step", steps_);
  add_schedule_state(out);
  return out;
}

std::unique_ptr<Optimizer> make_optimizer(const kernels::Exec& exec, ParamStore& params, const OptimizerConfig& c) {
  auto f = [](double v) { return static_cast<float>(v); };
  if (c.name == "sgd")
    return std::make_unique<Sgd>(exec, params, kernels::SgdHyper{f(c.lr), f(c.momentum), f(c.weight_decay)});
  if (c.name == "adam" || c.name == "adamw") {
    if (c.momentum != 0) throw Error("--momentum: applies to sgd only (adam takes --beta1)");
    kernels::AdamHyper h;
    h.lr = c.lr, h.beta1 = c.beta1, h.beta2 = c.beta2, h.eps = c.eps, h.weight_decay = c.weight_decay;
    h.decoupled = c.name == "adamw";
    return std::make_unique<Adam>(exec, params, h);
  }
  throw Error(cat("--optimizer: must be sgd, adam or adamw, got '", c.name, "'"));
}

}  // namespace nt
