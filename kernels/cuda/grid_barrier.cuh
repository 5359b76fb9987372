// A barrier across every block of a grid whose blocks are all resident (a cooperative launch), for persistent kernels
// whose phases depend on each other's results (kernels/cuda/persistent_mlp.cu; measured in bench/bench_grid_barrier.cu:
// about 2 us on an H100, nearly independent of the number of blocks).
//
// Sense by generation: thread 0 of each block reads the generation, makes its block's writes visible (release fence)
// and adds itself to the count; the last to arrive resets the count and publishes generation + 1, on which the others
// spin with acquire loads. Both words start at zero (device memory zeroed once); every completed barrier leaves the
// count at zero again, so the next launch needs no reset. Readers of data written by other blocks before a barrier
// load it from L2 (ld.global.cg, __ldcg): the L1 of their SM may hold an older line.
#pragma once

namespace nt::kernels::cuda {

struct GridBarrier {
  unsigned int* count;       // blocks arrived at the current barrier
  unsigned int* generation;  // barriers completed
};

__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release(unsigned int* p, unsigned int v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Every thread of every block calls it; returns when all blocks have arrived, with their writes visible.
__device__ __forceinline__ void grid_barrier(const GridBarrier& b) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int generation = load_acquire(b.generation);
    __threadfence();  // the block's writes before its arrival
    if (atomicAdd(b.count, 1u) == gridDim.x - 1) {
      *b.count = 0;  // nobody arrives at the next barrier before the release below
      __threadfence();
      store_release(b.generation, generation + 1);
    } else {
      while (load_acquire(b.generation) == generation) {
      }
    }
  }
  __syncthreads();
}

}  // namespace nt::kernels::cuda
