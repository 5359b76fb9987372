// The profiler's seam in the one launch path.
//
// Every GPU kernel launch (kernels/cuda/launch.cuh) and every CPU op (kernels/cpu/op_scope.h) calls
// begin() before and end() after its work when the execution handle carries an observer. With no
// observer (profiling off) nothing is recorded and nothing else changes.
#pragma once

namespace nt::profile {

// What one launch costs, as the op itself counts it, so a report can show GB/s and GFLOP/s.
struct OpCost {
  double bytes = 0;  // the fewest bytes the op must move through memory (each input read once, output written once)
  double flops = 0;  // floating-point operations (a fused multiply-add counts 2)
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
};

}  // namespace nt::profile
