// The NCCL group of kernels/collective.h (the CUDA backend's transport). NCCL is opened at run time, so that the
// binary starts where it is not installed; only its header is needed to build.
#include "kernels/collective.h"

#include <cstdio>
#include <exception>

#include "core/error.h"
#include "core/shared_library.h"
#include "kernels/runtime.h"

#if NT_WITH_NCCL
#include <nccl.h>
#endif

namespace nt::kernels::nccl {

std::string UniqueId::hex() const {
  std::string out;
  out.reserve(bytes.size() * 2);
  char digits[3];
  for (char c : bytes) {
    std::snprintf(digits, sizeof digits, "%02x", static_cast<unsigned char>(c));
    out += digits;
  }
  return out;
}

UniqueId UniqueId::from_hex(const std::string& hex) {
  UniqueId id;
  if (hex.size() != id.bytes.size() * 2)
    throw Error(cat("an NCCL unique id is ", id.bytes.size() * 2, " hex digits, got ", hex.size(), " characters"));
  auto nibble = [&](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw Error(cat("an NCCL unique id holds a character that is no hex digit: '", c, "'"));
  };
  for (size_t i = 0; i < id.bytes.size(); ++i)
    id.bytes[i] = static_cast<char>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  return id;
}

#if NT_WITH_NCCL

namespace {

struct NcclApi {
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRank) init_rank = nullptr;
  decltype(&::ncclCommDestroy) destroy = nullptr;
  decltype(&::ncclCommAbort) abort = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
};

struct NcclLibrary {
  NcclApi api;
  std::string path;
  std::string error;  // why it is not loaded
  bool loaded = false;
};

NcclLibrary load() {
  NcclLibrary lib;
  NcclApi& a = lib.api;
  const OpenedLibrary opened = open_first_library(
      "NCCL", "NT_NCCL_LIBRARY", library_search("NT_NCCL_LIBRARY", NT_NCCL_TOOLKIT_LIBRARY_DIR),
      {"libnccl.so.2", "libnccl.so"},
      [&](void* handle, std::string& missing) {
        return resolve(handle, "ncclGetVersion", a.get_version, missing) &&
               resolve(handle, "ncclGetUniqueId", a.get_unique_id, missing) &&
               resolve(handle, "ncclCommInitRank", a.init_rank, missing) &&
               resolve(handle, "ncclCommDestroy", a.destroy, missing) &&
               resolve(handle, "ncclCommAbort", a.abort, missing) &&
               resolve(handle, "ncclAllReduce", a.all_reduce, missing) &&
               resolve(handle, "ncclAllGather", a.all_gather, missing) &&
               resolve(handle, "ncclBroadcast", a.broadcast, missing) &&
               resolve(handle, "ncclGetErrorString", a.error_string, missing);
      },
      "install libnccl2, or ");
  lib.loaded = opened.handle != nullptr;
  lib.path = opened.path;
  lib.error = opened.error;
  return lib;
}

const NcclLibrary& library() {
  static const NcclLibrary lib = load();
  return lib;
}

const NcclApi& api() {
  const NcclLibrary& lib = library();
  if (!lib.loaded) throw Error(lib.error);
  return lib.api;
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(cat(what, " failed: ", api().error_string(r), " (NCCL error ", int(r), ")"));
}

cudaStream_t stream_of(const Exec& exec) { return static_cast<cudaStream_t>(exec.stream); }

// NCCL launches its own kernel, one per collective on more than one rank: the profiler is told of each as of a launch
// of the engine's, so that the table has its row and CUPTI's kernel records of the stream match its launches one to
// one (a collective the profiler was not told of would leave a record too many, and the stream unmatched) (the events
// and CUPTI timers; the launch-stamps timer would wait for stamps that NCCL's kernel never writes, so it is not told).
class CollectiveScope {
 public:
  CollectiveScope(const Exec& exec, const char* name, double bytes)
      : observer_(exec.observer && !exec.observer->times_with_launch_stamps() ? exec.observer : nullptr),
        name_(name),
        stream_(exec.stream),
        bytes_(bytes) {
    if (observer_) observer_->begin(name_, stream_);
  }
  ~CollectiveScope() {
    if (observer_ && !std::uncaught_exceptions()) observer_->end(name_, stream_, {.bytes = bytes_});
  }
  CollectiveScope(const CollectiveScope&) = delete;
  CollectiveScope& operator=(const CollectiveScope&) = delete;

