// The single-process group and the MPI group of kernels/collective.h (the CPU backend's transport).
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/collective.h"
#include "kernels/cpu/op_scope.h"
#include "kernels/runtime.h"

#if NT_WITH_MPI
#include <mpi.h>
#endif

namespace nt::kernels {

namespace {

class SingleProcessGroup final : public ProcessGroup {
 public:
  SingleProcessGroup() : ProcessGroup(0, 1) {}
  std::string describe() const override { return "one process"; }
  void all_reduce_mean(const Exec&, float*, size_t) override {}
  void all_reduce_sum(const Exec&, double*, size_t) override {}
  void all_reduce_sum(const Exec&, int64_t*, size_t) override {}
  void all_gather(const Exec& exec, const float* send, float* recv, size_t n) override {
    copy_device_to_device(exec, recv, send, n * sizeof(float));  // either backend (kernels/runtime.h)
  }
  void broadcast(const Exec&, void*, size_t) override {}
};

// The first of the variables that launchers set, as a number; `fallback` when none is set.
int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* name : names)
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return fallback;
}

// This process's rank and world as the launcher's environment gives them (before MPI_Init, or without MPI).
int launcher_rank() { return env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}, 0); }
int launcher_world() { return env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}, 1); }

}  // namespace

std::unique_ptr<ProcessGroup> single_process_group() { return std::make_unique<SingleProcessGroup>(); }

namespace mpi {

bool launched() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(name)) return true;
  return false;
}

int local_rank() { return env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"}, rank()); }
int local_world() { return env_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"}, world()); }

#if NT_WITH_MPI

namespace {

bool initialized() {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

void check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(cat(what, " failed: ", std::string(text, static_cast<size_t>(length))));
}

// Collectives over MPI_COMM_WORLD on host memory, each rank summing every rank's values in rank order.
class MpiGroup final : public ProcessGroup {
 public:
  explicit MpiGroup(size_t max_floats)
      : ProcessGroup(mpi::rank(), mpi::world()), gathered_(max_floats * static_cast<size_t>(world_)) {}

  std::string describe() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string first_line(version, static_cast<size_t>(length));
    first_line = first_line.substr(0, first_line.find_first_of(",\n"));
    return cat(first_line, ", ", world_, " ranks");
  }

  void all_reduce_mean(const Exec& exec, float* data, size_t n) override {
    // Each rank's values out, every rank's in: the bytes of the exchange, the profiler's row "mpi_all_reduce_mean".
    const cpu::OpScope scope(exec, "mpi_all_reduce_mean", {.bytes = double(n * sizeof(float)) * (1 + world_)});
    NT_CHECK(n * static_cast<size_t>(world_) <= gathered_.size(), "all_reduce_mean of ", n,
             " values, over the group's ", gathered_.size() / static_cast<size_t>(world_));
    sum_in_rank_order(data, n, gathered_.data(), MPI_FLOAT);
    const float inv_world = 1.f / static_cast<float>(world_);
    for (size_t i = 0; i < n; ++i) data[i] *= inv_world;
  }
  void all_reduce_sum(const Exec&, double* data, size_t n) override {
    std::vector<double> gathered(n * static_cast<size_t>(world_));  // epoch totals: between epochs, a few values
    sum_in_rank_order(data, n, gathered.data(), MPI_DOUBLE);
  }
  void all_reduce_sum(const Exec&, int64_t* data, size_t n) override {
    std::vector<int64_t> gathered(n * static_cast<size_t>(world_));
    sum_in_rank_order(data, n, gathered.data(), MPI_INT64_T);
  }
  void all_gather(const Exec& exec, const float* send, float* recv, size_t n) override {
    const cpu::OpScope scope(exec, "mpi_all_gather", {.bytes = double(n * sizeof(float)) * (1 + world_)});
    const int count = checked_count(n);
    check(MPI_Allgather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, MPI_COMM_WORLD), "MPI_Allgather");
  }
  void broadcast(const Exec&, void* data, size_t bytes) override { broadcast_host(data, bytes); }

 private:
  template <class T>
  void sum_in_rank_order(T* data, size_t n, T* gathered, MPI_Datatype type) {
    const int count = checked_count(n);
    check(MPI_Allgather(data, count, type, gathered, count, type, MPI_COMM_WORLD), "MPI_Allgather");
    std::memcpy(data, gathered, n * sizeof(T));
    for (int r = 1; r < world_; ++r) {
      const T* theirs = gathered + static_cast<size_t>(r) * n;
      for (size_t i = 0; i < n; ++i) data[i] += theirs[i];
    }
  }
  static int checked_count(size_t n) {
    NT_CHECK(n <= static_cast<size_t>(INT32_MAX), "an MPI exchange of ", n, " values (over 2^31)");
    return static_cast<int>(n);
  }
  std::vector<float> gathered_;  // (world, max_floats): every rank's gradients
};

}  // namespace

bool built() { return true; }

void init() {
  if (!initialized()) check(MPI_Init(nullptr, nullptr), "MPI_Init");
}

void finalize() noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (initialized() && !finalized) MPI_Finalize();
}

void abort(int exit_code) noexcept {
  if (initialized()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

int rank() {
  if (!initialized()) return launcher_rank();
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world() {
  if (!initialized()) return launcher_world();
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

void broadcast_host(void* data, size_t bytes) {
  NT_CHECK(bytes <= static_cast<size_t>(INT32_MAX), "an MPI broadcast of ", bytes, " bytes (over 2^31)");
  check(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
}

std::unique_ptr<ProcessGroup> process_group(size_t max_floats) {
  init();
  return std::make_unique<MpiGroup>(max_floats);
}

#else  // a build without MPI

namespace {
[[noreturn]] void no_mpi() {
  throw Error("this build of nanotrain has no MPI: install libopenmpi-dev and build again (scripts/setup does)");
}
}  // namespace

bool built() { return false; }
void init() { no_mpi(); }
void finalize() noexcept {}
void abort(int exit_code) noexcept { std::_Exit(exit_code); }
int rank() { return launcher_rank(); }
int world() { return launcher_world(); }
void broadcast_host(void*, size_t) { no_mpi(); }
std::unique_ptr<ProcessGroup> process_group(size_t) { no_mpi(); }

#endif

}  // namespace mpi

}  // namespace nt::kernels
