// What a kernel's parameters cost a chain of small kernels replayed from a CUDA graph under programmatic dependent
// launch, the way the engine runs its steps. An unread 8-byte parameter added to every kernel cost the mlp's graph
// epoch about 1 ms (0.12 us per kernel, H200) while an empty one cost nothing (docs/profiler.md, "Launch stamps"):
// this isolates that effect from the engine's kernels.
//
//   bench_kernel_params [--launches N]
//
// Each row: N launches of one kernel (one block of 32 threads that waits for its predecessor and lets its successor
// launch, then spins for 2 us on %globaltimer), captured as one graph and replayed; the median us per launch over 20
// replays after a warm-up (bench_timing.h). The kernels differ only in an unread by-value parameter of the row's size
// (0: none but the StampRing every kernel takes), and in whether the block reads the parameter's first word.
#include <cuda_runtime.h>

#include <cstdio>

#include "bench/bench_cli.h"
#include "bench/bench_timing.h"
#include "kernels/cuda/global_timer.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/runtime.h"

namespace {

namespace cuda = nt::kernels::cuda;

template <int kBytes>
struct Payload {
  unsigned int words[kBytes / 4];
};

constexpr unsigned long long kSpinNs = 2000;

__device__ void spin() {
  const unsigned long long t0 = cuda::global_timer_ns();
  while (cuda::global_timer_ns() - t0 < kSpinNs) {
  }
}

__global__ void no_payload_kernel(cuda::StampRing stamps) {
  cuda::begin_dependent_kernel(stamps);
  if (threadIdx.x == 0) spin();
}

template <int kBytes, bool kRead>
__global__ void payload_kernel(Payload<kBytes> payload, unsigned int* sink, cuda::StampRing stamps) {
  cuda::begin_dependent_kernel(stamps);
  if (threadIdx.x == 0) spin();
  if (kRead && threadIdx.x == 0 && payload.words[0] == 0xFFFFFFFFu) *sink = 1;  // never true: the read stays
}

template <int kBytes, bool kRead>
double per_launch_us(const nt::kernels::Exec& exec, int launches, unsigned int* sink) {
  Payload<kBytes> payload{};
  return nt::bench::time_graph_us(exec, launches, 20, [&] {
    cuda::launch(exec, "payload", {}, payload_kernel<kBytes, kRead>, dim3(1), dim3(32), 0, payload, sink);
  });
}

template <int kBytes>
void row(const nt::kernels::Exec& exec, int launches, unsigned int* sink, double base) {
  const double unread = per_launch_us<kBytes, false>(exec, launches, sink);
  const double read = per_launch_us<kBytes, true>(exec, launches, sink);
  std::printf("%9d | %12.3f | %10.3f | %12.3f\n", kBytes, unread, read, unread - base);
}

}  // namespace

int main(int argc, char** argv) {
  int launches = 2000;
  if (const auto bad = nt::bench::parse_count(argc, argv, "bench_kernel_params", "--launches", 10, 100000, &launches))
    return *bad;
  const auto found = nt::bench::cuda_bench_exec("bench_kernel_params");
  if (!found) return 1;
  const nt::kernels::Exec exec = *found;
  unsigned int* sink = nullptr;
  NT_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned int)));
  const double base = nt::bench::time_graph_us(
      exec, launches, 20, [&] { cuda::launch(exec, "no_payload", {}, no_payload_kernel, dim3(1), dim3(32), 0); });
  std::printf("%d launches of a 2 us kernel in one graph, programmatic launch; us per launch (median of 20)\n",
              launches);
  std::printf("param bytes | unread us | read us | unread - none\n");
  std::printf("%9s | %12.3f | %10s | %12s\n", "none", base, "-", "-");
  row<4>(exec, launches, sink, base);
  row<8>(exec, launches, sink, base);
  row<16>(exec, launches, sink, base);
  row<24>(exec, launches, sink, base);
  row<64>(exec, launches, sink, base);
  row<128>(exec, launches, sink, base);
  row<256>(exec, launches, sink, base);
  row<1024>(exec, launches, sink, base);
  NT_CUDA_CHECK(cudaFree(sink));
  return 0;
}
