#include "profile/kernel_profiler.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "core/error.h"
#include "profile/cupti_tracer.h"

#if NT_WITH_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#endif

namespace nt::profile {

const char* timing_name(Timing t) {
  switch (t) {
    case Timing::host: return "host";
    case Timing::cuda_events: return "cuda events";
    case Timing::cupti: return "cupti";
  }
  return "?";
}

std::optional<TimerChoice> parse_timer_choice(std::string_view text) {
  if (text == "auto") return TimerChoice::automatic;
  if (text == "cupti") return TimerChoice::cupti;
  if (text == "events") return TimerChoice::events;
  return std::nullopt;
}

Timing timing_for(TimerChoice choice, bool on_cuda) {
  if (!on_cuda) return Timing::host;
  return choice == TimerChoice::events ? Timing::cuda_events : Timing::cupti;
}

// ---- CUDA state ------------------------------------------------------------------------------------

struct KernelProfiler::Gpu {
#if NT_WITH_CUDA
  std::vector<cudaEvent_t> starts, stops;  // the pool: pair i is open_[i] between flushes
  cudaEvent_t reference = nullptr;         // recorded before the first launch: time zero of the trace
  bool reference_recorded = false;
  std::vector<cudaStream_t> streams;       // every stream launched on since the start
  bool dirty = false;                      // launches queued since the last synchronization

  // The hold: the device polls *flag_host (host-mapped) until it reaches the step's target.
  uint32_t* flag_host = nullptr;
  uint32_t* flag_device = nullptr;
  uint32_t target = 0;
  bool holding = false;       // a hold is queued and not yet released
  bool hold_pending = false;  // inside a step whose next launch must be preceded by a hold

  // CUPTI: open_[i] carries the external correlation id first_id + i.
  std::unique_ptr<CuptiTracer> cupti;
  uint64_t first_id = 1;
  bool pushed = false;        // an id is pushed (between a begin() and its end())
  uint64_t origin_ns = 0;     // CUPTI's clock at start(): time zero of the trace
  CuptiBatch records;         // collected, not yet matched

  void create(int pairs, bool with_hold) {
    starts.resize(static_cast<size_t>(pairs));
    stops.resize(static_cast<size_t>(pairs));
    for (int i = 0; i < pairs; ++i) {
      NT_CUDA_CHECK(cudaEventCreate(&starts[static_cast<size_t>(i)]));
      NT_CUDA_CHECK(cudaEventCreate(&stops[static_cast<size_t>(i)]));
    }
    NT_CUDA_CHECK(cudaEventCreate(&reference));
    if (with_hold) {
      void* host = nullptr;
      NT_CUDA_CHECK(cudaHostAlloc(&host, sizeof(uint32_t), cudaHostAllocMapped));
      flag_host = static_cast<uint32_t*>(host);
      *flag_host = 0;
      void* device = nullptr;
      NT_CUDA_CHECK(cudaHostGetDevicePointer(&device, host, 0));
      flag_device = static_cast<uint32_t*>(device);
    }
  }

  void release() noexcept {
    if (!holding) return;
    std::atomic_ref<uint32_t>(*flag_host).store(target, std::memory_order_release);
    holding = false;
  }

  void note_stream(cudaStream_t s) {
    for (auto known : streams)
      if (known == s) return;
    streams.push_back(s);
  }

  ~Gpu() {
    release();
    if (pushed && cupti) {  // stopped between a begin() and its end() (an exception)
      try {
        cupti->pop();
      } catch (...) {
      }
    }
    if (dirty)  // stopped early (an exception): let the queued launches finish with the events they use
      for (auto s : streams) NT_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(s));
    for (auto e : starts)
      if (e) NT_CUDA_CHECK_NOTHROW(cudaEventDestroy(e));
    for (auto e : stops)
      if (e) NT_CUDA_CHECK_NOTHROW(cudaEventDestroy(e));
    if (reference) NT_CUDA_CHECK_NOTHROW(cudaEventDestroy(reference));
    if (flag_host) NT_CUDA_CHECK_NOTHROW(cudaFreeHost(flag_host));
  }
#endif
};

// ---- life cycle ------------------------------------------------------------------------------------

