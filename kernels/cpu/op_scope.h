// The CPU backend's half of the one launch path: every CPU op opens a scope named after it, so the
// profiler sees CPU ops exactly as it sees GPU kernels (host timers instead of CUDA events).
#pragma once

#include "kernels/exec.h"

namespace nt::kernels::cpu {

class OpScope {
 public:
  OpScope(const Exec& exec, const char* name, const profile::OpCost& cost)
      : observer_(exec.observer), name_(name), cost_(cost) {
    if (observer_) observer_->begin(name_, nullptr);
  }
  ~OpScope() {
    if (observer_) observer_->end(name_, nullptr, cost_);
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  profile::LaunchObserver* observer_;
  const char* name_;
  profile::OpCost cost_;
};

}  // namespace nt::kernels::cpu
