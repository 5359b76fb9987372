// The execution handle every op takes: which backend runs it and with what.
//
// Ops are functions of this handle and their family's args struct (raw pointers and sizes); they know nothing of
// Tensor or layers. kernels/cpu/<family>.cpp and kernels/cuda/<family>.cu implement `cpu::op` and `cuda::op`; the
// header's `op` picks one by `backend` through kernels/dispatch.h.
#pragma once

#include "core/error.h"
#include "profile/launch_observer.h"

// Marks a function that host code and CUDA kernels share (the scalars both backends must compute alike).
#if defined(__CUDACC__)
#define NT_HOST_DEVICE __host__ __device__
#else
#define NT_HOST_DEVICE
#endif

namespace nt::kernels {

enum class Backend { cpu, cuda };

class ThreadPool;

using Math = profile::Math;

struct Exec {
  Backend backend = Backend::cpu;
  void* stream = nullptr;           // cudaStream_t of the CUDA backend; unused on the CPU
  ThreadPool* pool = nullptr;       // CPU worker threads; nullptr runs on the calling thread alone
  bool debug_sync = false;          // CUDA: synchronize and check after every launch
  bool programmatic_launch = true;  // CUDA sm_90+: a kernel may launch while its predecessor runs (launch.cuh)
  // What the products of the convolutions and GEMMs see (kernels/operand.h): fp32; TF32 operands for the
  // convolutions (CUDA sm_80+, tensor cores); or BF16 operands for the convolutions and GEMMs (mixed precision, as
  // PyTorch's autocast: on CUDA sm_80+ tensor cores, on the CPU the same rounding as its twin). Sums stay fp32.
  Math math = Math::fp32;
  profile::LaunchObserver* observer = nullptr;  // profiler hook; nullptr = profiling off

  bool on_cuda() const { return backend == Backend::cuda; }
};

}  // namespace nt::kernels
