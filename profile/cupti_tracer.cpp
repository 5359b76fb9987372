// CUPTI activity tracing for the kernel profiler: run-time loading, the activity buffers, and the pure
// matching of kernel records to our launches (see cupti_tracer.h).
//
// Threads. CUPTI calls buffer_requested() from the thread that needs a buffer (a launching thread or its
// worker thread) and buffer_completed() from its worker thread or from inside cuptiActivityFlushAll(). Both
// take State::mu; the profiler's thread takes it in collect(). The state and the buffers live for the whole
// process (never freed): CUPTI may hand a buffer back after a tracer has closed, and the library is never
// unloaded once it has been initialized.
#include "profile/cupti_tracer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "core/error.h"
#include "core/shared_library.h"

#if NT_WITH_CUPTI
#include <cupti.h>
#endif

#ifndef NT_CUPTI_TOOLKIT_LIBRARY_DIR
#define NT_CUPTI_TOOLKIT_LIBRARY_DIR ""
#endif

namespace nt::profile {

// ---- matching (pure) -------------------------------------------------------------------------------

CuptiMatch match_in_stream_order(std::span<const uint32_t> launch_streams, std::vector<CuptiKernelRecord> kernels) {
  CuptiMatch m;
  m.launches.resize(launch_streams.size());
  const auto invalid = [](const CuptiKernelRecord& k) { return k.start_ns == 0 || k.end_ns < k.start_ns; };
  m.invalid = std::erase_if(kernels, invalid);
  // By stream, then start time: each stream's records in the order its kernels ran.
  std::sort(kernels.begin(), kernels.end(), [](const CuptiKernelRecord& a, const CuptiKernelRecord& b) {
    return std::tie(a.stream_id, a.start_ns, a.end_ns) < std::tie(b.stream_id, b.start_ns, b.end_ns);
  });
  std::vector<uint32_t> streams;  // of the launches, in order of first use
  for (uint32_t s : launch_streams)
    if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
  std::vector<size_t> launches;  // of one stream
  size_t records_of_launched_streams = 0;
  for (uint32_t stream : streams) {
    launches.clear();
    for (size_t i = 0; i < launch_streams.size(); ++i)
      if (launch_streams[i] == stream) launches.push_back(i);
    const auto first = std::lower_bound(kernels.begin(), kernels.end(), stream,
                                        [](const CuptiKernelRecord& k, uint32_t s) { return k.stream_id < s; });
    const auto last = std::upper_bound(first, kernels.end(), stream,
                                       [](uint32_t s, const CuptiKernelRecord& k) { return s < k.stream_id; });
    const auto records = static_cast<size_t>(last - first);
    records_of_launched_streams += records;
    if (records != launches.size()) {  // nothing is guessed
      m.missing += static_cast<int64_t>(launches.size());
      m.extra += static_cast<int64_t>(records > launches.size() ? records - launches.size() : 0);
      continue;
    }
    uint64_t busy_until = 0;  // the latest end so far on this stream
    for (size_t k = 0; k < records; ++k) {
      const CuptiKernelRecord& r = first[static_cast<std::ptrdiff_t>(k)];
      const uint64_t exclusive_start = std::min(std::max(r.start_ns, busy_until), r.end_ns);
      m.clipped += exclusive_start != r.start_ns;
      m.launches[launches[k]] = {true, r.start_ns, r.end_ns, exclusive_start};
      busy_until = std::max(busy_until, r.end_ns);
    }
  }
  uint32_t previous = 0;
  for (size_t k = 0; k < kernels.size(); ++k) {
    m.streams += k == 0 || kernels[k].stream_id != previous;
    previous = kernels[k].stream_id;
  }
  m.extra += static_cast<int64_t>(kernels.size() - records_of_launched_streams);  // streams nobody launched on
  return m;
}

// ---- search ----------------------------------------------------------------------------------------

std::string cupti_soname() {
#if NT_WITH_CUPTI
  return "libcupti.so." + std::to_string(CUDA_VERSION / 1000);
#else
  return "libcupti.so.13";
#endif
}

CuptiSearch cupti_search() { return library_search("NT_CUPTI_LIBRARY", NT_CUPTI_TOOLKIT_LIBRARY_DIR); }

std::vector<std::string> cupti_candidates(const CuptiSearch& s) {
  return library_candidates(s, {cupti_soname(), "libcupti.so"});
}

// ---- loading ---------------------------------------------------------------------------------------

#if NT_WITH_CUPTI

struct CuptiApi {
  void* handle = nullptr;
  decltype(&::cuptiActivityEnable) enable = nullptr;
  decltype(&::cuptiActivityDisable) disable = nullptr;
  decltype(&::cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&::cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&::cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&::cuptiActivityGetNumDroppedRecords) dropped_records = nullptr;
  decltype(&::cuptiGetTimestamp) timestamp = nullptr;
  decltype(&::cuptiGetResultString) result_string = nullptr;
  decltype(&::cuptiGetVersion) version = nullptr;
  decltype(&::cuptiGetStreamIdEx) stream_id = nullptr;
  decltype(&::cuptiActivityFlushPeriod) flush_period = nullptr;  // optional: used when the library has it

