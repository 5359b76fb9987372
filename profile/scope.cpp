#include "profile/scope.h"

#include <algorithm>

#include "profile/nvtx.h"

namespace nt::profile {

namespace {

// A fixed-size stack: deeper frames than kMax are counted but not kept (the deepest kept frame stays current),
// so pushes and pops always balance and nothing allocates.
struct Stack {
  static constexpr int kMax = 16;
  ScopeInfo frames[kMax]{};
  int depth = 0;

  void push(const char* name, uint64_t id) {
    if (depth < kMax) frames[depth] = {name, id};
    ++depth;
  }
  void pop() { depth = std::max(depth - 1, 0); }
  ScopeInfo top() const { return depth == 0 ? ScopeInfo{} : frames[std::min(depth, kMax) - 1]; }
};

struct ThreadScopes {
  Stack steps, phases, layers;
  uint64_t next_id = 1;
  StepListener* listener = nullptr;
};

thread_local ThreadScopes t_scopes;

void open(Stack& stack, const char* name) {
  stack.push(name, t_scopes.next_id++);
  nvtx_push(name);
}

void close(Stack& stack) {
  nvtx_pop();
  stack.pop();
}

}  // namespace

ScopeInfo current_step() { return t_scopes.steps.top(); }
ScopeInfo current_phase() { return t_scopes.phases.top(); }
ScopeInfo current_layer() { return t_scopes.layers.top(); }

uint64_t reserve_scope_ids(uint64_t n) {
  const uint64_t first = t_scopes.next_id;
  t_scopes.next_id += n;
  return first;
}

void set_step_listener(StepListener* listener) { t_scopes.listener = listener; }
StepListener* step_listener() { return t_scopes.listener; }

StepScope::StepScope(const char* name) {
  open(t_scopes.steps, name);
  if (t_scopes.steps.depth == 1 && t_scopes.listener) t_scopes.listener->step_opened();
}

StepScope::~StepScope() {
  if (t_scopes.steps.depth == 1 && t_scopes.listener) t_scopes.listener->step_closed();
  close(t_scopes.steps);
}

PhaseScope::PhaseScope(const char* name) { open(t_scopes.phases, name); }
PhaseScope::~PhaseScope() { close(t_scopes.phases); }

void PhaseScope::next(const char* name) {
  close(t_scopes.phases);
  open(t_scopes.phases, name);
}

LayerScope::LayerScope(const char* label) { open(t_scopes.layers, label); }
LayerScope::~LayerScope() { close(t_scopes.layers); }

}  // namespace nt::profile