KernelProfiler::KernelProfiler(ProfilerOptions options)
    : options_(std::move(options)), timing_(options_.timing), data_(options_.max_trace_launches) {
  data_.device = options_.device;
  if (timing_ != Timing::host) {
    if (!NT_WITH_CUDA) throw Error("profiler: this build of nanotrain has no CUDA backend");
    NT_CHECK(options_.pool_pairs > 0, "profiler: pool_pairs must be positive, got ", options_.pool_pairs);
    gpu_ = std::make_unique<Gpu>();
  }
  if (timing_ == Timing::cupti) {
    const CuptiLibrary& lib = cupti_library(options_.cupti_library);
    if (!lib.loaded) fall_back(lib.error);
  }
  data_.timer = timing_name(timing_);
}

void KernelProfiler::fall_back(const std::string& why) {
  if (!options_.cupti_fallback) throw Error("profiler: CUPTI timing (--profile-timer cupti) unavailable: " + why);
  timing_ = Timing::cuda_events;
  timing_note_ = why;
}

bool KernelProfiler::holds() const { return timing_ == Timing::cuda_events && static_cast<bool>(options_.hold); }

KernelProfiler::~KernelProfiler() {
  if (step_listener() == this) set_step_listener(nullptr);
}

void KernelProfiler::start() {
  NT_CHECK(!started_, "profiler: start() called twice");
#if NT_WITH_CUDA
  if (gpu_) {
    if (timing_ == Timing::cupti) {
      CuptiTracerOptions o;
      o.expected_launches = static_cast<size_t>(options_.pool_pairs);
      std::string why;
      gpu_->cupti = CuptiTracer::open(cupti_library(options_.cupti_library), o, &why);
      if (gpu_->cupti) {
        gpu_->origin_ns = gpu_->cupti->now_ns();
        gpu_->records.kernels.reserve(o.expected_launches + o.expected_launches / 4);
        gpu_->records.correlations.reserve(2 * o.expected_launches);
      } else {
        fall_back(why);  // CUPTI is there but refuses: events, or throw
      }
    }
    if (timing_ == Timing::cuda_events) gpu_->create(options_.pool_pairs, holds());
    data_.timer = timing_name(timing_);
    open_.reserve(static_cast<size_t>(options_.pool_pairs));
    NT_CUDA_CHECK_NOTHROW(cudaProfilerStart());  // Nsight: --profile-from-start off / --capture-range=cudaProfilerApi
  }
#endif
  started_ = running_ = true;
  set_step_listener(this);
  origin_ = window_start_ = Clock::now();
}

void KernelProfiler::pause() {
  if (!running_) return;
  synchronize();
  data_.wall_us += host_us(Clock::now()) - host_us(window_start_);
  running_ = false;
}

void KernelProfiler::resume() {
  NT_CHECK(started_ && !stopped_, "profiler: resume() outside start() ... stop()");
  if (running_) return;
  window_start_ = Clock::now();
  running_ = true;
}

void KernelProfiler::stop() {
  if (!started_ || stopped_) return;
  pause();
  flush();
  if (step_listener() == this) set_step_listener(nullptr);
#if NT_WITH_CUDA
  if (gpu_) {
    gpu_->cupti.reset();  // disables the activity kinds: the next profiler may open CUPTI
    NT_CUDA_CHECK_NOTHROW(cudaProfilerStop());
  }
#endif
  stopped_ = true;
}