  std::string describe(CUptiResult r) const {
    const char* text = nullptr;
    if (result_string && result_string(r, &text) == CUPTI_SUCCESS && text) return cat(text, " (", int(r), ")");
    return cat("CUPTI error ", int(r));
  }
};

namespace {

// Resolves every function the tracer calls, or names the one missing.
bool bind_cupti(void* handle, CuptiApi& api, std::string& missing) {
  const bool ok = resolve(handle, "cuptiActivityEnable", api.enable, missing) &&
                  resolve(handle, "cuptiActivityDisable", api.disable, missing) &&
                  resolve(handle, "cuptiActivityRegisterCallbacks", api.register_callbacks, missing) &&
                  resolve(handle, "cuptiActivityFlushAll", api.flush_all, missing) &&
                  resolve(handle, "cuptiActivityGetNextRecord", api.next_record, missing) &&
                  resolve(handle, "cuptiActivityGetNumDroppedRecords", api.dropped_records, missing) &&
                  resolve(handle, "cuptiGetTimestamp", api.timestamp, missing) &&
                  resolve(handle, "cuptiGetResultString", api.result_string, missing) &&
                  resolve(handle, "cuptiGetVersion", api.version, missing) &&
                  resolve(handle, "cuptiGetStreamIdEx", api.stream_id, missing);
  std::string optional;  // used when the library has it
  resolve(handle, "cuptiActivityFlushPeriod", api.flush_period, optional);
  return ok;
}

}  // namespace

CuptiLibrary load_cupti(const CuptiSearch& search) {
  CuptiLibrary lib;
  auto api = std::make_shared<CuptiApi>();
  const OpenedLibrary opened =
      open_first_library("CUPTI", "NT_CUPTI_LIBRARY", search, {cupti_soname(), "libcupti.so"},
                         [&](void* handle, std::string& missing) { return bind_cupti(handle, *api, missing); });
  if (!opened.handle) {
    lib.error = opened.error;
    return lib;
  }
  api->handle = opened.handle;
  lib.loaded = true;
  lib.path = opened.path;
  lib.api = std::move(api);
  if (lib.api->version(&lib.version) != CUPTI_SUCCESS) lib.version = 0;
  return lib;
}

#else  // a build without CUPTI's header

struct CuptiApi {};

CuptiLibrary load_cupti(const CuptiSearch&) {
  CuptiLibrary lib;
  lib.error = "this build of nanotrain has no CUPTI support (built without CUDA or without cupti.h)";
  return lib;
}

#endif

const CuptiLibrary& cupti_library() {
  static const CuptiLibrary lib = load_cupti(cupti_search());
  return lib;
}

const CuptiLibrary& cupti_library(const std::string& path) {
  if (path.empty()) return cupti_library();
  static std::mutex mu;
  static auto* loaded = new std::unordered_map<std::string, CuptiLibrary>;  // process lifetime, like the libraries
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded->find(path);
  if (it == loaded->end()) {
    CuptiSearch s;
    s.env_library = path;
    it = loaded->emplace(path, load_cupti(s)).first;
  }
  return it->second;
}

// ---- the tracer ------------------------------------------------------------------------------------

#if NT_WITH_CUPTI

namespace {

// The newest kernel record of the header built against. Only its leading fields are read (start, end,
// streamId), which have kept their places since CUpti_ActivityKernel4.
#if CUPTI_API_VERSION >= 130000
using KernelRecord = CUpti_ActivityKernel10;
#else
using KernelRecord = CUpti_ActivityKernel9;
#endif

// Kernel records only: they are matched to launches by stream order (match_in_stream_order), so no API
// record is needed (see cupti_tracer.h).
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL};

const char* kind_name(CUpti_ActivityKind kind) {
  return kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ? "CONCURRENT_KERNEL" : "?";
}

}  // namespace

