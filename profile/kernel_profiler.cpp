#include "profile/kernel_profiler.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "profile/cupti_tracer.h"
#include "profile/launch_stamps.h"
#include "profile/phase_stamps.h"

#if NT_WITH_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#endif

namespace nt::profile {

const char* timing_name(Timing t) {
  switch (t) {
    case Timing::host:
      return "host";
    case Timing::cuda_events:
      return "cuda events";
    case Timing::cupti:
      return "cupti";
    case Timing::stamps:
      return "launch stamps";
  }
  return "?";
}

std::optional<TimerChoice> parse_timer_choice(std::string_view text) {
  if (text == "auto") return TimerChoice::automatic;
  if (text == "cupti") return TimerChoice::cupti;
  if (text == "events") return TimerChoice::events;
  if (text == "stamps") return TimerChoice::stamps;
  return std::nullopt;
}

Timing timing_for(TimerChoice choice, const TimingScene& scene) {
  if (!scene.on_cuda) return Timing::host;
  switch (choice) {
    case TimerChoice::automatic:
      if (scene.graphs && scene.stamps_possible) return Timing::stamps;
      return scene.sample_every > 1 ? Timing::cuda_events : Timing::cupti;
    case TimerChoice::events:
      return Timing::cuda_events;
    case TimerChoice::stamps:
      return Timing::stamps;
    case TimerChoice::cupti:
      break;
  }
  return Timing::cupti;
}

// ---- CUDA state ------------------------------------------------------------------------------------

#if NT_WITH_CUDA
namespace {
// Slots that kernels fill through an atomic counter (phase stamps, launch stamps), and their host copy, read back and
// emptied at each flush.
template <class Slot>
struct DeviceSlots {
  Slot* slots = nullptr;
  unsigned int* count = nullptr;  // slots taken since the last drain; past capacity a slot is counted and lost
  uint32_t capacity = 0;
  std::vector<Slot> host;

  void create(uint32_t n) {
    NT_CUDA_CHECK(cudaMalloc(&slots, sizeof(Slot) * n));
    NT_CUDA_CHECK(cudaMalloc(&count, sizeof(unsigned int)));
    reset_count();
    capacity = n;
    host.reserve(std::min<size_t>(n, 1u << 16));
  }
  // Copies the slots taken since the last drain into `host` and empties the counter; returns how many were taken
  // (more than `host` holds when the slots ran out). The streams must be synchronized.
  uint32_t drain() {
    unsigned int taken = 0;
    NT_CUDA_CHECK(cudaMemcpy(&taken, count, sizeof taken, cudaMemcpyDeviceToHost));
    host.resize(std::min(taken, capacity));
    if (taken == 0) return 0;
    NT_CUDA_CHECK(cudaMemcpy(host.data(), slots, sizeof(Slot) * host.size(), cudaMemcpyDeviceToHost));
    reset_count();
    return taken;
  }
  void destroy() noexcept {
    if (slots) NT_CUDA_CHECK_NOTHROW(cudaFree(slots));
    if (count) NT_CUDA_CHECK_NOTHROW(cudaFree(count));
  }

 private:
  // Asynchronous to the host like every cudaMemset on device memory: wait for it, or a kernel launched next on one of
  // the profiled (non-blocking) streams could take a slot before the count is back to 0.
  void reset_count() {
    NT_CUDA_CHECK(cudaMemset(count, 0, sizeof(unsigned int)));
    NT_CUDA_CHECK(cudaDeviceSynchronize());
  }
};
}  // namespace
#endif

struct KernelProfiler::Gpu {
#if NT_WITH_CUDA
  std::vector<cudaEvent_t> starts, stops;  // the pool: pair i is open_[i] between flushes
  cudaEvent_t reference = nullptr;         // recorded before the first launch: time zero of the trace
  bool reference_recorded = false;
  std::vector<cudaStream_t> streams;  // every stream launched on since the start, in order of first use
  std::vector<uint32_t> stream_ids;   // CUPTI: [i] is the id the kernel records of streams[i] carry
  bool dirty = false;                 // launches queued since the last synchronization

