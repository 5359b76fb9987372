#include "kernels/runtime.h"

#include "kernels/dispatch.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <system_error>

#if NT_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#endif

namespace nt::kernels {

namespace {
std::atomic<uint64_t> g_alloc_count{0};
constexpr size_t kHostAlignment = 64;  // one cache line, and 16-float vectors

#if NT_WITH_CUDA
cudaStream_t stream_of(const Exec& exec) { return static_cast<cudaStream_t>(exec.stream); }
#endif
}  // namespace

#if NT_WITH_CUDA
namespace cuda {
int running_code_arch();            // kernels/cuda/probe.cu
bool running_warpgroup_mma_code();  // kernels/cuda/probe.cu
}  // namespace cuda
#endif

void throw_no_cuda_backend() { throw Error("this build of nanotrain has no CUDA backend"); }
void throw_cpu_only(const char* what) { throw Error(cat(what, " runs on the CPU backend only")); }

// ---- devices ---------------------------------------------------------------------------------------

bool cuda_built() { return NT_WITH_CUDA != 0; }

const char* cuda_built_for() {
#if NT_WITH_CUDA
  return NT_CUDA_ARCHS;
#else
  return "none";
#endif
}

int cuda_device_count() {
#if NT_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

DeviceInfo cuda_device_info(int device) {
  DeviceInfo info;
  info.index = device;
#if NT_WITH_CUDA
  cudaDeviceProp prop{};
  NT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.total_memory = prop.totalGlobalMem;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  int previous = 0;
  NT_CUDA_CHECK(cudaGetDevice(&previous));
  NT_CUDA_CHECK(cudaSetDevice(device));
  // cudaFree(nullptr) opens the context: it fails when the device is busy in exclusive mode, out of memory, or
  // otherwise unable to take another process.
  if (cudaError_t err = cudaFree(nullptr); err != cudaSuccess) {
    info.open_error = cat(cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
    cudaGetLastError();
  } else {
    info.code_arch = cuda::running_code_arch();
    info.warpgroup_mma = cuda::running_warpgroup_mma_code();
    size_t total = 0;
    if (cudaMemGetInfo(&info.free_memory, &total) != cudaSuccess) cudaGetLastError();
  }
  NT_CUDA_CHECK(cudaSetDevice(previous));
#else
  throw Error("this build of nanotrain has no CUDA backend");
#endif
  return info;
}

std::string DeviceInfo::code_path() const {
  if (!open_error.empty()) return "cannot be opened: " + open_error;
  if (code_arch == 0) return "no code for it in this build";
  const char* features = warpgroup_mma    ? "clusters, programmatic launch, TF32 tensor cores, warpgroup MMAs (sm_90a)"
                         : has_clusters() ? "clusters, programmatic launch, TF32 tensor cores"
                         : has_tf32()     ? "TF32 tensor cores (clusters and programmatic launch need sm_90 code)"
                                          : "fp32 only (TF32 tensor cores need sm_80 code, clusters sm_90)";
  return cat("compute_", code_arch, " code: ", features);
}

namespace {
// An NVIDIA GPU is there even if CUDA cannot reach it: the kernel driver's device node or its GPU list.
bool nvidia_gpu_present() {
  std::error_code ec;
  const std::filesystem::path gpus = "/proc/driver/nvidia/gpus";
  return std::filesystem::exists("/dev/nvidia0", ec) ||
         (std::filesystem::is_directory(gpus, ec) && !std::filesystem::is_empty(gpus, ec));
}

[[maybe_unused]] std::string cuda_version_text(int version) { return cat(version / 1000, ".", version % 1000 / 10); }
}  // namespace

std::string cuda_unusable_reason() {
#if NT_WITH_CUDA
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  cudaGetLastError();
  if (err == cudaSuccess && n > 0) return "";
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);  // 0 when no driver library could be loaded
  cudaRuntimeGetVersion(&runtime);
  cudaGetLastError();
  // A newer runtime runs on any driver of its major version (CUDA's minor version compatibility).
  if (driver > 0 && driver / 1000 < runtime / 1000)
    return cat("the NVIDIA driver supports CUDA ", cuda_version_text(driver), " but this build needs CUDA ",
               cuda_version_text(runtime), ": update the driver, or build with a CUDA toolkit of ",
               cuda_version_text(driver), " or older");
  if (!nvidia_gpu_present()) return "";
  if (driver == 0)
    return "an NVIDIA GPU is present but the CUDA driver library (libcuda.so.1) cannot be loaded: install the "
           "NVIDIA driver's user-space libraries";
  return cat("an NVIDIA GPU is present but CUDA finds no usable device (", cudaGetErrorName(err), ": ",
             cudaGetErrorString(err), "): check the driver with nvidia-smi");
#else
  if (!nvidia_gpu_present()) return "";
  return "an NVIDIA GPU is present but this build of nanotrain has no CUDA backend: install the CUDA toolkit "
         "(nvcc) and rerun scripts/setup";
#endif
}

void cuda_set_device(int device) {
#if NT_WITH_CUDA
  NT_CUDA_CHECK(cudaSetDevice(device));
#else
  (void)device;
  throw Error("this build of nanotrain has no CUDA backend");
#endif
}

// ---- memory ----------------------------------------------------------------------------------------

void* device_alloc(Backend backend, size_t bytes) {
  g_alloc_count.fetch_add(1, std::memory_order_relaxed);
  if (bytes == 0) bytes = 1;
  if (backend == Backend::cpu) {
    size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    void* p = std::aligned_alloc(kHostAlignment, rounded);
    if (!p) throw OutOfMemory(cat("out of host memory allocating ", bytes, " bytes"));
    return p;
  }
#if NT_WITH_CUDA
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw OutOfMemory(cat("out of GPU memory allocating ", bytes, " bytes: ", cudaGetErrorString(err)));
  }
  return p;
#else
  throw Error("this build of nanotrain has no CUDA backend");
#endif
}

void device_free(Backend backend, void* ptr) noexcept {
  if (!ptr) return;
  if (backend == Backend::cpu) {
    std::free(ptr);
    return;
  }
#if NT_WITH_CUDA
  NT_CUDA_CHECK_NOTHROW(cudaFree(ptr));
#endif
}

uint64_t device_alloc_count() { return g_alloc_count.load(std::memory_order_relaxed); }

#if NT_WITH_CUDA
#define NT_COPY(exec, dst, src, bytes, kind)                                  \
  do {                                                                        \
    if ((exec).on_cuda()) {                                                   \
      NT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream_of(exec))); \
      return;                                                                 \
    }                                                                         \
    if (bytes) std::memcpy(dst, src, bytes);                                  \
  } while (0)