struct CuptiTracer::State {
  std::mutex mu;
  const CuptiApi* api = nullptr;         // of the library last opened (never unloaded)
  bool open = false;                     // a tracer holds the state
  const CuptiApi* registered = nullptr;  // the library our buffer callbacks are registered with
  size_t buffer_bytes = 0;               // fixed by the first open()
  std::vector<uint8_t*> free_buffers;
  std::vector<CuptiKernelRecord> pending;  // delivered, not yet collected
  int64_t dropped = 0, kernels = 0, late_buffers = 0;
};

namespace {

CuptiTracer::State& state() {
  static auto* s = new CuptiTracer::State;  // process lifetime (see the top of this file)
  return *s;
}

uint8_t* new_buffer(size_t bytes) {
  void* p = std::aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, bytes);
  return static_cast<uint8_t*>(p);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  CuptiTracer::State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  *max_records = 0;              // as many as fit
  if (s.free_buffers.empty()) {  // CUPTI outran the pool: grow it (not per launch: per buffer of records)
    uint8_t* b = new_buffer(s.buffer_bytes);
    if (!b) {  // CUPTI drops records and counts them
      *buffer = nullptr, *size = 0;
      return;
    }
    s.free_buffers.push_back(b);
    ++s.late_buffers;
  }
  *buffer = s.free_buffers.back();
  *size = s.buffer_bytes;
  s.free_buffers.pop_back();
}

// Off the launching thread's path: the records are read without the lock that buffer_requested takes (CUPTI may ask
// for a buffer on the thread that launches kernels), and the lock is held only to hand them over.
void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t size, size_t valid) {
  CuptiTracer::State& s = state();
  if (!buffer) return;
  const CuptiApi* api = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.open) api = s.api;  // the library stays loaded for the process (see the top of this file)
  }
  thread_local std::vector<CuptiKernelRecord> parsed;  // CUPTI's worker thread: grows to a buffer's records once
  parsed.clear();
  size_t dropped = 0;
  if (api) {
    CUpti_Activity* record = nullptr;
    while (api->next_record(buffer, valid, &record) == CUPTI_SUCCESS)
      if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
        const auto* k = reinterpret_cast<const KernelRecord*>(record);
        parsed.push_back({k->streamId, k->start, k->end});
      }
    if (api->dropped_records(context, stream_id, &dropped) != CUPTI_SUCCESS) dropped = 0;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  if (api && s.open) {
    s.pending.insert(s.pending.end(), parsed.begin(), parsed.end());
    s.kernels += static_cast<int64_t>(parsed.size());
    s.dropped += static_cast<int64_t>(dropped);
  }
  if (size == s.buffer_bytes)
    s.free_buffers.push_back(buffer);
  else
    std::free(buffer);
}

}  // namespace

std::unique_ptr<CuptiTracer> CuptiTracer::open(const CuptiLibrary& lib, const CuptiTracerOptions& options,
                                               std::string* why) {
  auto fail = [&](std::string reason) -> std::unique_ptr<CuptiTracer> {
    if (why) *why = std::move(reason);
    return nullptr;
  };
  if (!lib.loaded) return fail(lib.error);
  const CuptiApi& a = *lib.api;
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.open) return fail("CUPTI is already in use by another profiler of this process");
    if (s.buffer_bytes == 0) s.buffer_bytes = std::max<size_t>(options.buffer_bytes, 4096) / 8 * 8;
    while (s.free_buffers.size() < options.buffers) {
      uint8_t* b = new_buffer(s.buffer_bytes);
      if (!b) return fail("out of memory for CUPTI's activity buffers");
      s.free_buffers.push_back(b);
    }
    s.pending.clear();
    s.pending.reserve(options.expected_launches);
    s.dropped = s.kernels = s.late_buffers = 0;
    s.api = &a;
    s.open = true;
  }
  auto close_state = [&s] {
    std::lock_guard<std::mutex> lock(s.mu);
    s.open = false;
  };
  CUptiResult r = CUPTI_SUCCESS;
  if (s.registered != &a) {  // once per library: the callbacks are the same functions for every tracer
    r = a.register_callbacks(&buffer_requested, &buffer_completed);
    if (r != CUPTI_SUCCESS) {
      close_state();
      return fail("cuptiActivityRegisterCallbacks: " + a.describe(r));
    }
    s.registered = &a;
  }
  size_t enabled = 0;
  for (; enabled < std::size(kKinds); ++enabled) {
    r = a.enable(kKinds[enabled]);
    if (r != CUPTI_SUCCESS) break;
  }
  if (enabled < std::size(kKinds)) {
    for (size_t i = 0; i < enabled; ++i) a.disable(kKinds[i]);
    close_state();
    return fail(cat("cuptiActivityEnable(CUPTI_ACTIVITY_KIND_", kind_name(kKinds[enabled]), "): ", a.describe(r)));
  }
  // Every record costs the launching thread host time, and an eager step whose host is at the GPU's pace pays it in
  // full. A worker thread that flushes every 1 ms leaves the launching thread the least of it: with CUPTI's heuristics
  // or a 10 ms period every eager mlp epoch was host-bound (docs/profiler.md, "CUPTI's eager overhead is the host's").
  // Best effort: a library without the call keeps its heuristics.
  if (a.flush_period && options.flush_period_ms > 0) a.flush_period(options.flush_period_ms);
  return std::unique_ptr<CuptiTracer>(new CuptiTracer(lib.api, &s));
}

