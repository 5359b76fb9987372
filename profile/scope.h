// Where the engine is: the current step, phase and layer, kept per thread by RAII scopes that the engine
// opens (Trainer: steps and phases; Model: layers). The profiler reads them at every launch, so no op and no
// kernel ever takes a phase or layer argument.
//
//   profile::StepScope step("train_step");   // a unit of queued work with no host synchronization inside
//   profile::PhaseScope phase("data");       // data, forward, loss, backward, update, eval
//   ...; phase.next("forward");              // close one phase and open the next
//   profile::LayerScope layer("0 linear 784->320 +relu");
//
// Each scope also opens an NVTX range of the same name, so Nsight Systems shows the same structure.
// Cost with nobody profiling: a few stores to a thread-local stack and an NVTX push/pop (a no-op when no
// tool is attached). Scopes nest; the innermost phase and layer are the current ones.
//
// Names are borrowed: they must outlive the scope (string literals, or labels the model keeps). Whoever keeps
// a name beyond the scope (the profiler) copies it.
#pragma once

#include <cstdint>
#include <string>

namespace nt::profile {

struct ScopeInfo {
  const char* name = nullptr;  // nullptr: no scope of this kind is open
  uint64_t id = 0;             // unique per opening on this thread: tells apart two openings of one name
};

ScopeInfo current_step();
ScopeInfo current_phase();
ScopeInfo current_layer();

// n ids that no scope of this thread has or will have: the profiler gives each replay of a captured graph
// fresh ids for the scopes recorded at capture, so the trace shows every replayed step as its own range.
uint64_t reserve_scope_ids(uint64_t n);

// Told when the outermost step of its thread opens and closes (the profiler uses it to hold the GPU behind
// the host for the length of a step; see kernel_profiler.h).
class StepListener {
 public:
  virtual ~StepListener() = default;
  virtual void step_opened() noexcept = 0;
  virtual void step_closed() noexcept = 0;
};
void set_step_listener(StepListener* listener);  // this thread's; nullptr = none
StepListener* step_listener();

class StepScope {
 public:
  explicit StepScope(const char* name);
  ~StepScope();
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;
};

class PhaseScope {
 public:
  explicit PhaseScope(const char* name);
  ~PhaseScope();
  void next(const char* name);  // the same as closing this scope and opening a new one
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;
};

class LayerScope {
 public:
  explicit LayerScope(const char* label);
  explicit LayerScope(const std::string& label) : LayerScope(label.c_str()) {}
  explicit LayerScope(std::string&&) = delete;  // a temporary would die before the scope does
  ~LayerScope();
  LayerScope(const LayerScope&) = delete;
  LayerScope& operator=(const LayerScope&) = delete;
};

}  // namespace nt::profile
