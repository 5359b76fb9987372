// A launch observer for tests: counts every launch the launch path reports, keyed by the kernel and the
// phase and layer scopes open at that moment, and passes it on. An account of what ran that does not go
// through the profiler under test.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "profile/launch_observer.h"
#include "profile/scope.h"

namespace nt::test {

using LaunchKey = std::tuple<std::string, std::string, std::string>;  // kernel, phase, layer

struct CountingObserver : profile::LaunchObserver {
  profile::LaunchObserver* next = nullptr;
  std::map<LaunchKey, int64_t> calls;
  int64_t launches = 0;

  static std::string or_empty(const char* s) { return s ? s : ""; }

  void begin(const char* kernel, void* stream) override {
    ++calls[{kernel, or_empty(profile::current_phase().name), or_empty(profile::current_layer().name)}];
    ++launches;
    if (next) next->begin(kernel, stream);
  }
  void end(const char* kernel, void* stream, const profile::OpCost& cost) override {
    if (next) next->end(kernel, stream, cost);
  }
};

}  // namespace nt::test
