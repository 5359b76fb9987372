// Collectives for data-parallel training: the ranks of a run and what they exchange.
//
// A synchronous data-parallel step on W ranks (docs/data-parallel.md):
//   each rank r: gather its slice of the global batch -> forward -> loss -> backward      (grads of its B rows)
//   all_reduce_mean(grads)      grads[i] = (1/W) · Σ_r grads_r[i], the same bits on every rank
//   each rank: the same optimizer update on the same weights, so the weights stay identical everywhere
// Epoch totals (loss sum, correct count) are summed with all_reduce_sum; initial weights and BatchNorm buffers go
// from rank 0 to all with broadcast. Synchronized BatchNorm (--sync-bn) all_gathers each rank's statistics partials
// in the forward pass and all_reduce_means its gradient sums in the backward (kernels/batchnorm.h).
//
// Transports (never a home-made one):
//   single    one process, W = 1: every collective leaves the data as it is (all_reduce_mean divides by 1)
//   mpi       the CPU backend (host pointers), over MPI_COMM_WORLD. Fixed order: every rank gathers every rank's
//             values (MPI_Allgather) and sums them itself in rank order, ((g0 + g1) + g2) + ..., then multiplies
//             by 1/W, so the result does not depend on MPI's reduction algorithm and is the same on every rank.
//   nccl      the CUDA backend (device pointers), on the Exec's stream, so it is captured into the epoch's CUDA
//             graph like a kernel. ncclAvg for the mean; NCCL's algorithm for a given ring of ranks is fixed, so
//             two runs on the same GPUs give the same bits. The library is opened at run time (NT_NCCL_LIBRARY
//             names it, else libnccl.so.2 is searched for as core/shared_library.h says).
// Collectives never allocate: MPI's gather buffer is sized once, at creation, for the largest exchange.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/exec.h"

namespace nt::kernels {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  int rank() const { return rank_; }
  int world() const { return world_; }
  virtual std::string describe() const = 0;  // "NCCL 2.28.9, 2 ranks"

  // data (n values, in memory of exec's backend) becomes the mean, or the sum, over the ranks, in place.
  virtual void all_reduce_mean(const Exec& exec, float* data, size_t n) = 0;
  virtual void all_reduce_sum(const Exec& exec, double* data, size_t n) = 0;
  virtual void all_reduce_sum(const Exec& exec, int64_t* data, size_t n) = 0;
  // Every rank's n values: recv (world·n values) holds rank r's `send` at recv + r·n, on every rank. send and recv
  // do not overlap.
  virtual void all_gather(const Exec& exec, const float* send, float* recv, size_t n) = 0;
  // Rank 0's bytes on every rank.
  virtual void broadcast(const Exec& exec, void* data, size_t bytes) = 0;

 protected:
  ProcessGroup(int rank, int world) : rank_(rank), world_(world) {}
  int rank_, world_;
};

// World 1, no transport.
std::unique_ptr<ProcessGroup> single_process_group();

// ---- MPI: the processes that mpirun started ----------------------------------------------------------------
namespace mpi {
bool built();     // this binary has MPI
bool launched();  // the environment says mpirun (Open MPI, MPICH or PMIx) started this process
// MPI_Init (once per process); throws nt::Error when the build has no MPI.
void init();
void finalize() noexcept;  // when init() was called
// Ends every rank: after an error on one rank, so that none waits forever in a collective.
[[noreturn]] void abort(int exit_code) noexcept;
int rank();        // in MPI_COMM_WORLD
int world();       // its size
int local_rank();  // among the ranks on this machine (OMPI_COMM_WORLD_LOCAL_RANK and the like; else the rank)
int local_world();
void broadcast_host(void* data, size_t bytes);  // rank 0's bytes everywhere, through MPI_COMM_WORLD
// The CPU backend's group over MPI_COMM_WORLD; its all_reduce_mean takes up to max_floats values.
std::unique_ptr<ProcessGroup> process_group(size_t max_floats);
}  // namespace mpi

// ---- NCCL: one process per GPU ---------------------------------------------------------------------------
namespace nccl {
// ncclUniqueId's bytes: made by rank 0, handed to the others before they join (environment, MPI broadcast).
struct UniqueId {
  std::array<char, 128> bytes{};
  std::string hex() const;
  static UniqueId from_hex(const std::string& hex);  // throws nt::Error for text that is not 256 hex digits
};
// Whether NCCL can be used here: this binary was built with its header and the library loads. `why` when not.
bool available(std::string* why = nullptr);
std::string version();  // "2.28.9"
UniqueId unique_id();   // throws nt::Error naming what is missing
// The CUDA backend's group: this process is `rank` of `world`, on exec's device and stream. Blocks until every
// rank has joined.
std::unique_ptr<ProcessGroup> process_group(const Exec& exec, const UniqueId& id, int rank, int world);
}  // namespace nccl

}  // namespace nt::kernels