#else
#define NT_COPY(exec, dst, src, bytes, kind) \
  do {                                       \
    (void)(exec);                            \
    if (bytes) std::memcpy(dst, src, bytes); \
  } while (0)
#endif

void copy_host_to_device(const Exec& exec, void* dst, const void* src, size_t bytes) {
  NT_COPY(exec, dst, src, bytes, cudaMemcpyHostToDevice);
}
void copy_device_to_host(const Exec& exec, void* dst, const void* src, size_t bytes) {
  NT_COPY(exec, dst, src, bytes, cudaMemcpyDeviceToHost);
}
void copy_device_to_device(const Exec& exec, void* dst, const void* src, size_t bytes) {
  NT_COPY(exec, dst, src, bytes, cudaMemcpyDeviceToDevice);
}
#undef NT_COPY

void fill_zero(const Exec& exec, void* dst, size_t bytes) {
#if NT_WITH_CUDA
  if (exec.on_cuda()) {
    NT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_of(exec)));
    return;
  }
#else
  (void)exec;
#endif
  if (bytes) std::memset(dst, 0, bytes);
}

void synchronize(const Exec& exec) {
#if NT_WITH_CUDA
  if (exec.on_cuda()) NT_CUDA_CHECK(cudaStreamSynchronize(stream_of(exec)));
#else
  (void)exec;
#endif
}

// ---- streams ---------------------------------------------------------------------------------------