  // The hold: the device polls *flag_host (host-mapped) until it reaches the step's target.
  uint32_t* flag_host = nullptr;
  uint32_t* flag_device = nullptr;
  uint32_t target = 0;
  bool holding = false;       // a hold is queued and not yet released
  bool hold_pending = false;  // inside a step whose next launch must be preceded by a hold

  // CUPTI
  std::unique_ptr<CuptiTracer> cupti;
  uint64_t origin_ns = 0;                  // CUPTI's clock at start(): time zero of the trace
  std::vector<CuptiKernelRecord> records;  // collected, not yet matched

  // Launch stamps (profile/launch_stamps.h): the ring the kernels write to.
  DeviceSlots<LaunchStamp> launch_stamps;
  uint64_t stamps_origin_ns = 0;  // %globaltimer of the first slot read: time zero of the trace
  bool have_stamps_origin = false;
  LaunchStampRing ring() const { return {launch_stamps.slots, launch_stamps.count, launch_stamps.capacity}; }

  // Phase stamps (profile/phase_stamps.h).
  DeviceSlots<PhaseStamp> phase_stamps;

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

  // The stream's index in `streams` (CUPTI: with its record id looked up once).
  uint32_t note_stream(cudaStream_t s) {
    for (size_t i = 0; i < streams.size(); ++i)
      if (streams[i] == s) return static_cast<uint32_t>(i);
    streams.push_back(s);
    stream_ids.push_back(cupti ? cupti->stream_id(s) : 0);
    return static_cast<uint32_t>(streams.size() - 1);
  }

  ~Gpu() {
    release();
    if (dirty)  // stopped early (an exception): let the queued launches finish with the events they use
      for (auto s : streams) NT_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(s));
    for (auto e : starts)
      if (e) NT_CUDA_CHECK_NOTHROW(cudaEventDestroy(e));
    for (auto e : stops)
      if (e) NT_CUDA_CHECK_NOTHROW(cudaEventDestroy(e));
    if (reference) NT_CUDA_CHECK_NOTHROW(cudaEventDestroy(reference));
    if (flag_host) NT_CUDA_CHECK_NOTHROW(cudaFreeHost(flag_host));
    phase_stamps.destroy();
    launch_stamps.destroy();
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
  NT_CHECK(options_.sample_every >= 1, "profiler: sample_every must be at least 1, got ", options_.sample_every);
  NT_CHECK(options_.sample_every == 1 || !options_.graphs || timing_ == Timing::stamps,
           "profiler: CUPTI times every kernel of a replayed graph; only launch stamps sample its steps");
  NT_CHECK(timing_ != Timing::stamps || options_.graphs,
           "profiler: launch stamps time the kernels of replayed graphs only (ProfilerOptions::graphs)");
  NT_CHECK(timing_ != Timing::stamps || options_.launch_stamp_capacity > 0,
           "profiler: launch_stamp_capacity must be positive");
  if (timing_ == Timing::stamps && !launch_stamps_available())
    throw Error("profiler: this build's kernels do not stamp their launches (configure with -DNT_LAUNCH_STAMPS=ON)");
  data_.sample_every = options_.sample_every;
  data_.ceilings = options_.ceilings;
  if (timing_ == Timing::cupti) {
    const CuptiLibrary& lib = cupti_library(options_.cupti_library);
    if (!lib.loaded) fall_back(lib.error);
  }
  if (timing_ == Timing::stamps) closing_name_ = data_.intern(kLaunchStampsClose);
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
        gpu_->records.reserve(o.expected_launches + o.expected_launches / 4);
      } else {
        fall_back(why);  // CUPTI is there but refuses: events, or throw
      }
    }
    if (timing_ == Timing::cuda_events) gpu_->create(options_.pool_pairs, holds());
    if (timing_ == Timing::stamps) {
      gpu_->launch_stamps.create(options_.launch_stamp_capacity);
      stamp_ring_ = gpu_->ring();
    }
    gpu_->phase_stamps.create(options_.stamp_capacity);
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
    stamp_ring_ = {};
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

