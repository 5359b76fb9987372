// Optimizers update every parameter of a ParamStore in one launch (see kernels/optim.h).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "engine/params.h"
#include "kernels/lr_schedule.h"
#include "kernels/optim.h"

namespace nt {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step(const kernels::Exec& exec) = 0;  // enqueue only: no allocation, no synchronization
  virtual std::string describe() const = 0;
  // The learning rate becomes lr * factor from the next step on. The factor lives on the device and the
  // update reads it there, so a captured epoch replays with whatever factor was set before it (a
  // stream-ordered copy: call it between epochs, never inside a step).
  void set_lr_factor(const kernels::Exec& exec, float factor) const;
  // The optimizer's state as tensors named after PyTorch's optimizer state_dict where it fits: per parameter i (the
  // model's order) "optimizer.state.i.momentum_buffer" (SGD with momentum), "optimizer.state.i.exp_avg" and
  // "exp_avg_sq" (Adam); Adam's step counter, one for all parameters, is "optimizer.step" (i64 {t, done}). Views of
  // the live state: resumable checkpoints read and write through them.
  // With a per-step schedule (kernels/lr_schedule.h), "optimizer.lr_schedule_step" (i64, the steps taken) too.
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  // From the next step on, each step first sets the lr factor for itself from the schedule and a device-resident
  // count of the steps taken (0 now, or as a resumed checkpoint's state sets it), replacing set_lr_factor's value.
  // Call it before state(): the count is state.
  void schedule_per_step(const kernels::LrSchedule& schedule);

 protected:
  void begin_step(const kernels::Exec& exec) const;  // each step() calls it first: the per-step schedule
  void add_schedule_state(std::vector<std::pair<std::string, Tensor>>& out) const;
  Tensor lr_factor_;      // (1) f32, 1 until set; requested by each optimizer with its state
  Tensor schedule_step_;  // (1) i64, 0 at first; requested likewise
  std::optional<kernels::LrSchedule> schedule_;
};

// Adam and AdamW (decoupled weight decay), PyTorch's semantics (kernels/optim.h). The step count t of
// the bias corrections lives on the device and is advanced by the update itself, so a captured epoch
// replays correctly.
class Adam final : public Optimizer {
 public:
  // Throws nt::Error naming --lr, --beta1, --beta2, --eps or --weight-decay for values out of range.
  Adam(const kernels::Exec& exec, ParamStore& params, const kernels::AdamHyper& hyper);
  void step(const kernels::Exec& exec) override;
  std::string describe() const override;
  std::vector<std::pair<std::string, Tensor>> state() const override;

 private:
  ParamStore& params_;
  kernels::AdamHyper hyper_;
  Arena state_arena_;
  Tensor m_, v_;  // moments, same layout as the parameters
  Tensor steps_;  // (2) i64: the device step counter {t, done} of kernels/optim.h
};

class Sgd final : public Optimizer {
 public:
  // Throws nt::Error naming --lr, --momentum or --weight-decay for values out of range.
  Sgd(const kernels::Exec& exec, ParamStore& params, const kernels::SgdHyper& hyper);
  void step(const kernels::Exec& exec) override;
  std::string describe() const override;
  std::vector<std::pair<std::string, Tensor>> state() const override;

 private:
  ParamStore& params_;
  kernels::SgdHyper hyper_;
  Arena state_arena_;
  Tensor velocity_;  // same layout as the parameters; undefined without momentum
};

// An optimizer by name, as the CLI and the tests choose one: "sgd" (lr, momentum, weight_decay),
// "adam" and "adamw" (lr, betas, eps, weight_decay). Throws nt::Error naming --optimizer or the value.
struct OptimizerConfig {
  std::string name = "sgd";
  double lr = 0.03;
  double momentum = 0;
  double weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};
std::unique_ptr<Optimizer> make_optimizer(const kernels::Exec& exec, ParamStore& params, const OptimizerConfig& c);

}  // namespace nt
