// Kernels of known length for bench_launch: one block of 32 threads whose thread 0 spins on %globaltimer
// (ns) for a fixed time. Kept apart from bench_launch.cpp, which drives the (C++20) KernelProfiler.
#pragma once

#include "kernels/exec.h"

namespace nt::bench {

struct Spin {
  const char* name;  // the profiler's name; Nsight Compute sees spin_kernel<micros>
  int micros;        // 0: an empty kernel
};

inline constexpr Spin kSpins[] = {
    {"spin_0us", 0}, {"spin_2us", 2}, {"spin_5us", 5}, {"spin_10us", 10}, {"spin_20us", 20}};
inline constexpr int kSpinCount = sizeof(kSpins) / sizeof(kSpins[0]);

// Launches kSpins[index] through the engine's launch path (named, observed, checked).
void launch_spin(const kernels::Exec& exec, int index);

// The empty spin launched by an API directly, with programmatic stream serialization as the launch path asks for it:
// the floor under the launch path's host cost (bench_eager_host). Checked, but neither named nor observed.
enum class LaunchApi { runtime, driver };  // cudaLaunchKernelExC; cuLaunchKernelEx
void launch_empty_directly(void* stream, LaunchApi api);

}  // namespace nt::bench