void* create_stream() {
#if NT_WITH_CUDA
  cudaStream_t s = nullptr;
  NT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
#else
  throw Error("this build of nanotrain has no CUDA backend");
#endif
}

void destroy_stream(void* stream) noexcept {
#if NT_WITH_CUDA
  if (stream) NT_CUDA_CHECK_NOTHROW(cudaStreamDestroy(static_cast<cudaStream_t>(stream)));
#else
  (void)stream;
#endif
}

SideStream::SideStream(const Exec& main) : main_(main), side_(main) {
  if (!main.on_cuda()) return;
#if NT_WITH_CUDA
  side_.stream = create_stream();
  // Events without timing: they only order the two streams.
  for (void** e : {&forked_, &done_}) {
    cudaEvent_t event = nullptr;
    NT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    *e = event;
  }
#endif
}

SideStream::~SideStream() {
#if NT_WITH_CUDA
  for (void* e : {forked_, done_})
    if (e) NT_CUDA_CHECK_NOTHROW(cudaEventDestroy(static_cast<cudaEvent_t>(e)));
  if (side_.stream != main_.stream) destroy_stream(side_.stream);
#endif
}

SideStream::SideStream(SideStream&& other) noexcept { *this = std::move(other); }

SideStream& SideStream::operator=(SideStream&& other) noexcept {
  std::swap(main_, other.main_);
  std::swap(side_, other.side_);
  std::swap(forked_, other.forked_);
  std::swap(done_, other.done_);
  std::swap(forked_since_join_, other.forked_since_join_);
  return *this;
}

void SideStream::fork() const {
  if (!main_.on_cuda()) return;
  forked_since_join_ = true;
#if NT_WITH_CUDA
  NT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(forked_), stream_of(main_)));
  NT_CUDA_CHECK(cudaStreamWaitEvent(stream_of(side_), static_cast<cudaEvent_t>(forked_), 0));
#endif
}

void SideStream::join() const {
  if (!main_.on_cuda() || !forked_since_join_) return;
  forked_since_join_ = false;
#if NT_WITH_CUDA
  NT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(done_), stream_of(side_)));
  NT_CUDA_CHECK(cudaStreamWaitEvent(stream_of(main_), static_cast<cudaEvent_t>(done_), 0));
#endif
}

// ---- graphs ----------------------------------------------------------------------------------------

Graph::~Graph() {
#if NT_WITH_CUDA
  if (exec_) NT_CUDA_CHECK_NOTHROW(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_)));
  if (graph_) NT_CUDA_CHECK_NOTHROW(cudaGraphDestroy(static_cast<cudaGraph_t>(graph_)));
#endif
}

Graph::Graph(Graph&& other) noexcept { *this = std::move(other); }

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    std::swap(graph_, other.graph_);
    std::swap(exec_, other.exec_);
    std::swap(nodes_, other.nodes_);
    std::swap(observer_, other.observer_);
    std::swap(sequence_, other.sequence_);
    std::swap(stamped_, other.stamped_);
  }
  return *this;
}

Graph Graph::capture(const Exec& exec, const std::function<void()>& record) {
  NT_CHECK(exec.on_cuda(), "graphs exist on the CUDA backend only");
  NT_CHECK(!exec.debug_sync, "debug-sync synchronizes after every launch, which capture forbids");
  Graph g;
#if NT_WITH_CUDA
  cudaStream_t s = stream_of(exec);
  const bool stamped = exec.observer && exec.observer->times_with_launch_stamps();
  if (stamped) prepare_launch_stamps();  // before the capture, which forbids what loading them may do (allocate)
  NT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  if (exec.observer) exec.observer->capture_begin();
  try {
    record();
    if (stamped) close_launch_stamps(exec), g.stamped_ = true;
  } catch (...) {
    if (exec.observer) exec.observer->capture_end();
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(s, &broken);
    if (broken) cudaGraphDestroy(broken);
    cudaGetLastError();
    throw;
  }
  if (exec.observer) g.observer_ = exec.observer, g.sequence_ = exec.observer->capture_end();
  cudaGraph_t graph = nullptr;
  NT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  g.graph_ = graph;
  NT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &g.nodes_));
  cudaGraphExec_t instance = nullptr;
  NT_CUDA_CHECK(cudaGraphInstantiate(&instance, graph, 0));
  g.exec_ = instance;
