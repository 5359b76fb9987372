// A device-resident counter that a kernel reads and advances itself, once per launch.
//
// Why: a whole training epoch is captured as one CUDA graph and replayed, so a per-step value (Adam's
// step t, the draw number of a dropout mask) cannot be a kernel argument baked in by the host. It lives
// in device memory instead, and the kernel that consumes it also advances it.
//
// Layout: `counter` points at two zero-initialised uint64 words {value, done}:
//   value: the number of launches that consumed the counter so far (what this launch reads);
//   done:  how many blocks of the launch in flight have finished; 0 between launches.
// The CPU twin is plain: read value, use it, value += 1 (the done word stays 0).
//
// Use, in every block of the grid (no thread may return early, every thread must reach both calls):
//   begin_dependent_kernel();
//   const uint64_t value = grid_counter_begin(counter);   // the same value in every block
//   ... work that uses value ...
//   grid_counter_end(counter, value);                     // the last block to finish writes value + 1
//
// Memory-ordering argument (integer atomics only; no block ever waits for another, so blocks need not
// be co-resident and any grid size works):
//   1. In each block, thread 0 loads value before the block's first __syncthreads; the other threads
//      get it from shared memory. So every load of `value` in the grid is made by some block's thread 0,
//      before that thread's __threadfence() and its atomicAdd on `done` (program order, and the fence
//      orders the earlier load before the later atomic at device scope).
//   2. The atomicAdds on `done` are totally ordered; exactly one block sees gridDim - 1 (the last
//      one). At that point every other block's atomicAdd precedes it, and hence (1.) every block's load
//      of `value` precedes it too; the last block's own load precedes its atomicAdd in program order.
//      The last block fences again (acquire side) and only then stores value + 1 and done = 0: no block
//      of this launch can observe the new value, and no block is still to add to `done`, so the reset
//      cannot race with an increment.
//   3. Across launches: the next kernel on the stream (or graph) that reads the counter begins its
//      memory accesses only after this grid has completed and its writes are visible (stream order; with
//      programmatic dependent launch, griddepcontrol.wait in begin_dependent_kernel() waits for the
//      predecessor grid to complete and flush). It therefore reads value + 1 and done = 0.
// The advanced value does not depend on which block finished last, so the result is deterministic.
// One counter per consumer (Adam's step, each dropout layer's draws): two kernels may share a counter
// only when they run one after the other on the stream, never concurrently.
#pragma once

#include <cstdint>

namespace nt::kernels::cuda {

// Every thread of the block calls this right after begin_dependent_kernel(); returns the counter's value.
__device__ __forceinline__ uint64_t grid_counter_begin(const uint64_t* counter) {
  __shared__ uint64_t value;
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0)
    value = *static_cast<const volatile uint64_t*>(counter);  // volatile: a real load, never hoisted or cached
  __syncthreads();
  return value;
}

// Every thread of the block calls this after its work; `value` is what grid_counter_begin returned.
__device__ __forceinline__ void grid_counter_end(uint64_t* counter, uint64_t value) {
  __syncthreads();  // the whole block is past its work (and thread 0 past its load of value)
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    __threadfence();  // release: this block's load of value is ordered before its increment of done
    const unsigned long long blocks = static_cast<unsigned long long>(gridDim.x) * gridDim.y * gridDim.z;
    const unsigned long long finished = atomicAdd(reinterpret_cast<unsigned long long*>(counter + 1), 1ull);
    if (finished == blocks - 1) {  // the last block: every block has read value and counted itself
      __threadfence();             // acquire: the other blocks' increments (and so their loads) come first
      volatile uint64_t* words = counter;
      words[1] = 0;  // ready for the next launch
      words[0] = value + 1;
    }
  }
}

}  // namespace nt::kernels::cuda
