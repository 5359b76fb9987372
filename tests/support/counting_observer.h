// A launch observer for tests: counts every launch the launch path reports, keyed by the kernel and the
// phase and layer scopes open at that moment, and passes it on. An account of what ran that does not go
// through the profiler under test. Launches captured into a CUDA graph count at each replay of the graph.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "profile/launch_observer.h"
#include "profile/scope.h"

namespace nt::test {

using LaunchKey = std::tuple<std::string, std::string, std::string>;  // kernel, phase, layer

struct CountingObserver : profile::LaunchObserver {
  profile::LaunchObserver* next = nullptr;
  std::map<LaunchKey, int64_t> calls;
  int64_t launches = 0;
  int64_t captures = 0;

  static std::string or_empty(const char* s) { return s ? s : ""; }

  void begin(const char* kernel, void* stream) override {
    auto& into = capturing_ ? sequences_.back().calls : calls;
    ++into[{kernel, or_empty(profile::current_phase().name), or_empty(profile::current_layer().name)}];
    ++(capturing_ ? sequences_.back().launches : launches);
    if (next) next->begin(kernel, stream);
  }
  void end(const char* kernel, void* stream, const profile::OpCost& cost) override {
    if (next) next->end(kernel, stream, cost);
  }

  bool times_graph_replays() const override { return next && next->times_graph_replays(); }
  void capture_begin() override {
    capturing_ = true;
    ++captures;
    sequences_.emplace_back();
    if (next) next->capture_begin();
  }
  int capture_end() override {
    capturing_ = false;
    sequences_.back().next_sequence = next ? next->capture_end() : -1;
    return static_cast<int>(sequences_.size()) - 1;
  }
  void replayed(int sequence, void* stream) override {
    const Sequence& seq = sequences_.at(static_cast<size_t>(sequence));
    for (const auto& [key, n] : seq.calls) calls[key] += n;
    launches += seq.launches;
    if (next) next->replayed(seq.next_sequence, stream);
  }

 private:
  struct Sequence {
    std::map<LaunchKey, int64_t> calls;
    int64_t launches = 0;
    int next_sequence = -1;
  };
  std::vector<Sequence> sequences_;
  bool capturing_ = false;
};

}  // namespace nt::test
