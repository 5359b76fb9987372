// Asynchronous copies from global to shared memory (cp.async, sm_80+): the bytes land in shared memory without a
// register round trip, so a thread can have many in flight while it computes. Copies are grouped: commit() closes
// the group of the copies issued since the last one, wait_pending<N>() returns once at most N groups are still in
// flight, wait_all() once none is. Each waits for the calling thread's copies only: a __syncthreads() after it
// makes the block's copies visible to the whole block.
//
// Before sm_80 (the kernels that use these refuse to run there, or guard their callers) the copies are plain
// loads and stores and the waits do nothing, so the files still compile for every architecture of the build.
#pragma once

#include <cuda_runtime.h>

namespace nt::kernels::cuda::cp_async {

// 16 bytes (dst and src 16-byte aligned), or 16 zero bytes where !valid: src-size 0 reads nothing, so src need only
// be a valid address, not a valid element.
__device__ __forceinline__ void copy16_or_zero(void* dst, const void* src, bool valid = true) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(to), "l"(src), "r"(valid ? 16 : 0) : "memory");
#else
  *static_cast<int4*>(dst) = valid ? *static_cast<const int4*>(src) : make_int4(0, 0, 0, 0);
#endif
}

// 4 bytes (dst and src 4-byte aligned), or 4 zero bytes where !valid (as above).
__device__ __forceinline__ void copy4_or_zero(void* dst, const void* src, bool valid = true) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(to), "l"(src), "r"(valid ? 4 : 0) : "memory");
#else
  *static_cast<int*>(dst) = valid ? *static_cast<const int*>(src) : 0;
#endif
}

__device__ __forceinline__ void commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void wait_pending() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

__device__ __forceinline__ void wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// The copy pipeline of a loop over `slabs` slabs in kStages shared-memory stages: slab t + L is copied while slab t is
// consumed, L = kStages − 1 − kReadsInFlight. copy(t, stage) issues this thread's copies of slab t into `stage`;
// consume(stage) reads slab t from its stage, and may leave up to kReadsInFlight slabs' reads still running when it
// returns (asynchronous MMAs: wgmma.cuh), which is why the copies look ahead one slab less for each. Each iteration
// waits for slab t's copies, calls publish (every thread, once its copies of slab t have landed: a consumer that reads
// shared memory through another proxy, as wgmma does, needs a fence there), passes one barrier (everyone's copies have
// landed, and everyone is done with the stage the next copy overwrites), issues the next copy, then consumes; empty
// groups keep the count. Every copy has landed when it returns.
struct NothingToPublish {
  __device__ void operator()() const {}
};
template <int kStages, int kReadsInFlight = 0, class Copy, class Consume, class Publish = NothingToPublish>
__device__ __forceinline__ void pipeline(int slabs, Copy&& copy, Consume&& consume, Publish&& publish = Publish{}) {
  constexpr int kAhead = kStages - 1 - kReadsInFlight;
  static_assert(kAhead >= 1, "a stage for the slab consumed, one for each read in flight, and one being copied");
  for (int t = 0; t < kAhead; ++t) {
    if (t < slabs) copy(t, t);
    commit();
  }
  for (int t = 0; t < slabs; ++t) {
    wait_pending<kAhead - 1>();
    publish();
    __syncthreads();
    if (t + kAhead < slabs) copy(t + kAhead, (t + kAhead) % kStages);
    commit();
    consume(t % kStages);
  }
  wait_all();
}

}  // namespace nt::kernels::cuda::cp_async
