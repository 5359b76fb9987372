// Data-parallel ranks: where this process stands, the process group it trains in, and the --gpus launcher
// (docs/data-parallel.md).
//
//   nanotrain train --gpus N ...      starts N copies of the same command, one per GPU of this machine, and waits
//                                     for them. Each finds NT_RANK, NT_WORLD and NT_NCCL_ID (the NCCL unique id,
//                                     made here) in its environment. A rank that fails, or is killed, stops the
//                                     others: no rank is left waiting in a collective.
//   mpirun -np N nanotrain train ...  the ranks are MPI's, on one or more machines: on GPUs rank 0 makes the NCCL
//                                     id and MPI broadcasts it; on the CPU backend MPI carries the gradients.
//                                     A rank that fails calls MPI_Abort, which ends them all.
// Rank 0 prints and writes every file (metrics, checkpoints, --save); the others print errors only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/context.h"
#include "kernels/collective.h"

namespace nt::app {

struct RankPlace {
  enum class Launcher { none, gpus, mpi };
  Launcher launcher = Launcher::none;
  int rank = 0, world = 1;
  int local_rank = 0, local_world = 1;  // among the ranks of this machine
  bool parallel() const { return launcher != Launcher::none; }
  bool leader() const { return rank == 0; }
};

// Read once, from the environment that --gpus or mpirun set (MPI_Init under mpirun). Throws nt::Error when it is
// inconsistent (NT_RANK out of range) or when mpirun started a build without MPI.
const RankPlace& rank_place();
// "rank 1: " in a data-parallel run, else "": what this process's error lines start with.
std::string rank_prefix();
// After an error has been printed: under mpirun, ends every rank with `exit_code` (MPI_Abort); else returns it.
int end_ranks_after_error(int exit_code);
// At the end of a successful command: MPI_Finalize under mpirun.
void finish_ranks();

// The parent of --gpus N: runs this process's command line N times, one rank per GPU, and waits for them all.
// Returns the first failing rank's exit code (128 + the signal for a rank killed), 0 when all succeed.
int launch_gpu_ranks(int gpus, const std::vector<std::string>& command_line);

// The group this rank trains in, on ctx's backend: NCCL on GPUs, MPI on the CPU; nullptr outside a parallel run.
// max_floats: the largest all_reduce_mean (the gradient block). Blocks until every rank has joined.
std::unique_ptr<kernels::ProcessGroup> join_process_group(const Context& ctx, size_t max_floats);

// The options of this rank's context: its GPU (its local rank), and on the CPU its share of the cores unless
// --threads says otherwise.
ContextOptions rank_context(ContextOptions options);

}  // namespace nt::app
