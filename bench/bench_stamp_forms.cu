// What each piece of the launch stamps' code costs a chain of kernels when no stamp is written. The profiling build
// (NT_LAUNCH_STAMPS) costs the mlp's graph epoch about 0.2 us per kernel with profiling off, in every form of the
// stamping code tried, while the ring as an unread parameter costs nothing (docs/profiler.md, "Launch stamps"). Here
// each form is compiled into the default build beside the others, its ring passed empty as the engine passes it with
// profiling off, so one run compares them on one GPU.
//
//   bench_stamp_forms [--launches N]
//
// Forms (the code each kernel runs at its start; after it, the body):
//   plain          wait; trigger                                 (the default build; the ring an unread parameter)
//   v5             the profiling build's begin_dependent_kernel: thread test, then (never taken) timer, atomic and
//                  start store before the wait; after it a null test on the slot, (never taken) timer and store
//   before only    v5's part before the wait; nothing after it
//   after only     after the wait a test of the ring's pointer (a parameter read) and, never taken, timer and store
//   timer after    after the wait a timer read predicated on the thread test: no parameter, no store
//   store after    after the wait a store predicated on the ring's pointer: no timer
// Bodies: spin (thread 0 spins 2 us on %globaltimer) and load (every thread sums 32 floats of a buffer of 32 per thread,
// coalesced, and thread 0 writes its block's sum: a kernel whose work starts with global loads after its wait, as a
// GEMM's). Grids of one block and of two blocks per SM, 128 threads. Each cell: N launches of one kernel captured as
// one graph under programmatic dependent launch and replayed, the median us per launch over 20 replays after a
// warm-up (bench_timing.h); the difference against plain in the same table.
#include <cuda_runtime.h>

#include <cstdio>

#include "bench/bench_cli.h"
#include "bench/bench_timing.h"
#include "kernels/cuda/global_timer.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/runtime.h"
#include "profile/launch_stamps.h"