int KernelProfiler::scope_name(ScopeName& cache, const ScopeInfo& scope) {
  if (scope.id == 0 || scope.id != cache.id) cache = {scope.id, data_.intern(scope.name ? scope.name : "")};
  return cache.name;
}

Launch KernelProfiler::describe(const char* kernel) {
  const ScopeInfo step = current_step(), phase = current_phase(), layer = current_layer();
  Launch l;
  l.kernel = data_.intern(kernel);
  l.step = scope_name(step_name_, step), l.step_id = step.id;
  l.phase = scope_name(phase_name_, phase), l.phase_id = phase.id;
  l.layer = scope_name(layer_name_, layer), l.layer_id = layer.id;
  return l;
}

KernelProfiler::Take KernelProfiler::take_for_step(int64_t step) const {
  const int n = options_.sample_every;
  if (n == 1 || step % n == n - 1) return Take::counted;
  const bool leads_in = timing_ == Timing::cupti || timing_ == Timing::stamps;
  return step % n == n - 2 && leads_in ? Take::lead_in : Take::skipped;
}

KernelProfiler::Take KernelProfiler::take_now() const {
  if (options_.sample_every == 1) return Take::counted;
  if (in_step_) return step_take_;
#if NT_WITH_CUDA
  // Between steps CUPTI records whatever the next step needs: such a launch must be matched, not counted.
  if (gpu_ && gpu_->cupti && gpu_->cupti->recording()) return Take::lead_in;
#endif
  return Take::skipped;
}

// Every launch of the capture stamps when every step is timed. Sampled, a window of stamping launches opens with a
// sampled step's lead-in, runs through the sampled step, and closes with the launch after it, whatever that is (the
// next step's first, or the graph's closing launch).
KernelProfiler::StampRole KernelProfiler::stamp_role_in_capture() {
  if (options_.sample_every == 1) return StampRole::counted;
  const Take take = in_step_ ? step_take_ : Take::skipped;
  if (take == Take::counted) return StampRole::counted;
  if (take == Take::lead_in) return StampRole::lead_in;
  return window_open_ ? StampRole::closes : StampRole::plain;
}

void KernelProfiler::set_recording(bool on) {
#if NT_WITH_CUDA
  if (gpu_ && gpu_->cupti) gpu_->cupti->set_recording(on);
#else
  (void)on;
#endif
}