CuptiTracer::CuptiTracer(std::shared_ptr<const CuptiApi> api, State* state) : api_(std::move(api)), state_(state) {}

CuptiTracer::~CuptiTracer() {
  for (auto kind : kKinds) api_->disable(kind);
  if (api_->flush_period) api_->flush_period(0);      // CUPTI's own heuristics again
  api_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);  // hands back every buffer CUPTI holds
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->pending.clear();
  state_->open = false;
}

void CuptiTracer::set_recording(bool on) {
  if (on == recording_) return;
  for (auto kind : kKinds) {
    const CUptiResult r = on ? api_->enable(kind) : api_->disable(kind);
    if (r != CUPTI_SUCCESS)
      throw InternalError(cat(on ? "cuptiActivityEnable" : "cuptiActivityDisable", "(CUPTI_ACTIVITY_KIND_",
                              kind_name(kind), "): ", api_->describe(r)));
  }
  recording_ = on;
}

uint64_t CuptiTracer::now_ns() const {
  uint64_t t = 0;
  const CUptiResult r = api_->timestamp(&t);
  if (r != CUPTI_SUCCESS) throw InternalError("cuptiGetTimestamp: " + api_->describe(r));
  return t;
}

uint32_t CuptiTracer::stream_id(void* stream) const {
  uint32_t id = 0;
  const CUptiResult r = api_->stream_id(nullptr, static_cast<CUstream>(stream), 0, &id);
  if (r != CUPTI_SUCCESS) throw InternalError("cuptiGetStreamIdEx: " + api_->describe(r));
  return id;
}

void CuptiTracer::collect(bool forced, std::vector<CuptiKernelRecord>& into) {
  const CUptiResult r = api_->flush_all(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);
  if (r != CUPTI_SUCCESS) throw InternalError("cuptiActivityFlushAll: " + api_->describe(r));
  std::lock_guard<std::mutex> lock(state_->mu);
  auto& p = state_->pending;
  into.insert(into.end(), p.begin(), p.end());
  p.clear();  // keeps the capacity
}

int64_t CuptiTracer::dropped_records() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->dropped;
}
int64_t CuptiTracer::kernel_records() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->kernels;
}

#else  // no CUPTI: open() always declines, so no tracer object ever exists

struct CuptiTracer::State {};

std::unique_ptr<CuptiTracer> CuptiTracer::open(const CuptiLibrary& lib, const CuptiTracerOptions&, std::string* why) {
  if (why) *why = lib.error.empty() ? load_cupti({}).error : lib.error;
  return nullptr;
}
CuptiTracer::CuptiTracer(std::shared_ptr<const CuptiApi> api, State* state) : api_(std::move(api)), state_(state) {}
CuptiTracer::~CuptiTracer() = default;
uint64_t CuptiTracer::now_ns() const { return 0; }
uint32_t CuptiTracer::stream_id(void*) const { return 0; }
void CuptiTracer::set_recording(bool) {}
void CuptiTracer::collect(bool, std::vector<CuptiKernelRecord>&) {}
int64_t CuptiTracer::dropped_records() const { return 0; }
int64_t CuptiTracer::kernel_records() const { return 0; }

#endif

}  // namespace nt::profile
