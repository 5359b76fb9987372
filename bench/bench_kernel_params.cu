// What a kernel's parameters cost a chain of small kernels replayed from a CUDA graph under programmatic dependent
// launch, the way the engine runs its steps. An unread 8-byte parameter added to every kernel cost the mlp's graph
// epoch about 1 ms (0.12 us per kernel, H200) while an empty one cost nothing (docs/profiler.md, "Launch stamps"):
// this isolates that effect from the engine's kernels.
//
//   bench_kernel_params [--launches N]
//
// Each row: N launches of one kernel (blocks of 32 threads that wait for their predecessor and let their successor
// launch, then spin for 2 us on %globaltimer), captured as one graph and replayed; the median us per launch over 20
// replays after a warm-up (bench_timing.h). The kernels differ only in an unread by-value parameter of the row's size
// (none: only the StampRing every kernel takes), and in whether the block reads the parameter's first word. Each table
// repeats the rows for one grid (one block, or two blocks per SM, since the parameters reach every SM that runs a
// block) and with programmatic launch on or off.
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
double per_launch_us(const nt::kernels::Exec& exec, int launches, int blocks, unsigned int* sink) {
  Payload<kBytes> payload{};
  return nt::bench::time_graph_us(exec, launches, 20, [&] {
    cuda::launch(exec, "payload", {}, payload_kernel<kBytes, kRead>, dim3(blocks), dim3(32), 0, payload, sink);
  });
}

template <int kBytes>
void row(const nt::kernels::Exec& exec, int launches, int blocks, unsigned int* sink, double base) {
  const double unread = per_launch_us<kBytes, false>(exec, launches, blocks, sink);
  const double read = per_launch_us<kBytes, true>(exec, launches, blocks, sink);
  std::printf("%11d | %9.3f | %7.3f | %13.3f\n", kBytes, unread, read, unread - base);
}

void table(nt::kernels::Exec exec, bool programmatic, int launches, int blocks, unsigned int* sink) {
  exec.programmatic_launch = programmatic;
  const double base = nt::bench::time_graph_us(
      exec, launches, 20, [&] { cuda::launch(exec, "no_payload", {}, no_payload_kernel, dim3(blocks), dim3(32), 0); });
  std::printf(
      "\n%d launches of a 2 us kernel of %d block(s) in one graph, programmatic launch %s; us per launch "
      "(median of 20)\n",
      launches, blocks, programmatic ? "on" : "off");
  std::printf("param bytes | unread us | read us | unread - none\n");
  std::printf("%11s | %9.3f | %7s | %13s\n", "none", base, "-", "-");
  row<8>(exec, launches, blocks, sink, base);
  row<24>(exec, launches, blocks, sink, base);
  row<128>(exec, launches, blocks, sink, base);
  row<1024>(exec, launches, blocks, sink, base);
}

}  // namespace

int main(int argc, char** argv) {
  int launches = 2000;
  if (const auto bad = nt::bench::parse_count(argc, argv, "bench_kernel_params", "--launches", 10, 100000, &launches))
    return *bad;
  const auto found = nt::bench::cuda_bench_exec("bench_kernel_params");
  if (!found) return 1;
  const nt::kernels::Exec& exec = *found;
  unsigned int* sink = nullptr;
  NT_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned int)));
  int sms = 0;
  NT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (const bool programmatic : {true, false})
    for (const int blocks : {1, 2 * sms}) table(exec, programmatic, launches, blocks, sink);
  NT_CUDA_CHECK(cudaFree(sink));
  return 0;
}