void KernelProfiler::begin(const char* kernel, void* stream) {
  NT_CHECK(started_ && !stopped_, "profiler: a launch observed outside start() ... stop()");
  if (!deferred_error_.empty()) throw InternalError(deferred_error_);
  [[maybe_unused]] const uint32_t stamps = std::exchange(next_launch_stamps_, 0u);  // GPU only
  stamp_this_launch_ = false;
  const Take take = capturing_ >= 0 ? Take::counted : take_now();
  if (take == Take::skipped) {
    skipping_launch_ = true;
    return;
  }
  if (!gpu_) {
    open_.push_back({describe(kernel), -1, Clock::now()});
    return;
  }
#if NT_WITH_CUDA
  Gpu& g = *gpu_;
  auto s = static_cast<cudaStream_t>(stream);
  if (capturing_ >= 0) {  // recorded into a graph, timed at its replays
    Sequence& seq = sequences_[static_cast<size_t>(capturing_)];
    seq.launches.push_back(describe(kernel));
    seq.stamps.push_back(stamps);
    if (timing_ == Timing::stamps) {
      const StampRole role = stamp_role_in_capture();
      if (role != StampRole::plain && !window_open_) ++seq.window_count;
      seq.roles.push_back(role);
      seq.windows.push_back(seq.window_count - 1);
      stamp_this_launch_ = role != StampRole::plain;
      window_open_ = role == StampRole::counted || role == StampRole::lead_in;
    }
    return;
  }
  if (open_.size() >= static_cast<size_t>(options_.pool_pairs)) flush();  // dry: one synchronization for all
  Open o{describe(kernel), -1};
  o.stamps = stamps;
  o.stream = g.note_stream(s);
  o.launch.stream = static_cast<int>(o.stream);
  g.dirty = true;
  if (timing_ == Timing::cupti || timing_ == Timing::stamps) {
    o.counted = take == Take::counted;
    o.closes = o.launch.kernel == closing_name_;
    open_.push_back(o);
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
  o.pair = static_cast<int>(open_.size());
  open_.push_back(o);  // first: nothing but the launch itself between the two events
  NT_CUDA_CHECK(cudaEventRecord(g.starts[static_cast<size_t>(o.pair)], s));
#else
  (void)stream;
#endif
}

void KernelProfiler::end(const char* kernel, void* stream, const OpCost& cost) {
  (void)kernel;
  stamp_this_launch_ = false;
  if (skipping_launch_) {
    skipping_launch_ = false;
    return;
  }
  if (capturing_ >= 0) {
    auto& captured = sequences_[static_cast<size_t>(capturing_)].launches;
    if (!captured.empty()) captured.back().cost = cost;
    return;
  }
  // A launch that failed between begin() and end() never ends; its entry is skipped.
  if (open_.empty() || open_.back().ended) return;  // attached between a begin() and its end()
  Open& o = open_.back();
  o.launch.cost = cost;
  if (!gpu_) {
    const auto t1 = Clock::now();
    o.launch.set_bracket(host_us(o.t0), std::chrono::duration<double, std::micro>(t1 - o.t0).count());
    data_.add(o.launch);
    open_.pop_back();
    return;
  }
#if NT_WITH_CUDA
  if (timing_ == Timing::cupti || timing_ == Timing::stamps) {
    o.ended = true;
    return;
  }
  NT_CUDA_CHECK(cudaEventRecord(gpu_->stops[static_cast<size_t>(o.pair)], static_cast<cudaStream_t>(stream)));
  o.ended = true;
#else
  (void)stream;
#endif
}

// ---- graphs ----------------------------------------------------------------------------------------

void KernelProfiler::capture_begin() {
  NT_CHECK(capturing_ < 0, "profiler: a graph capture inside another");
  capturing_ = static_cast<int>(sequences_.size());
  sequences_.emplace_back();
  window_open_ = false;
}

int KernelProfiler::capture_end() {
  NT_CHECK(capturing_ >= 0, "profiler: capture_end() without capture_begin()");
  Sequence& seq = sequences_[static_cast<size_t>(capturing_)];
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const Launch& l : seq.launches)
    for (uint64_t id : {l.step_id, l.phase_id, l.layer_id})
      if (id != 0) lo = std::min(lo, id), hi = std::max(hi, id);
  if (hi != 0) seq.first_id = lo, seq.last_id = hi;
  const int done = capturing_;
  capturing_ = -1;
  return done;
}

void KernelProfiler::replayed(int sequence, void* stream) {
  NT_CHECK(started_ && !stopped_, "profiler: a graph replay observed outside start() ... stop()");
  NT_CHECK(sequence >= 0 && static_cast<size_t>(sequence) < sequences_.size(), "profiler: unknown graph sequence ",
           sequence);
  const Sequence& seq = sequences_[static_cast<size_t>(sequence)];
  if (!times_graph_replays()) {  // event pairs cannot bracket the kernels of a replayed graph
    data_.launches_without_record += static_cast<int64_t>(seq.launches.size());
    return;
  }
#if NT_WITH_CUDA
  const uint32_t stream_index = gpu_->note_stream(static_cast<cudaStream_t>(stream));
  gpu_->dirty = true;
  // The replay's scopes are new openings: ids [first_id, last_id] of the capture map to a fresh block.
  const uint64_t base = seq.last_id ? reserve_scope_ids(seq.last_id - seq.first_id + 1) : 0;
  const auto renamed = [&](uint64_t id) { return id ? base + (id - seq.first_id) : 0; };
  const bool stamps = timing_ == Timing::stamps;
  // Stamps: each window of the replay is its own chain of stamps; the plain launches leave none, and are not rows.
  const int64_t replay = replays_;
  replays_ += stamps ? seq.window_count : 1;
  if (stamps) data_.steps += seq.steps, data_.sampled_steps += seq.sampled_steps;
  for (size_t i = 0; i < seq.launches.size(); ++i) {
    if (stamps && seq.roles[i] == StampRole::plain) continue;
    Launch l = seq.launches[i];
    l.step_id = renamed(l.step_id), l.phase_id = renamed(l.phase_id), l.layer_id = renamed(l.layer_id);
    l.stream = static_cast<int>(stream_index);
    Open o{l, -1};
    o.ended = true;
    o.stamps = seq.stamps[i];
    o.stream = stream_index;
    o.replay = stamps ? replay + seq.windows[i] : replay;
    o.stamped = stamps;
    o.counted = !stamps || seq.roles[i] == StampRole::counted;
    o.closes = l.kernel == closing_name_ || (stamps && seq.roles[i] == StampRole::closes);
    open_.push_back(o);
  }
  // After the launch, not before: the replay's kernels are queued and must be among the pending launches when
  // the records are read.
  if (open_.size() >= static_cast<size_t>(options_.pool_pairs)) flush();
#else
  (void)stream;
#endif
}

