// The profiler's seam in the one launch path.
//
// Every GPU kernel launch (kernels/cuda/launch.cuh) and every CPU op (kernels/cpu/op_scope.h) calls
// begin() before and end() after its work when the execution handle carries an observer. With no
// observer (profiling off) nothing is recorded and nothing else changes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "profile/launch_stamps.h"
#include "profile/phase_stamps.h"

namespace nt::profile {

// The arithmetic an op's flops run on, which decides the ceiling a report sets them against (profile/ceilings.h):
// fp32 on the CUDA cores, or TF32 or BF16 operands on the tensor cores.
enum class Math : uint8_t { fp32, tf32, bf16 };
const char* math_name(Math m);  // "fp32", "tf32", "bf16"

// What one launch costs, as the op itself counts it, so a report can show GB/s and GFLOP/s.
struct OpCost {
  double bytes = 0;  // the fewest bytes the op must move through memory (each input read once, output written once)
  double flops = 0;  // floating-point operations (a fused multiply-add counts 2)
  Math math = Math::fp32;
  // Declared by the op: the kernel runs beside its stream predecessor instead of after it (launch.cuh,
  // begin_overlapping_kernel), or does part of its work before its wait (the stem's staging). Its exclusive time is
  // then how far it extends the stream, not its length; the report marks its row. The launch path clears it when the
  // launch is not programmatic, and nothing overlaps.
  bool overlaps_previous = false;
};

class LaunchObserver {
 public:
  virtual ~LaunchObserver() = default;
  // stream: the cudaStream_t the kernel goes to, or nullptr for a CPU op.
  virtual void begin(const char* kernel, void* stream) = 0;
  virtual void end(const char* kernel, void* stream, const OpCost& cost) = 0;

  // CUDA graphs (kernels/runtime.h, Graph). Launches observed between capture_begin() and capture_end() are
  // recorded into a graph, not run; capture_end() names that sequence, and each launch of the graph reports
  // replayed(sequence). An observer that cannot time replays returns false from times_graph_replays(): the
  // engine then launches eagerly while it observes.
  virtual bool times_graph_replays() const { return false; }
  virtual void capture_begin() {}
  virtual int capture_end() { return -1; }
  virtual void replayed(int sequence, void* stream) {
    (void)sequence;
    (void)stream;
  }
  // Launch stamps (profile/launch_stamps.h). times_with_launch_stamps(): this observer times the kernels of the
  // graphs captured under it with them; such a graph ends with the closing launch (kLaunchStampsClose).
  // launch_stamp_ring(): asked by the launch path after begin(), the ring the launch just begun stamps into, which
  // makes the launch run its kernel's stamping twin (kernels/cuda/stamping_twins.h); empty: the plain kernel.
  virtual bool times_with_launch_stamps() const { return false; }
  virtual LaunchStampRing launch_stamp_ring() const { return {}; }

  // Phase stamps for the next launch (profile/phase_stamps.h): the kernel marks the phases named here, by index.
  // The names must outlive the profiler (string literals). An observer that keeps no stamps returns an empty set.
  // (A pointer and a count rather than std::span: the CUDA sources that include this are C++17.)
  virtual PhaseStamps phase_stamps(const char* const* names, size_t count) {
    (void)names;
    (void)count;
    return {};
  }
};

// What a launcher passes its kernel: the observer's stamps, or none when nothing observes.
inline PhaseStamps phase_stamps_for(LaunchObserver* observer, const char* const* names, size_t count) {
  return observer ? observer->phase_stamps(names, count) : PhaseStamps{};
}

}  // namespace nt::profile
