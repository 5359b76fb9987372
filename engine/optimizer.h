// Optimizers update every parameter of a ParamStore in one launch (see kernels/optim.h).
#pragma once

#include <string>

#include "engine/params.h"
#include "kernels/optim.h"

namespace nt {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step(const kernels::Exec& exec) = 0;   // enqueue only: no allocation, no synchronization
  virtual std::string describe() const = 0;
};

class Sgd final : public Optimizer {
 public:
  // Throws nt::Error naming --lr, --momentum or --weight-decay for values out of range.
  Sgd(const kernels::Exec& exec, ParamStore& params, const kernels::SgdHyper& hyper);
  void step(const kernels::Exec& exec) override;
  std::string describe() const override;

 private:
  ParamStore& params_;
  kernels::SgdHyper hyper_;
  Arena state_arena_;
  Tensor velocity_;  // same layout as the parameters; undefined without momentum
};

}  // namespace nt