PhaseStamps KernelProfiler::phase_stamps(const char* const* names, size_t count) {
#if NT_WITH_CUDA
  if (!gpu_ || !gpu_->phase_stamps.slots || count == 0 || !started_ || stopped_) return {};
  if (capturing_ < 0 && take_now() == Take::skipped) return {};  // an untimed launch: nothing to place them in
  stamp_names_.push_back({names, count});
  next_launch_stamps_ = static_cast<uint32_t>(stamp_names_.size() - 1);
  const auto& slots = gpu_->phase_stamps;
  return {slots.slots, slots.count, slots.capacity, next_launch_stamps_};
#else
  (void)names;
  (void)count;
  return {};
#endif
}

// ---- the hold --------------------------------------------------------------------------------------

void KernelProfiler::step_opened() noexcept {
  in_step_ = true;
  if (capturing_ >= 0 && timing_ == Timing::stamps) {  // counted at each replay of the capture
    Sequence& seq = sequences_[static_cast<size_t>(capturing_)];
    step_take_ = take_for_step(seq.steps++);
    seq.sampled_steps += step_take_ == Take::counted;
  } else {
    step_take_ = take_for_step(data_.steps++);
    data_.sampled_steps += step_take_ == Take::counted;
  }
  if (options_.sample_every > 1) {
    try {  // recording already follows this step unless a launch came between two steps
      set_recording(step_take_ != Take::skipped);
    } catch (const std::exception& e) {
      deferred_error_ = e.what();  // thrown at the next launch: this is called from a scope's constructor
    }
  }
#if NT_WITH_CUDA
  if (gpu_ && holds() && started_ && !stopped_ && step_take_ == Take::counted) gpu_->hold_pending = true;
#endif
}

void KernelProfiler::step_closed() noexcept {
  in_step_ = false;
  if (options_.sample_every > 1) {
    try {  // set for the next step now, so that launches between the two are recorded as it will be
      set_recording(take_for_step(data_.steps) != Take::skipped);
    } catch (const std::exception& e) {
      deferred_error_ = e.what();
    }
  }
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
  else if (timing_ == Timing::stamps)
    flush_stamps();
  else
    flush_events();
  open_.clear();
  ++flushes_;
}

namespace {
constexpr size_t kNotAdded = SIZE_MAX - 1;  // a pending launch that is in no row (untimed, or without a record)
}  // namespace