 private:
  profile::LaunchObserver* observer_;
  const char* name_;
  void* stream_;
  double bytes_;
};

class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(const UniqueId& id, int rank, int world) : ProcessGroup(rank, world) {
    ncclUniqueId raw;
    static_assert(sizeof raw.internal == sizeof id.bytes);
    std::copy(id.bytes.begin(), id.bytes.end(), raw.internal);
    check(api().init_rank(&comm_, world, raw, rank), "ncclCommInitRank");
  }
  ~NcclGroup() override {
    // After an error a rank may be gone for good: destroying would wait for it, aborting does not.
    if (comm_) (std::uncaught_exceptions() ? api().abort : api().destroy)(comm_);
  }
  std::string describe() const override { return cat("NCCL ", version(), ", ", world_, " ranks"); }

  void all_reduce_mean(const Exec& exec, float* data, size_t n) override {
    const CollectiveScope scope(exec, "nccl_all_reduce_mean", 2.0 * double(n * sizeof(float)));
    check(api().all_reduce(data, data, n, ncclFloat32, ncclAvg, comm_, stream_of(exec)), "ncclAllReduce");
  }
  // On one rank a sum, a gather or a broadcast leaves the data as it is: no NCCL call, so no kernel that the profiler
  // would have to be told of (or not) by NCCL's choice.
  void all_reduce_sum(const Exec& exec, double* data, size_t n) override {
    if (world_ == 1) return;
    const CollectiveScope scope(exec, "nccl_all_reduce_sum", 2.0 * double(n * sizeof(double)));
    check(api().all_reduce(data, data, n, ncclFloat64, ncclSum, comm_, stream_of(exec)), "ncclAllReduce");
  }
  void all_reduce_sum(const Exec& exec, int64_t* data, size_t n) override {
    if (world_ == 1) return;
    const CollectiveScope scope(exec, "nccl_all_reduce_sum", 2.0 * double(n * sizeof(int64_t)));
    check(api().all_reduce(data, data, n, ncclInt64, ncclSum, comm_, stream_of(exec)), "ncclAllReduce");
  }
  void all_gather(const Exec& exec, const float* send, float* recv, size_t n) override {
    if (world_ == 1) return copy_device_to_device(exec, recv, send, n * sizeof(float));
    const CollectiveScope scope(exec, "nccl_all_gather", double(world_ + 1) * double(n * sizeof(float)));
    check(api().all_gather(send, recv, n, ncclFloat32, comm_, stream_of(exec)), "ncclAllGather");
  }
  void broadcast(const Exec& exec, void* data, size_t bytes) override {
    if (world_ == 1) return;
    const CollectiveScope scope(exec, "nccl_broadcast", 2.0 * double(bytes));
    check(api().broadcast(data, data, bytes, ncclUint8, 0, comm_, stream_of(exec)), "ncclBroadcast");
  }

 private:
  ncclComm_t comm_ = nullptr;
};

}  // namespace

bool available(std::string* why) {
  const NcclLibrary& lib = library();
  if (!lib.loaded && why) *why = lib.error;
  return lib.loaded;
}

std::string version() {
  int v = 0;
  if (!available() || api().get_version(&v) != ncclSuccess) return "?";
  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch from 2.9 on.
  return cat(v / 10000, ".", v / 100 % 100, ".", v % 100);
}

UniqueId unique_id() {
  ncclUniqueId raw;
  check(api().get_unique_id(&raw), "ncclGetUniqueId");
  UniqueId id;
  std::copy(std::begin(raw.internal), std::end(raw.internal), id.bytes.begin());
  return id;
}

std::unique_ptr<ProcessGroup> process_group(const Exec& exec, const UniqueId& id, int rank, int world) {
  NT_CHECK(exec.on_cuda(), "an NCCL group runs on the CUDA backend");
  return std::make_unique<NcclGroup>(id, rank, world);
}

#else  // a build without CUDA or without nccl.h

namespace {
const char* kNoNccl = "this build of nanotrain has no NCCL (built without CUDA or without nccl.h)";
}

bool available(std::string* why) {
  if (why) *why = kNoNccl;
  return false;
}
std::string version() { return "none"; }
UniqueId unique_id() { throw Error(kNoNccl); }
std::unique_ptr<ProcessGroup> process_group(const Exec&, const UniqueId&, int, int) { throw Error(kNoNccl); }

#endif

}  // namespace nt::kernels::nccl
