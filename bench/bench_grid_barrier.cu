// What a barrier across the whole GPU costs: the floor under a persistent training kernel whose phases (forward,
// loss, backward, update) are separated by barriers (docs/persistent-mlp.md).
//
//   bench_grid_barrier [--barriers N]
//
// Each kernel runs N barriers back to back; its time less that of the same kernel running none, over N, is one
// barrier (CUDA events, the median of 20 repetitions after a warm-up; bench_timing.h). Blocks of 256 threads, all
// resident at once (checked with the occupancy API: a grid barrier with a block still waiting to be scheduled would
// never return). The barriers:
//
//   counter     thread 0 of each block adds to a counter in global memory (a release: its block's writes first); the
//               last to arrive resets the counter and bumps a generation word, on which the others spin (acquire
//               loads); then __syncthreads. One block per SM, then half and twice as many blocks.
//   + exchange  the same with a phase's worth of data moved between barriers: every block writes 1 KB and reads the
//               next block's 1 KB through L2 (132 KB a phase, the order of an mlp layer's activations at batch 64).
//   cluster     barrier.cluster across a cluster of 8 blocks, and of 16 (a non-portable size the kernel opts in to):
//               the hardware barrier of sm_90, whose blocks can read each other's shared memory; the barrier of a
//               design that keeps a layer's exchange within a cluster.
//
// And what every block reading the same activations costs (a layer's input read by all the blocks that own its
// outputs): each block reads one buffer of 80 KB (h1 at batch 64) through L2 (ld.global.cg: not from L1), 132 blocks;
// the time less an empty kernel's over the bytes moved is L2's delivery rate for this pattern, with one 16-byte load
// in flight per thread and with four. Then the gradient sum of a design with a weight copy per cluster: 8 partial
// gradients of the mlp's 303,680 weights, each block summing its slice of all 8 in a fixed order and writing it.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/bench_timing.h"
#include "core/cuda_check.h"
#include "kernels/cuda/grid_barrier.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/runtime.h"

namespace {

using nt::kernels::Exec;
namespace cuda = nt::kernels::cuda;
using cuda::grid_barrier;
using cuda::GridBarrier;
using cuda::StampRing;

constexpr int kThreads = 256;
constexpr int kExchangeFloats = 256;  // 1 KB per block per phase

// barriers: how many; exchange: nullptr, or kExchangeFloats per block written before and read after each barrier.
__global__ void counter_barrier_kernel(GridBarrier b, int barriers, float* exchange, float* sink, StampRing stamps) {
  cuda::begin_dependent_kernel(stamps);
  float acc = 0;
  for (int i = 0; i < barriers; ++i) {
    if (exchange)
      for (int j = threadIdx.x; j < kExchangeFloats; j += blockDim.x)
        exchange[blockIdx.x * kExchangeFloats + j] = acc + float(i + j);
    grid_barrier(b);
    if (exchange) {
      const unsigned int next = (blockIdx.x + 1) % gridDim.x;
      for (int j = threadIdx.x; j < kExchangeFloats; j += blockDim.x) acc += exchange[next * kExchangeFloats + j];
      grid_barrier(b);  // the next phase overwrites what this one read: a second barrier, as a real step would
    }
  }
  if (acc == -1.f) *sink = acc;  // keeps the reads
}

template <int kClusterBlocks>
__global__ void NT_CLUSTER_DIMS(kClusterBlocks, 1, 1) cluster_barrier_kernel(int barriers, StampRing stamps) {
  cuda::begin_dependent_kernel(stamps);
#if NT_CLUSTERS
  for (int i = 0; i < barriers; ++i)
    asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
#else
  (void)barriers;
#endif
}

// Every block reads all `floats4` of `in` (through L2: .cg), `rounds` times, kInFlight loads per thread at a time; the
// sum keeps the loads.
template <int kInFlight>
__global__ void broadcast_read_kernel(const float4* in, int floats4, int rounds, float* sink, StampRing stamps) {
  cuda::begin_dependent_kernel(stamps);
  float acc = 0;
  for (int r = 0; r < rounds; ++r)
    for (int i = threadIdx.x; i < floats4; i += blockDim.x * kInFlight) {
      float4 v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int k = i + u * blockDim.x;
        v[u] = k < floats4 ? __ldcg(in + k) : float4{0, 0, 0, 0};
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) acc += v[u].x + v[u].y + v[u].z + v[u].w;
    }
  if (acc == -1.f) *sink = acc;
}