void KernelProfiler::flush_events() {
#if NT_WITH_CUDA
  Gpu& g = *gpu_;
  std::vector<size_t> added(open_.size(), kNotAdded);
  // Offsets: the first pending start event anchors this batch against the reference (one float of ms, so
  // about 0.1 us of error per 1.5 s since the start); each launch is then placed against the anchor.
  float anchor_ms = 0;
  NT_CUDA_CHECK(cudaEventElapsedTime(&anchor_ms, g.reference, g.starts[0]));
  for (size_t k = 0; k < open_.size(); ++k) {
    Open& o = open_[k];
    if (!o.ended) continue;
    const auto i = static_cast<size_t>(o.pair);
    float offset_ms = 0, dur_ms = 0;
    NT_CUDA_CHECK(cudaEventElapsedTime(&offset_ms, g.starts[0], g.starts[i]));
    NT_CUDA_CHECK(cudaEventElapsedTime(&dur_ms, g.starts[i], g.stops[i]));
    o.launch.set_bracket(1e3 * (static_cast<double>(anchor_ms) + static_cast<double>(offset_ms)),
                         1e3 * static_cast<double>(dur_ms));
    added[k] = data_.add(o.launch);
  }
  read_stamps(added);
#endif
}

// The streams are synchronized: every kernel of the batch has ended. An unforced flush delivers the buffers
// whose records are complete; if records are still short of the launches, a forced flush delivers the rest.
void KernelProfiler::flush_cupti() {
#if NT_WITH_CUDA
  Gpu& g = *gpu_;
  std::vector<uint32_t> launch_streams;  // of the launches that were made, in order
  launch_streams.reserve(open_.size());
  for (const Open& o : open_)
    if (o.ended) launch_streams.push_back(g.stream_ids[o.stream]);
  g.cupti->collect(false, g.records);
  if (g.records.size() < launch_streams.size()) g.cupti->collect(true, g.records);
  const CuptiMatch m = match_in_stream_order(launch_streams, g.records);
  if (m.missing > 0)  // what CUPTI delivered, to tell a lost record from a mismatch
    std::fprintf(stderr,
                 "profiler: %lld of %zu launches without a CUPTI record (this batch: %zu kernel records, %lld "
                 "without timestamps, %lld streams; so far: %lld kernel records, %lld dropped)\n",
                 static_cast<long long>(m.missing), launch_streams.size(), g.records.size(),
                 static_cast<long long>(m.invalid), static_cast<long long>(m.streams),
                 static_cast<long long>(g.cupti->kernel_records()), static_cast<long long>(g.cupti->dropped_records()));
  std::vector<size_t> added(open_.size(), kNotAdded);
  const auto us_since_origin = [&](uint64_t ns) {
    return 1e-3 * static_cast<double>(static_cast<int64_t>(ns - g.origin_ns));
  };
  size_t j = 0;
  for (size_t k = 0; k < open_.size(); ++k) {
    Open& o = open_[k];
    if (!o.ended) continue;  // never launched
    const CuptiLaunchTime& t = m.launches[j++];
    if (!o.counted) continue;  // a lead-in launch: its end clipped the next one's start
    if (!t.found) {
      ++data_.launches_without_record;
      continue;
    }
    o.launch.start_us = us_since_origin(t.start_ns);
    o.launch.span_us = 1e-3 * static_cast<double>(t.end_ns - t.start_ns);
    o.launch.exclusive_us = 1e-3 * static_cast<double>(t.end_ns - t.exclusive_start_ns);
    added[k] = data_.add(o.launch);
  }
  g.records.clear();
  read_stamps(added);
#endif
}

