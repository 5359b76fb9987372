// The runtime seam: devices, memory, streams and graphs behind one backend-neutral API, so that
// engine/ and the tests never include a CUDA header. CPU versions are the obvious host operations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/exec.h"

namespace nt::kernels {

// ---- devices -------------------------------------------------------------------------------------
// A device, and what this binary's code can do on it. The code is what was compiled for the device's architecture,
// or else the newest PTX not above it, which the driver compiles on first use: a compute_80 build runs on an H100
// as it would on an A100, without clusters or programmatic launch. The features below are the code's, not the
// chip's alone.
struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_count = 0;
  size_t total_memory = 0;  // bytes
  size_t free_memory = 0;   // bytes, when the device was asked
  int cc_major = 0, cc_minor = 0;
  int code_arch = 0;           // the virtual architecture of the code that runs there (90: compute_90), 0: none
  bool warpgroup_mma = false;  // that code is sm_90a's, whose kernels may use wgmma (the channels-last convolution)
  std::string open_error;      // why no context could be opened on the device; "" when one could

  bool runs_code() const { return open_error.empty() && code_arch > 0; }
  bool has_tf32() const { return runs_code() && code_arch >= 80; }  // mma.sync on TF32 operands, cp.async
  bool has_clusters() const { return runs_code() && code_arch >= 90 && cc_major >= 9; }
  bool has_programmatic_launch() const { return has_clusters(); }  // both came with sm_90
  std::string code_path() const;  // "sm_90 code: clusters, programmatic launch, TF32 tensor cores"
};

bool cuda_built();                        // this binary contains the CUDA backend
const char* cuda_built_for();             // the architectures it was compiled for: "sm_75,sm_80,sm_90,compute_90"
int cuda_device_count();                  // 0 without a CUDA build, a driver or a GPU (never throws)
DeviceInfo cuda_device_info(int device);  // opens a context on the device to ask what runs there
void cuda_set_device(int device);
// Why an NVIDIA GPU that seems present cannot be used at all (driver too old or missing, no CUDA backend in this
// build), with the fix; "" when CUDA devices are usable, or when the machine shows no NVIDIA GPU.
std::string cuda_unusable_reason();

// ---- memory --------------------------------------------------------------------------------------
// One allocation path for every buffer of the engine; the count lets tests prove that a training
// step allocates nothing.
void* device_alloc(Backend backend, size_t bytes);  // 64-byte aligned on the CPU, cudaMalloc on the GPU
void device_free(Backend backend, void* ptr) noexcept;
uint64_t device_alloc_count();  // allocations made so far, both backends

// Stream-ordered copies and fills on exec's stream (plain and immediate on the CPU).
void copy_host_to_device(const Exec& exec, void* dst, const void* src, size_t bytes);
void copy_device_to_host(const Exec& exec, void* dst, const void* src, size_t bytes);
void copy_device_to_device(const Exec& exec, void* dst, const void* src, size_t bytes);
void fill_zero(const Exec& exec, void* dst, size_t bytes);
void synchronize(const Exec& exec);

// ---- streams -------------------------------------------------------------------------------------
void* create_stream();  // a non-blocking cudaStream_t
void destroy_stream(void* stream) noexcept;

// Work that runs beside a stream's own: fork() makes the side stream wait for what the main stream has enqueued so
// far, join() makes the main stream wait for what the side stream has enqueued. Inside a capture both become edges of
// the graph. A data-parallel step all-reduces each bucket of gradients here while the backward pass goes on
// (engine/trainer.h), and a single GPU's step computes weight gradients here that only the optimizer reads
// (Conv2dArgs::weight_side). join() after no fork does nothing (a capture must not wait for work outside it). On the
// CPU, whose ops run as they are called, exec() is the main one and fork and join do nothing.
class SideStream {
 public:
  SideStream() = default;
  explicit SideStream(const Exec& main);
  ~SideStream();
  SideStream(SideStream&& other) noexcept;
  SideStream& operator=(SideStream&& other) noexcept;
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  const Exec& exec() const { return side_; }
  // e on the side stream: its math, observer and the rest as they are (an op's exec may differ from the one the side
  // stream was made with).
  Exec beside(const Exec& e) const {
    Exec on_side = e;
    on_side.stream = side_.stream;
    return on_side;
  }
  void fork() const;
  void join() const;

 private:
  Exec main_, side_;
  void* forked_ = nullptr;  // cudaEvent_t: the main stream's work so far
  void* done_ = nullptr;    // cudaEvent_t: the side stream's
  mutable bool forked_since_join_ = false;
};

// ---- graphs --------------------------------------------------------------------------------------
// The closing launch of a graph captured under the launch-stamps timer (profile/launch_stamps.h): a kernel that only
// waits for its predecessor, so that the graph's last kernel has an end. Graph::capture adds it when the observer
// asks (LaunchObserver::times_with_launch_stamps).
void close_launch_stamps(const Exec& exec);
// Loads the kernels' stamping twins (kernels/cuda/stamping_twins.h) ahead of a capture under that timer.
void prepare_launch_stamps();

// A captured sequence of stream work, replayed with one launch. Capture runs in the global mode, so
// any synchronizing or allocating call inside `record` fails the capture: a training step that
// captures is proven free of them. A graph captured while a profiler observes (exec.observer) tells it of
// the capture and of every launch (profile/launch_observer.h); it can be launched only under that
// observer or none, and observed_by() lets its owner capture again when the observer has changed. One captured under
// the launch-stamps timer holds that profiler's ring in its kernels' parameters: it is launched under that profiler
// only (bound_to_observer()).
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  static Graph capture(const Exec& exec, const std::function<void()>& record);
  void launch(const Exec& exec) const;
  bool empty() const { return exec_ == nullptr; }
  size_t node_count() const { return nodes_; }
  const profile::LaunchObserver* observed_by() const { return observer_; }
  bool bound_to_observer() const { return stamped_; }

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  size_t nodes_ = 0;
  profile::LaunchObserver* observer_ = nullptr;  // that saw the capture
  int sequence_ = -1;                            // its name for the captured launches
  bool stamped_ = false;                         // its kernels write launch stamps into observer_'s ring
};

// ---- stream marks --------------------------------------------------------------------------------
// Points in a stream's order that the host can ask about without stopping the stream, each stamped with the time
// the stream passed it: a training epoch records one every few steps so that a person can watch it (engine/trainer.h,
// on_progress). Recorded during a capture, a mark is a node of the graph (an external event record) and is passed
// again on every replay. On the CPU, whose ops run as they are called, a mark is passed when it is recorded.
class StreamMarks {
 public:
  StreamMarks() = default;
  StreamMarks(Backend backend, int count);
  ~StreamMarks();
  StreamMarks(StreamMarks&& other) noexcept;
  StreamMarks& operator=(StreamMarks&& other) noexcept;
  StreamMarks(const StreamMarks&) = delete;
  StreamMarks& operator=(const StreamMarks&) = delete;

  int size() const { return static_cast<int>(events_.size()); }
  void record(const Exec& exec, int mark);  // enqueues mark `mark` on exec's stream
  bool passed(int mark) const;              // whether the stream has passed it; never waits
  void wait(int mark) const;                // blocks the host (not the stream) until it has
  // Milliseconds between the stream's passing two marks that it has passed (the device's clock on the GPU).
  double ms_between(int from, int to) const;

 private:
  Backend backend_ = Backend::cpu;
  std::vector<void*> events_;        // cudaEvent_t each on the GPU
  std::vector<double> host_stamps_;  // the CPU's: milliseconds on the steady clock when recorded
};

}  // namespace nt::kernels
