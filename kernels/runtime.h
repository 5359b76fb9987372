// The runtime seam: devices, memory, streams and graphs behind one backend-neutral API, so that
// engine/ and the tests never include a CUDA header. CPU versions are the obvious host operations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "kernels/exec.h"

namespace nt::kernels {

// ---- devices -------------------------------------------------------------------------------------
struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_count = 0;
  size_t total_memory = 0;  // bytes
  int cc_major = 0, cc_minor = 0;
};

bool cuda_built();             // this binary contains the CUDA backend
int cuda_device_count();       // 0 without a CUDA build, a driver or a GPU (never throws)
DeviceInfo cuda_device_info(int device);
// Whether this binary carries machine code (or PTX) the device can run; `built_for` lists the targets.
bool cuda_build_runs_on(const DeviceInfo& info, std::string* built_for);
void cuda_set_device(int device);

// ---- memory --------------------------------------------------------------------------------------
// One allocation path for every buffer of the engine; the count lets tests prove that a training
// step allocates nothing.
void* device_alloc(Backend backend, size_t bytes);  // 64-byte aligned on the CPU, cudaMalloc on the GPU
void device_free(Backend backend, void* ptr) noexcept;
uint64_t device_alloc_count();                       // allocations made so far, both backends

// Stream-ordered copies and fills on exec's stream (plain and immediate on the CPU).
void copy_host_to_device(const Exec& exec, void* dst, const void* src, size_t bytes);
void copy_device_to_host(const Exec& exec, void* dst, const void* src, size_t bytes);
void copy_device_to_device(const Exec& exec, void* dst, const void* src, size_t bytes);
void fill_zero(const Exec& exec, void* dst, size_t bytes);
void synchronize(const Exec& exec);

// ---- streams -------------------------------------------------------------------------------------
void* create_stream();                 // a non-blocking cudaStream_t
void destroy_stream(void* stream) noexcept;

// ---- graphs --------------------------------------------------------------------------------------
// A captured sequence of stream work, replayed with one launch. Capture runs in the global mode, so
// any synchronizing or allocating call inside `record` fails the capture: a training step that
// captures is proven free of them. A graph captured while a profiler observes (exec.observer) tells it of
// the capture and of every launch (profile/launch_observer.h); it can be launched only under that
// observer or none, and observed_by() lets its owner capture again when the observer has changed.
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

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  size_t nodes_ = 0;
  profile::LaunchObserver* observer_ = nullptr;  // that saw the capture
  int sequence_ = -1;                            // its name for the captured launches
};

}  // namespace nt::kernels
