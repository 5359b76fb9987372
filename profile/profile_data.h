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
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "profile/ceilings.h"
#include "profile/launch_observer.h"

namespace nt::profile {

inline constexpr int kNoName = -1;

struct Launch {
  int kernel = kNoName;
  int step = kNoName, phase = kNoName, layer = kNoName;  // scope names (kNoName: outside any)
  uint64_t step_id = 0, phase_id = 0, layer_id = 0;      // scope openings (0: none), for the trace's ranges
  int stream = 0;                                        // the stream it ran on, numbered in order of first use
  // Two times, from the profiler's reference point (docs/profiler.md, "Span and exclusive time"):
  double start_us = 0;      // where its span starts: the GPU's record of the kernel's start
  double span_us = 0;       // span: from that start to its end
  double exclusive_us = 0;  // from the later of its start and its stream predecessor's end, to its end (<= span)
  OpCost cost;              // of this launch

  double end_us() const { return start_us + span_us; }
  double exclusive_start_us() const { return end_us() - exclusive_us; }
  // The host clock and event pairs see no overlap: both times are the bracket.
  void set_bracket(double start, double duration) { start_us = start, span_us = exclusive_us = duration; }
};

// A slice of a launch that its kernel stamped from the device (profile/phase_stamps.h): the phase it named and
// where it lies, placed inside its launch's exclusive time.
struct PhaseSlice {
  size_t launch = 0;  // index into launches()
  int part = kNoName;
  double start_us = 0, dur_us = 0;
};

struct Row {
  std::string kernel, phase, layer;  // "" where no phase or layer was open
  std::string part;                  // a phase the kernel stamped (a child row of its kernel's); "" for the kernel
  int64_t calls = 0;
  double total_us = 0, min_us = 0, max_us = 0;  // exclusive times (a part: its slices)
  double span_us = 0;                           // summed spans
  double bytes = 0, flops = 0;                  // summed over the calls
  Math math = Math::fp32;                       // the arithmetic of its flops (the ceiling they are set against)
  bool overlaps_previous = false;               // its kernel ran beside its predecessor (OpCost::overlaps_previous)

  double avg_us() const { return calls ? total_us / static_cast<double>(calls) : 0.0; }
  double avg_span_us() const { return calls ? span_us / static_cast<double>(calls) : 0.0; }
  // Achieved rates over all calls (total bytes over total exclusive time); 0 when the op reports no bytes or flops.
  double gb_per_s() const { return total_us > 0 ? bytes / (total_us * 1e3) : 0.0; }
  double gflop_per_s() const { return total_us > 0 ? flops / (total_us * 1e3) : 0.0; }
};

// One step as the GPU ran it (the launches of one opening of a StepScope): the sum of its exclusive times, its wall
// time from the first kernel's exclusive start to the last end, and how much of its kernels' spans ran beside
// another kernel of the step.
struct StepSummary {
  uint64_t step_id = 0;
  int name = kNoName;
  int64_t kernels = 0;
  double start_us = 0;
  double exclusive_us = 0;  // sum over its kernels
  double span_us = 0;       // sum over its kernels
  double wall_us = 0;       // last end - first exclusive start
  double idle_us = 0;       // wall time with no kernel of the step resident
  double overlap_us = 0;    // span time beside another kernel: sum of spans - their union
};

class ProfileData {
 public:
  explicit ProfileData(size_t max_launches = 2'000'000) : max_launches_(max_launches) {}

  int intern(std::string_view name);      // "" (no scope open) -> kNoName
  const std::string& name(int id) const;  // "" for kNoName
  // Aggregates the launch into its row; returns its index in launches(), or kNotInTrace past max_launches.
  size_t add(const Launch& launch);
  static constexpr size_t kNotInTrace = SIZE_MAX;
  // A phase its kernel stamped (part: its name; order: its index among the kernel's declared phases, which orders
  // the child rows), placed at [start_us, start_us + dur_us). It adds to a child row of the launch's row, not to
  // kernel_us(): the launch's own time already holds it.
  void add_part(const Launch& parent, size_t parent_index, int part, int order, double start_us, double dur_us);

  // By total exclusive time, descending (ties by kernel, phase, layer); each kernel's stamped phases right after it,
  // in their declared order.
  std::vector<Row> rows() const;
  const std::vector<Launch>& launches() const { return launches_; }
  const std::vector<PhaseSlice>& parts() const { return parts_; }
  // One summary per step opening, in order, from the launches the trace kept.
  std::vector<StepSummary> step_summaries() const;
  int64_t launch_count() const { return launch_count_; }
  int64_t dropped() const { return launch_count_ - static_cast<int64_t>(launches_.size()); }
  double kernel_us() const { return kernel_us_; }  // summed exclusive times

  // Set by the profiler: the wall clock of the profiled window, where it ran, how often it synchronized, what
  // timed the kernels ("host", "cuda events", "cupti"), and how many launches the timer gave no time for
  // (CUPTI delivered no record: they are in no row, and the report says so). Sampling: one step in
  // sample_every was timed, sampled_steps of the steps opened in the window. Phase stamps a kernel wrote that
  // could not be placed (the buffer was full, or a launch's stamps lacked their end). The device's measured
  // ceilings, when known, for the roofline percentages.
  double wall_us = 0;
  std::string device;
  int64_t synchronizations = 0;
  std::string timer;
  int64_t launches_without_record = 0;
  int sample_every = 1;
  int64_t steps = 0, sampled_steps = 0;
  int64_t stamps_lost = 0;
  std::optional<Ceilings> ceilings;

 private:
  struct Key {
    int kernel, phase, layer, part;  // part: kNoName for the kernel's own row
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<int64_t>{}((int64_t(k.kernel) << 42) ^ (int64_t(k.phase) << 21) ^ int64_t(k.layer) ^
                                  (int64_t(k.part) << 52));
    }
  };
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  Row& row_for(const Key& key, const Launch& l);

  size_t max_launches_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, int, NameHash, std::equal_to<>> ids_;
  std::unordered_map<Key, Row, KeyHash> rows_;
  std::unordered_map<Key, int, KeyHash> part_order_;  // a child row's declared index
  std::vector<Launch> launches_;
  std::vector<PhaseSlice> parts_;
  int64_t launch_count_ = 0;
  double kernel_us_ = 0;
};

}  // namespace nt::profile