#else
  (void)record;
#endif
  return g;
}

void Graph::launch(const Exec& exec) const {
  NT_CHECK(exec_ != nullptr, "launching an empty graph");
  NT_CHECK(exec.observer == nullptr || exec.observer == observer_,
           "a graph captured without the profiler now attached cannot be profiled: capture it again");
  NT_CHECK(!stamped_ || exec.observer == observer_,
           "a graph captured under the launch-stamps timer writes into that profiler's ring: capture it again");
#if NT_WITH_CUDA
  NT_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream_of(exec)));
  if (exec.observer) exec.observer->replayed(sequence_, exec.stream);
  if (exec.debug_sync) NT_CUDA_CHECK(cudaStreamSynchronize(stream_of(exec)));
#else
  (void)exec;
#endif
}

// ---- stream marks ----------------------------------------------------------------------------------

StreamMarks::StreamMarks(Backend backend, int count)
    : backend_(backend), events_(static_cast<size_t>(count), nullptr), host_stamps_(static_cast<size_t>(count), 0.0) {
  if (backend == Backend::cpu) return;
#if NT_WITH_CUDA
  for (void*& e : events_) {
    cudaEvent_t event = nullptr;
    NT_CUDA_CHECK(cudaEventCreate(&event));  // with timing: the device's clock paces the progress line
    e = event;
  }
#else
  throw Error("this build of nanotrain has no CUDA backend");
#endif
}

StreamMarks::~StreamMarks() {
#if NT_WITH_CUDA
  for (void* e : events_)
    if (e) NT_CUDA_CHECK_NOTHROW(cudaEventDestroy(static_cast<cudaEvent_t>(e)));
#endif
}

StreamMarks::StreamMarks(StreamMarks&& other) noexcept { *this = std::move(other); }

StreamMarks& StreamMarks::operator=(StreamMarks&& other) noexcept {
  std::swap(backend_, other.backend_);
  std::swap(events_, other.events_);
  std::swap(host_stamps_, other.host_stamps_);
  return *this;
}

void StreamMarks::record(const Exec& exec, int mark) {
  const auto i = static_cast<size_t>(mark);
  if (backend_ == Backend::cpu) {
    host_stamps_.at(i) =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
    return;
  }
#if NT_WITH_CUDA
  // In a capture the record must be external to become a node of the graph (otherwise it would only order the
  // capture's streams); outside one that flag is refused.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  NT_CUDA_CHECK(cudaStreamIsCapturing(stream_of(exec), &capture));
  const unsigned flags = capture == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault;
  NT_CUDA_CHECK(cudaEventRecordWithFlags(static_cast<cudaEvent_t>(events_.at(i)), stream_of(exec), flags));
#else
  (void)exec;
#endif
}

bool StreamMarks::passed(int mark) const {
  if (backend_ == Backend::cpu) return true;
#if NT_WITH_CUDA
  const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(events_.at(static_cast<size_t>(mark))));
  if (state == cudaErrorNotReady) return false;
  NT_CUDA_CHECK(state);
#else
  (void)mark;
#endif
  return true;
}

void StreamMarks::wait(int mark) const {
  if (backend_ == Backend::cpu) return;
#if NT_WITH_CUDA
  NT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(events_.at(static_cast<size_t>(mark)))));
#else
  (void)mark;
#endif
}

double StreamMarks::ms_between(int from, int to) const {
  if (backend_ == Backend::cpu)
    return host_stamps_.at(static_cast<size_t>(to)) - host_stamps_.at(static_cast<size_t>(from));
  float ms = 0;
#if NT_WITH_CUDA
  NT_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_.at(static_cast<size_t>(from))),
                                     static_cast<cudaEvent_t>(events_.at(static_cast<size_t>(to)))));
#endif
  return ms;
}

}  // namespace nt::kernels