// The streams are synchronized: every kernel of the batch has written its slots. One stream only: the slots' times
// give the stream's order (profile/launch_stamps.h).
void KernelProfiler::flush_stamps() {
#if NT_WITH_CUDA
  Gpu& g = *gpu_;
  NT_CHECK(g.streams.size() <= 1, "profiler: launch stamps time the kernels of one stream, and ", g.streams.size(),
           " were launched on");
  const uint32_t taken = g.launch_stamps.drain();
  const std::vector<LaunchStamp>& slots = g.launch_stamps.host;

  std::vector<StampedLaunch> launches;
  std::vector<size_t> which;  // launches[i] is open_[which[i]]
  launches.reserve(open_.size()), which.reserve(open_.size());
  for (size_t k = 0; k < open_.size(); ++k) {
    const Open& o = open_[k];
    if (!o.ended) continue;  // never launched
    if (!o.stamped) {        // launched eagerly: its plain kernel left no stamps
      data_.launches_without_record += o.counted;
      continue;
    }
    launches.push_back({o.replay, o.closes, o.counted});
    which.push_back(k);
  }
  const StampedTimes times = times_from_launch_stamps(launches, slots);
  std::vector<size_t> added(open_.size(), kNotAdded);
  data_.launches_without_record += times.untimed;
  if (!times.aligned ||
      taken > slots.size()) {  // a full ring lost slots: what is left cannot be matched with certainty
    std::fprintf(stderr,
                 "profiler: %lld launches without a time: %zu start and %zu release slots for %zu launches, %zu of "
                 "which wait for a release (%u slots taken, the ring holds %u)\n",
                 static_cast<long long>(times.untimed), times.start_slots, times.release_slots, launches.size(),
                 times.waiting_for_release, taken, g.launch_stamps.capacity);
    read_stamps(added);
    return;
  }
  if (!g.have_stamps_origin && !slots.empty()) {
    g.stamps_origin_ns = slots.front().start_ns;
    g.have_stamps_origin = true;
  }
  const auto us_since_origin = [&](uint64_t ns) {
    return 1e-3 * static_cast<double>(static_cast<int64_t>(ns - g.stamps_origin_ns));
  };
  for (size_t i = 0; i < launches.size(); ++i) {
    const StampedTime& t = times.launches[i];
    Open& o = open_[which[i]];
    if (!t.timed || !o.counted) continue;  // a lead-in's time only clips the sampled step's first
    o.launch.start_us = us_since_origin(t.start_ns);
    o.launch.span_us = 1e-3 * static_cast<double>(t.end_ns - t.start_ns);
    o.launch.exclusive_us = 1e-3 * static_cast<double>(t.end_ns - t.exclusive_start_ns);
    added[which[i]] = data_.add(o.launch);
  }
  read_stamps(added);
#endif
}

// The stamps the batch's kernels wrote: each launch's phases become slices inside its exclusive time and child rows
// of its row. added[k]: where open_[k] went (its index in the trace, kNotInTrace, or kNotAdded).
void KernelProfiler::read_stamps(const std::vector<size_t>& added) {
#if NT_WITH_CUDA
  // Only a launch that asked for stamps writes any (phase_stamps): without one pending, there is nothing to read.
  if (std::none_of(open_.begin(), open_.end(), [](const Open& o) { return o.stamps != 0; })) return;
  Gpu& g = *gpu_;
  const uint32_t taken = g.phase_stamps.drain();
  if (taken == 0) return;
  data_.stamps_lost += static_cast<int64_t>(taken - g.phase_stamps.host.size());
  const StampedRuns runs = split_stamps(g.phase_stamps.host);
  data_.stamps_lost += runs.unended;
  // The pending launches of each tag, in order: a graph replayed twice runs its stamped launch twice.
  std::unordered_map<uint32_t, std::vector<size_t>> by_tag;
  for (size_t k = 0; k < open_.size(); ++k)
    if (open_[k].stamps != 0 && open_[k].ended) by_tag[open_[k].stamps].push_back(k);
  for (const StampedSlice& slice : runs.slices) {
    const auto it = by_tag.find(slice.launch);
    if (it == by_tag.end() || slice.occurrence >= it->second.size()) {
      ++data_.stamps_lost;
      continue;
    }
    const size_t k = it->second[slice.occurrence];
    if (added[k] == kNotAdded) continue;  // an untimed launch (sampling's lead-in, no record)
    const StampNames& names = stamp_names_[slice.launch];
    if (slice.phase >= names.count) {
      ++data_.stamps_lost;
      continue;
    }
    const Launch& parent = open_[k].launch;
    data_.add_part(parent, added[k], data_.intern(names.names[slice.phase]), static_cast<int>(slice.phase),
                   parent.exclusive_start_us() + 1e-3 * static_cast<double>(slice.offset_ns),
                   1e-3 * static_cast<double>(slice.dur_ns));
  }
#else
  (void)added;
#endif
}

}  // namespace nt::profile