namespace {

namespace cuda = nt::kernels::cuda;
using nt::profile::LaunchStamp;
using nt::profile::LaunchStampRing;

enum Form { kPlain, kV5, kBeforeOnly, kAfterOnly, kTimerAfter, kStoreAfter };
constexpr const char* kFormNames[] = {"plain", "v5", "before only", "after only", "timer after", "store after"};
enum Body { kSpin, kLoad };

constexpr int kThreads = 128;
constexpr int kLoadsPerThread = 32;
constexpr unsigned long long kSpinNs = 2000;

__device__ __forceinline__ bool first_thread() {
  return (threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0;
}
// The dependency wait and the trigger exist from sm_90 on; main() refuses older GPUs, whose code never runs.
__device__ __forceinline__ void wait_for_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void let_successor_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <Form kForm>
__device__ __forceinline__ void prologue(const LaunchStampRing& ring) {
  if constexpr (kForm == kPlain) {
    wait_for_predecessor();
    let_successor_launch();
  } else if constexpr (kForm == kV5 || kForm == kBeforeOnly) {
    LaunchStamp* stamp = nullptr;
    if (ring.slots != nullptr && first_thread()) {
      const unsigned long long start_ns = cuda::global_timer_ns();
      const unsigned int slot = atomicAdd(ring.count, 1u);
      if (slot < ring.capacity) {
        stamp = ring.slots + slot;
        stamp->start_ns = start_ns;
      }
    }
    wait_for_predecessor();
    if (kForm == kV5 && stamp != nullptr) stamp->release_ns = cuda::global_timer_ns();
    let_successor_launch();
  } else if constexpr (kForm == kAfterOnly) {
    wait_for_predecessor();
    if (ring.slots != nullptr && first_thread()) ring.slots->release_ns = cuda::global_timer_ns();
    let_successor_launch();
  } else if constexpr (kForm == kTimerAfter) {
    unsigned long long t = 0;
    wait_for_predecessor();
    if (blockIdx.x == 0x7FFFFFFF) t = cuda::global_timer_ns();  // never true, unknown to the compiler
    let_successor_launch();
    if (t == 1) __trap();
  } else {
    wait_for_predecessor();
    if (ring.slots != nullptr) ring.slots->release_ns = 1;
    let_successor_launch();
  }
}

template <Form kForm, Body kBody>
__global__ void __launch_bounds__(kThreads)
    form_kernel(const float* __restrict__ data, float* __restrict__ sums, LaunchStampRing ring, cuda::StampRing) {
  prologue<kForm>(ring);
  if constexpr (kBody == kSpin) {
    if (threadIdx.x == 0) {
      const unsigned long long t0 = cuda::global_timer_ns();
      while (cuda::global_timer_ns() - t0 < kSpinNs) {
      }
    }
  } else {
    const float* block_data = data + size_t(blockIdx.x) * kThreads * kLoadsPerThread;
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kLoadsPerThread; ++k) sum += block_data[k * kThreads + threadIdx.x];
    if (threadIdx.x == 0) sums[blockIdx.x] = sum;  // one lane's share: enough to keep the loads
  }
}

template <Form kForm, Body kBody>
double per_launch_us(const nt::kernels::Exec& exec, int launches, int blocks, const float* data, float* sums) {
  return nt::bench::time_graph_us(exec, launches, 20, [&] {
    cuda::launch(exec, kFormNames[kForm], {}, form_kernel<kForm, kBody>, dim3(blocks), dim3(kThreads), 0, data, sums,
                 LaunchStampRing{});
  });
}

template <Body kBody>
void table(const nt::kernels::Exec& exec, int launches, int blocks, const float* data, float* sums) {
  const double times[] = {
      per_launch_us<kPlain, kBody>(exec, launches, blocks, data, sums),
      per_launch_us<kV5, kBody>(exec, launches, blocks, data, sums),
      per_launch_us<kBeforeOnly, kBody>(exec, launches, blocks, data, sums),
      per_launch_us<kAfterOnly, kBody>(exec, launches, blocks, data, sums),
      per_launch_us<kTimerAfter, kBody>(exec, launches, blocks, data, sums),
      per_launch_us<kStoreAfter, kBody>(exec, launches, blocks, data, sums),
  };
  std::printf("\n%d launches, body %s, %d block(s) of %d threads, programmatic launch; us per launch (median of 20)\n",
              launches, kBody == kSpin ? "spin 2 us" : "load 32 floats per thread", blocks, kThreads);
  std::printf("%-12s | %8s | %10s\n", "form", "us", "- plain");
  for (int f = 0; f < 6; ++f) std::printf("%-12s | %8.3f | %+10.3f\n", kFormNames[f], times[f], times[f] - times[0]);
}

}  // namespace

int main(int argc, char** argv) {
  int launches = 2000;
  if (const auto bad = nt::bench::parse_count(argc, argv, "bench_stamp_forms", "--launches", 10, 100000, &launches))
    return *bad;
  auto found = nt::bench::cuda_bench_exec("bench_stamp_forms");
  if (!found) return 1;
  nt::kernels::Exec exec = *found;
  if (!cuda::programmatic_launch_supported()) {
    std::fprintf(stderr, "bench_stamp_forms: needs programmatic dependent launch (sm_90 or newer)\n");
    return 1;
  }
  exec.programmatic_launch = true;
  int sms = 0;
  NT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t floats = size_t(2 * sms) * kThreads * kLoadsPerThread;
  float *data = nullptr, *sums = nullptr;
  NT_CUDA_CHECK(cudaMalloc(&data, floats * sizeof(float)));
  NT_CUDA_CHECK(cudaMemset(data, 0, floats * sizeof(float)));
  NT_CUDA_CHECK(cudaMalloc(&sums, size_t(2 * sms) * sizeof(float)));
  for (const int blocks : {1, 2 * sms}) {
    table<kSpin>(exec, launches, blocks, data, sums);
    table<kLoad>(exec, launches, blocks, data, sums);
  }
  NT_CUDA_CHECK(cudaFree(data));
  NT_CUDA_CHECK(cudaFree(sums));
  return 0;
}