// partials: `copies` arrays of `floats4` float4; block b sums its slice of each, in copy order, into out.
__global__ void gradient_sum_kernel(const float4* partials, int copies, int floats4, float4* out, int rounds,
                                    StampRing stamps) {
  cuda::begin_dependent_kernel(stamps);
  const int per_block = (floats4 + gridDim.x - 1) / gridDim.x;
  const int first = blockIdx.x * per_block, last = min(floats4, first + per_block);
  for (int r = 0; r < rounds; ++r)
    for (int i = first + threadIdx.x; i < last; i += blockDim.x) {
      float4 sum = __ldcg(partials + i);
      for (int c = 1; c < copies; ++c) {
        const float4 v = __ldcg(partials + size_t(c) * floats4 + i);
        sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
      }
      __stcg(out + i, sum);
    }
}

struct Result {
  std::string name;
  int blocks;
  double us_per_barrier;
};

}  // namespace

int main(int argc, char** argv) {
  int barriers = 2000;
  if (const auto bad = nt::bench::parse_count(argc, argv, "bench_grid_barrier", "--barriers", 1, 1000000, &barriers))
    return *bad;
  const auto found = nt::bench::cuda_bench_exec("bench_grid_barrier");
  if (!found) return 1;
  const nt::kernels::Exec exec = *found;
  const auto stream = static_cast<cudaStream_t>(exec.stream);
  const int sms = cuda::multiprocessor_count();
  int resident_per_sm = 0;
  NT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident_per_sm, counter_barrier_kernel, kThreads, 0));

  unsigned int* words = nullptr;
  float* exchange = nullptr;
  float* sink = nullptr;
  NT_CUDA_CHECK(cudaMalloc(&words, 2 * sizeof(unsigned int)));
  NT_CUDA_CHECK(cudaMemset(words, 0, 2 * sizeof(unsigned int)));
  NT_CUDA_CHECK(cudaMalloc(&exchange, sizeof(float) * kExchangeFloats * 2 * sms));
  NT_CUDA_CHECK(cudaMalloc(&sink, sizeof(float)));
  const GridBarrier barrier{words, words + 1};

  std::vector<Result> results;
  // Per barrier: (N barriers) - (none), over N. With the exchange, one phase is two barriers and the data between.
  const auto per_barrier = [&](const auto& run, int per_phase) {
    const double with = nt::bench::time_loop_us(stream, 3, 20, [&] { run(barriers); });
    const double without = nt::bench::time_loop_us(stream, 3, 20, [&] { run(0); });
    return (with - without) / (double(barriers) * per_phase);
  };
  for (const int blocks : {sms, sms / 2, 2 * sms}) {
    if (blocks > sms * resident_per_sm) continue;  // not all resident: a grid barrier would hang
    results.push_back({"counter", blocks,
                       per_barrier(
                           [&](int n) {
                             cuda::launch(exec, "counter_barrier", {}, counter_barrier_kernel, dim3(blocks),
                                          dim3(kThreads), 0, barrier, n, static_cast<float*>(nullptr), sink);
                           },
                           1)});
  }
  results.push_back({"counter + 1 KB exchange a block, per phase", sms,
                     per_barrier(
                         [&](int n) {
                           cuda::launch(exec, "counter_barrier_exchange", {}, counter_barrier_kernel, dim3(sms),
                                        dim3(kThreads), 0, barrier, n, exchange, sink);
                         },
                         1)});
  if (cuda::cluster_kernels_run(cluster_barrier_kernel<8>)) {
    const int blocks = sms / 8 * 8;
    results.push_back({"cluster of 8", blocks,
                       per_barrier(
                           [&](int n) {
                             cuda::launch(exec, "cluster_barrier", {}, cluster_barrier_kernel<8>, dim3(blocks),
                                          dim3(kThreads), 0, n);
                           },
                           1)});
    // 16 blocks is beyond the portable cluster size: the kernel must opt in, and the device may refuse.
    if (cudaFuncSetAttribute(cluster_barrier_kernel<16>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
        cudaSuccess) {
      const int blocks16 = sms / 16 * 16;
      results.push_back({"cluster of 16", blocks16,
                         per_barrier(
                             [&](int n) {
                               cuda::launch(exec, "cluster_barrier", {}, cluster_barrier_kernel<16>, dim3(blocks16),
                                            dim3(kThreads), 0, n);
                             },
                             1)});
    } else {
      cudaGetLastError();
      std::printf("cluster of 16: not allowed on this device\n");
    }
  }
  std::printf(
      "barrier                                    | blocks | us per barrier   (%d barriers a kernel, %d SMs, "
      "%d blocks of %d threads resident per SM)\n",
      barriers, sms, resident_per_sm, kThreads);
  for (const Result& r : results) std::printf("%-42s | %6d | %8.3f\n", r.name.c_str(), r.blocks, r.us_per_barrier);

  // The same activations read by every block.
  constexpr int kActivationFloats4 = 64 * 320 / 4;  // h1 at batch 64: 80 KB
  constexpr int kRounds = 50;
  float4* activations = nullptr;
  NT_CUDA_CHECK(cudaMalloc(&activations, sizeof(float4) * kActivationFloats4));
  NT_CUDA_CHECK(cudaMemset(activations, 0, sizeof(float4) * kActivationFloats4));
  const double bytes = double(sms) * kActivationFloats4 * sizeof(float4);
  const auto broadcast = [&](auto kernel, int in_flight) {
    const auto read_us = [&](int rounds) {
      return nt::bench::time_loop_us(stream, 3, 20, [&] {
        cuda::launch(exec, "broadcast_read", {}, kernel, dim3(sms), dim3(kThreads), 0,
                     static_cast<const float4*>(activations), kActivationFloats4, rounds, sink);
      });
    };
    const double us = (read_us(kRounds) - read_us(0)) / kRounds;
    std::printf(
        "broadcast read, %d load(s) in flight a thread: %d blocks each read the same 80 KB through L2: %.3f us, "
        "%.0f GB/s delivered\n",
        in_flight, sms, us, bytes / (us * 1e3));
  };
  broadcast(broadcast_read_kernel<1>, 1);
  broadcast(broadcast_read_kernel<4>, 4);
  NT_CUDA_CHECK(cudaFree(activations));

  // The gradient sum of 8 cluster copies of the mlp's weights.
  constexpr int kCopies = 8;
  constexpr int kWeightFloats4 = 303680 / 4;
  float4* partials = nullptr;
  float4* summed = nullptr;
  NT_CUDA_CHECK(cudaMalloc(&partials, sizeof(float4) * kWeightFloats4 * kCopies));
  NT_CUDA_CHECK(cudaMemset(partials, 0, sizeof(float4) * kWeightFloats4 * kCopies));
  NT_CUDA_CHECK(cudaMalloc(&summed, sizeof(float4) * kWeightFloats4));
  const auto sum_us = [&](int rounds) {
    return nt::bench::time_loop_us(stream, 3, 20, [&] {
      cuda::launch(exec, "gradient_sum", {}, gradient_sum_kernel, dim3(sms), dim3(kThreads), 0,
                   static_cast<const float4*>(partials), kCopies, kWeightFloats4, summed, rounds);
    });
  };
  const double sum = (sum_us(kRounds) - sum_us(0)) / kRounds;
  const double sum_bytes = double(kWeightFloats4) * sizeof(float4) * (kCopies + 1);
  std::printf("gradient sum: %d partials of 303,680 floats summed by %d blocks, each its slice: %.3f us, %.0f GB/s\n",
              kCopies, sms, sum, sum_bytes / (sum * 1e3));
  NT_CUDA_CHECK(cudaFree(partials));
  NT_CUDA_CHECK(cudaFree(summed));
  NT_CUDA_CHECK(cudaFree(words));
  NT_CUDA_CHECK(cudaFree(exchange));
  NT_CUDA_CHECK(cudaFree(sink));
  nt::kernels::destroy_stream(exec.stream);
  return 0;
}
