// Kernel timestamps from CUPTI's activity API: the GPU's own start and end time of every kernel, the source of
// Timing::cupti in the kernel profiler (kernel_profiler.h; docs/profiler.md says why it replaces event pairs).
//
//   const CuptiLibrary& lib = cupti_library();          // found and loaded once per process, or why not
//   std::string why;
//   auto tracer = CuptiTracer::open(lib, {}, &why);       // enables the activity kinds; nullptr + why on failure
//   ...launch `count` kernels on one stream; synchronize it...;
//   std::vector<CuptiKernelRecord> records;
//   tracer->collect(false, records);                      // every record delivered so far, appended
//   CuptiMatch m = match_in_stream_order(launch_streams, records);  // launch_streams[i]: tracer->stream_id(s)
//
// Loading. CUPTI is opened at run time (core/shared_library.h), so the binaries start on machines without it:
// NT_CUPTI_LIBRARY names the library, else libcupti.so.<major> and libcupti.so are searched for.
//
// Activity kind: CONCURRENT_KERNEL only (KIND_KERNEL would serialize kernels; API records, which external
// correlations need, more than doubled an eager epoch on the H100). Kernels replayed from a CUDA graph get
// records as well. Buffers come from a pool preallocated at open(); the completion callback (on CUPTI's worker
// thread, or inside cuptiActivityFlushAll) copies the three fields used into a compact array and hands the
// buffer back, so nothing is allocated per launch and memory stays bounded.
//
// One tracer at a time per process (CUPTI's activity state is process-wide): open() fails while another is open.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/shared_library.h"

namespace nt::profile {

// ---- loading ---------------------------------------------------------------------------------------

using CuptiSearch = LibrarySearch;  // env_library is NT_CUPTI_LIBRARY's value

CuptiSearch cupti_search();                                       // from the environment, /proc/self/exe, the build
std::vector<std::string> cupti_candidates(const CuptiSearch& s);  // what dlopen is tried with, in order
std::string cupti_soname();                                       // "libcupti.so.13" for a CUDA 13 build

struct CuptiApi;  // the resolved functions (cupti_tracer.cpp)

struct CuptiLibrary {
  bool loaded = false;
  std::string path;      // the candidate that loaded
  std::string error;     // why not: one line naming what was tried
  uint32_t version = 0;  // cuptiGetVersion
  std::shared_ptr<const CuptiApi> api;
};

CuptiLibrary load_cupti(const CuptiSearch& search);  // uncached: tries every candidate; never throws
const CuptiLibrary& cupti_library();                 // load_cupti(cupti_search()), once per process
// An explicit library (ProfilerOptions::cupti_library); "" means cupti_library(). Cached per path.
const CuptiLibrary& cupti_library(const std::string& path);

// ---- records and matching (pure) -------------------------------------------------------------------

struct CuptiKernelRecord {  // the fields of a CONCURRENT_KERNEL record that the profiler uses
  uint32_t stream_id = 0;
  uint64_t start_ns = 0, end_ns = 0;
};

struct CuptiLaunchTime {
  bool found = false;
  uint64_t start_ns = 0, end_ns = 0;  // the record's own: the kernel's span
  uint64_t exclusive_start_ns = 0;    // its start, or its stream predecessor's end if later (see below)
};

struct CuptiMatch {
  std::vector<CuptiLaunchTime> launches;  // [i]: the i-th launch of the batch
  int64_t missing = 0;                    // launches without a time (all of a stream's when its counts disagree)
  int64_t extra = 0;                      // valid records beyond the launches (kernels nobody observed)
  int64_t clipped = 0;                    // launches that started before their stream predecessor ended
  int64_t invalid = 0;                    // records without timestamps (start 0, or end before start): ignored
  int64_t streams = 0;                    // distinct streams among the valid records
};

// Matches kernel records to launches. launch_streams[i] is the CUPTI stream id of the i-th launch of the batch, in
// submission order. A stream runs its kernels in submission order, so on each stream the k-th record by start time is
// the k-th launch to that stream: no id has to travel with the launch (CUPTI's external correlation costs a push and
// a pop per launch, and on some driver and CUPTI pairings its records never come). Nothing is guessed: a stream whose
// records are not exactly as many as its launches matches none of them, and records on a stream with no launch
// (another library's kernels) are counted as extra. The order of the records does not matter.
//
// Exclusive time. Under programmatic dependent launch (sm_90) a kernel's blocks may start while its stream
// predecessor still runs and wait for it (griddepcontrol.wait), and a kernel declared independent of its
// predecessor runs beside it: a record's start can precede the predecessor's end. Its exclusive start is the later
// of the two, the time from which it ran with the stream to itself; its span is the record itself.
CuptiMatch match_in_stream_order(std::span<const uint32_t> launch_streams, std::vector<CuptiKernelRecord> kernels);

// ---- the tracer ------------------------------------------------------------------------------------

struct CuptiTracerOptions {
  size_t buffers = 8;                // preallocated activity buffers (more are allocated only if CUPTI outruns them)
  size_t buffer_bytes = 1u << 20;    // each (the first open()'s size holds for the process); ~3,000 launches
  size_t expected_launches = 16384;  // records reserved for between two collections
  uint32_t flush_period_ms = 1;      // CUPTI's worker thread delivers full buffers this often (0: CUPTI's heuristics)
};

class CuptiTracer {
 public:
  // Registers the buffer callbacks and enables the activity kinds. On failure returns nullptr and sets *why to
  // one line naming the call and CUPTI's error (e.g. CUPTI_ERROR_INSUFFICIENT_PRIVILEGES, or another tracer).
  static std::unique_ptr<CuptiTracer> open(const CuptiLibrary& lib, const CuptiTracerOptions& options,
                                           std::string* why);
  ~CuptiTracer();  // disables the kinds and drains CUPTI's buffers
  CuptiTracer(const CuptiTracer&) = delete;
  CuptiTracer& operator=(const CuptiTracer&) = delete;

  uint64_t now_ns() const;                 // cuptiGetTimestamp: the clock of the kernel records
  uint32_t stream_id(void* stream) const;  // cuptiGetStreamIdEx: the id the kernel records of `stream` carry

  // Kernels launched while recording is off get no record (cuptiActivityDisable), and their launches none of
  // CUPTI's per-launch cost; records of kernels launched before are still delivered. On after open().
  void set_recording(bool on);
  bool recording() const { return recording_; }

  // cuptiActivityFlushAll(forced ? FLUSH_FORCED : 0), then appends to `into` every record delivered since the
  // last call (no allocation while `into` has the capacity). Call it after synchronizing the streams: an
  // unforced flush delivers only buffers whose records are all complete.
  void collect(bool forced, std::vector<CuptiKernelRecord>& into);

  int64_t dropped_records() const;  // reported by CUPTI (its buffers overflowed)
  int64_t kernel_records() const;   // delivered since open()

  struct State;  // shared with the C callbacks (cupti_tracer.cpp)

 private:
  CuptiTracer(std::shared_ptr<const CuptiApi> api, State* state);
  std::shared_ptr<const CuptiApi> api_;
  State* state_;
  bool recording_ = true;
};

}  // namespace nt::profile
