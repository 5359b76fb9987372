// ProfileData: what a profiling run collected. One Launch per timed kernel (or CPU op), aggregated into one
// Row per (kernel, phase, layer): a kernel's launches from different layers have different shapes, so they
// are kept apart. Names are interned once; a launch holds small ids, not strings.
//
//   ProfileData d;
//   d.add({d.intern("gemm_bias_relu"), ...});   // the profiler does this at each flush
//   for (const Row& r : d.rows()) ...           // sorted by total time, largest first
//
// The per-launch list feeds the Chrome trace; past `max_launches` only the aggregates grow (dropped() says
// how many launches the trace lacks).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "profile/launch_observer.h"

namespace nt::profile {

inline constexpr int kNoName = -1;

struct Launch {
  int kernel = kNoName;
  int step = kNoName, phase = kNoName, layer = kNoName;  // scope names (kNoName: outside any)
  uint64_t step_id = 0, phase_id = 0, layer_id = 0;      // scope openings (0: none), for the trace's ranges
  double start_us = 0;                                   // from the profiler's reference point
  double dur_us = 0;
  double early_us = 0;  // CUPTI: how long the kernel was resident before its predecessor ended (clipped off dur)
  OpCost cost;          // of this launch
};

struct Row {
  std::string kernel, phase, layer;  // "" where no phase or layer was open
  int64_t calls = 0;
  double total_us = 0, min_us = 0, max_us = 0;
  double bytes = 0, flops = 0;  // summed over the calls

  double avg_us() const { return calls ? total_us / static_cast<double>(calls) : 0.0; }
  // Achieved rates over all calls (total bytes over total time); 0 when the op reports no bytes or flops.
  double gb_per_s() const { return total_us > 0 ? bytes / (total_us * 1e3) : 0.0; }
  double gflop_per_s() const { return total_us > 0 ? flops / (total_us * 1e3) : 0.0; }
};

class ProfileData {
 public:
  explicit ProfileData(size_t max_launches = 2'000'000) : max_launches_(max_launches) {}

  int intern(std::string_view name);      // "" (no scope open) -> kNoName
  const std::string& name(int id) const;  // "" for kNoName
  void add(const Launch& launch);

  std::vector<Row> rows() const;  // by total time, descending; ties by kernel, phase, layer
  const std::vector<Launch>& launches() const { return launches_; }
  int64_t launch_count() const { return launch_count_; }
  int64_t dropped() const { return launch_count_ - static_cast<int64_t>(launches_.size()); }
  double kernel_us() const { return kernel_us_; }

  // Set by the profiler: the wall clock of the profiled window, where it ran, how often it synchronized, what
  // timed the kernels ("host", "cuda events", "cupti"), and how many launches the timer gave no time for
  // (CUPTI delivered no record: they are in no row, and the report says so). Sampling: one step in
  // sample_every was timed, sampled_steps of the steps opened in the window.
  double wall_us = 0;
  std::string device;
  int64_t synchronizations = 0;
  std::string timer;
  int64_t launches_without_record = 0;
  int sample_every = 1;
  int64_t steps = 0, sampled_steps = 0;

 private:
  struct Key {
    int kernel, phase, layer;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<int64_t>{}((int64_t(k.kernel) << 42) ^ (int64_t(k.phase) << 21) ^ int64_t(k.layer));
    }
  };
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  size_t max_launches_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, int, NameHash, std::equal_to<>> ids_;
  std::unordered_map<Key, Row, KeyHash> rows_;
  std::vector<Launch> launches_;
  int64_t launch_count_ = 0;
  double kernel_us_ = 0;
};

}  // namespace nt::profile
