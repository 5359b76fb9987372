// Kernels that exist only for the profiler's GPU tests (tests/cuda/test_profile_timeline_cuda.cpp), launched through
// the engine's one launch path like every kernel: spins of a known length, and one that stamps its phases.
#pragma once

#include "kernels/exec.h"

namespace nt::test {

// One block whose thread 0 spins on %globaltimer for `micros` microseconds, on exec's stream. beside: declared to run
// beside its predecessor (launch.cuh, begin_overlapping_kernel), which it must then not depend on.
void launch_spin(const kernels::Exec& exec, const char* name, int micros, bool beside = false);

// One block whose thread 0 marks phase k (profile/phase_stamps.h) and spins phase_micros[k] microseconds, for each k
// < phases in turn, then marks the end; the phases are named "phase 0", "phase 1", ... (at most 4).
void launch_phased_spin(const kernels::Exec& exec, const int* phase_micros, int phases);

}  // namespace nt::test