double KernelProfiler::host_us(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

// ---- launches --------------------------------------------------------------------------------------

Launch KernelProfiler::describe(const char* kernel) {
  const ScopeInfo step = current_step(), phase = current_phase(), layer = current_layer();
  Launch l;
  l.kernel = data_.intern(kernel);
  l.step = data_.intern(step.name ? step.name : ""), l.step_id = step.id;
  l.phase = data_.intern(phase.name ? phase.name : ""), l.phase_id = phase.id;
  l.layer = data_.intern(layer.name ? layer.name : ""), l.layer_id = layer.id;
  return l;
}

void KernelProfiler::begin(const char* kernel, void* stream) {
  NT_CHECK(started_ && !stopped_, "profiler: a launch observed outside start() ... stop()");
  if (!gpu_) {
    open_.push_back({describe(kernel), -1, Clock::now()});
    return;
  }
#if NT_WITH_CUDA
  Gpu& g = *gpu_;
  auto s = static_cast<cudaStream_t>(stream);
  if (open_.size() == static_cast<size_t>(options_.pool_pairs)) flush();  // dry: one synchronization for all
  if (timing_ == Timing::cupti) {
    g.note_stream(s);
    g.dirty = true;
    if (g.pushed) g.cupti->pop(), g.pushed = false;  // the previous launch failed before its end()
    open_.push_back({describe(kernel), -1});
    g.cupti->push(g.first_id + (open_.size() - 1));  // last: only the launch itself carries the id
    g.pushed = true;
    return;
  }
  if (!g.reference_recorded) {
    NT_CUDA_CHECK(cudaEventRecord(g.reference, s));
    g.reference_recorded = true;
  }
  if (g.hold_pending) {  // the step's first launch: the stream waits until the host has queued the step
    g.hold_pending = false;
    options_.hold(stream, g.flag_device, ++g.target);
    g.holding = true;
  }
  g.note_stream(s);
  g.dirty = true;
  const int pair = static_cast<int>(open_.size());
  open_.push_back({describe(kernel), pair});  // first: nothing but the launch itself between the two events
  NT_CUDA_CHECK(cudaEventRecord(g.starts[static_cast<size_t>(pair)], s));
#else
  (void)stream;
#endif
}

void KernelProfiler::end(const char* kernel, void* stream, const OpCost& cost) {
  (void)kernel;
  // A launch that failed between begin() and end() never ends; its entry is skipped.
  if (open_.empty() || open_.back().ended) return;  // attached between a begin() and its end()
  Open& o = open_.back();
  o.launch.cost = cost;
  if (!gpu_) {
    const auto t1 = Clock::now();
    o.launch.start_us = host_us(o.t0);
    o.launch.dur_us = std::chrono::duration<double, std::micro>(t1 - o.t0).count();
    data_.add(o.launch);
    open_.pop_back();
    return;
  }
#if NT_WITH_CUDA
  if (timing_ == Timing::cupti) {
    if (gpu_->pushed) gpu_->cupti->pop(), gpu_->pushed = false;
    o.ended = true;
    return;
  }
  NT_CUDA_CHECK(cudaEventRecord(gpu_->stops[static_cast<size_t>(o.pair)], static_cast<cudaStream_t>(stream)));
  o.ended = true;
#else
  (void)stream;
#endif
}

// ---- the hold --------------------------------------------------------------------------------------

void KernelProfiler::step_opened() noexcept {
  in_step_ = true;
#if NT_WITH_CUDA
  if (gpu_ && holds() && started_ && !stopped_) gpu_->hold_pending = true;
#endif
}

void KernelProfiler::step_closed() noexcept {
  in_step_ = false;
  open_gate();
#if NT_WITH_CUDA
  if (gpu_) gpu_->hold_pending = false;
#endif
}

void KernelProfiler::open_gate() noexcept {
#if NT_WITH_CUDA
  if (gpu_) gpu_->release();
#endif
}

// ---- read-back -------------------------------------------------------------------------------------

void KernelProfiler::synchronize() {
#if NT_WITH_CUDA
  if (!gpu_ || !gpu_->dirty) return;
  open_gate();  // a held stream would never drain
  for (auto s : gpu_->streams) NT_CUDA_CHECK(cudaStreamSynchronize(s));
  gpu_->dirty = false;
  ++data_.synchronizations;
  if (in_step_ && holds()) gpu_->hold_pending = true;  // mid-step (a dry pool): hold the rest of the step
#endif
}

void KernelProfiler::flush() {
  if (!gpu_ || open_.empty()) return;  // host timings are aggregated as they end
  synchronize();
  if (timing_ == Timing::cupti)
    flush_cupti();
  else
    flush_events();
  open_.clear();
  ++flushes_;
}

void KernelProfiler::flush_events() {
#if NT_WITH_CUDA
  Gpu& g = *gpu_;
  // Offsets: the first pending start event anchors this batch against the reference (one float of ms, so
  // about 0.1 us of error per 1.5 s since the start); each launch is then placed against the anchor.
  float anchor_ms = 0;
  NT_CUDA_CHECK(cudaEventElapsedTime(&anchor_ms, g.reference, g.starts[0]));
  for (Open& o : open_) {
    if (!o.ended) continue;
    const auto i = static_cast<size_t>(o.pair);
    float offset_ms = 0, dur_ms = 0;
    NT_CUDA_CHECK(cudaEventElapsedTime(&offset_ms, g.starts[0], g.starts[i]));
    NT_CUDA_CHECK(cudaEventElapsedTime(&dur_ms, g.starts[i], g.stops[i]));
    o.launch.start_us = 1e3 * (static_cast<double>(anchor_ms) + static_cast<double>(offset_ms));
    o.launch.dur_us = 1e3 * static_cast<double>(dur_ms);
    data_.add(o.launch);
  }
#endif
}

// When CUPTI delivers every kernel record but not the external correlations that name their launches
// (seen with some driver and CUPTI pairings), the records can still be matched exactly: profiling
// launches everything on one stream, which runs its kernels in submission order, so the i-th record by
// start time is the i-th launch that ended. Used only when the counts agree; otherwise nothing is guessed.
CuptiMatch KernelProfiler::match_in_stream_order(std::vector<CuptiKernelRecord> kernels, const CuptiMatch& by_id) const {
  std::vector<size_t> ended;
  for (size_t i = 0; i < open_.size(); ++i)
    if (open_[i].ended) ended.push_back(i);
  if (kernels.size() != ended.size()) return by_id;
  std::stable_sort(kernels.begin(), kernels.end(),
                   [](const CuptiKernelRecord& a, const CuptiKernelRecord& b) { return a.start_ns < b.start_ns; });
  CuptiMatch m = by_id;
  uint64_t previous_end = 0;
  for (size_t j = 0; j < ended.size(); ++j) {
    CuptiLaunchTime& t = m.launches[ended[j]];
    t.found = true;
    t.start_ns = std::max(kernels[j].start_ns, previous_end);  // programmatic launch overlap, clipped as by id
    t.end_ns = std::max(kernels[j].end_ns, t.start_ns);
    previous_end = t.end_ns;
  }
  m.missing = 0;
  return m;
}

// The streams are synchronized: every kernel of the batch has ended. An unforced flush delivers the buffers
// whose records are complete; if a launch still lacks its record, a forced flush delivers the rest.
void KernelProfiler::flush_cupti() {
#if NT_WITH_CUDA
  Gpu& g = *gpu_;
  if (g.pushed) g.cupti->pop(), g.pushed = false;  // a launch that failed before its end()
  auto missing = [&](const CuptiMatch& m) {
    int64_t n = 0;
    for (size_t i = 0; i < open_.size(); ++i) n += open_[i].ended && !m.launches[i].found;
    return n;
  };
  g.cupti->collect(false, g.records);
  CuptiMatch m = match_cupti_records(g.first_id, open_.size(), g.records.correlations, g.records.kernels);
  if (missing(m) > 0) {
    g.cupti->collect(true, g.records);
    m = match_cupti_records(g.first_id, open_.size(), g.records.correlations, g.records.kernels);
    if (missing(m) > 0) m = match_in_stream_order(g.records.kernels, m);
    if (const int64_t lost = missing(m); lost > 0)  // what CUPTI delivered, to tell a lost record from a mismatch
      std::fprintf(stderr,
                   "profiler: %lld of %zu launches without a CUPTI record (this batch: %zu kernel and %zu "
                   "correlation records; so far: %lld kernel, %lld correlation, %lld dropped)\n",
                   static_cast<long long>(lost), open_.size(), g.records.kernels.size(),
                   g.records.correlations.size(), static_cast<long long>(g.cupti->kernel_records()),
                   static_cast<long long>(g.cupti->correlation_records()),
                   static_cast<long long>(g.cupti->dropped_records()));
  }
  for (size_t i = 0; i < open_.size(); ++i) {
    Open& o = open_[i];
    if (!o.ended) continue;  // never launched
    const CuptiLaunchTime& t = m.launches[i];
    if (!t.found) {
      ++data_.launches_without_record;
      continue;
    }
    o.launch.start_us = 1e-3 * static_cast<double>(static_cast<int64_t>(t.start_ns - g.origin_ns));
    o.launch.dur_us = 1e-3 * static_cast<double>(t.end_ns - t.start_ns);
    data_.add(o.launch);
  }
  g.first_id += open_.size();
  g.records.kernels.clear();
  g.records.correlations.clear();
#endif
}

}  // namespace nt::profile
