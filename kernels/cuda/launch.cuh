// The one launch path for every CUDA kernel of the engine.
//
//   launch(exec, "gemm_bias_relu", cost, kernel, grid, block, smem, args...);
//
// It opens an NVTX range named after the kernel, tells the profiler (when one observes), checks the
// launch error and names the kernel in the message, and with exec.debug_sync synchronizes and checks
// again so that an asynchronous fault is pinned to the kernel that caused it. Adding a kernel never
// means adding timing or checking code.
//
// Programmatic dependent launch (sm_90): every kernel is launched so that it may start while its
// predecessor on the stream is still running, and every kernel opens with begin_dependent_kernel(),
// which first waits until the predecessor has completed and its writes are visible, then lets the
// successor launch. No kernel touches global memory before that wait (one may first fill shared memory
// from its arguments: gather_batch's table), so the stream's order is kept exactly;
// what overlaps is only the next kernel's launch and block scheduling with this kernel's execution, the
// microseconds that dominate a step of many small kernels. The edges survive CUDA graph capture.
// The one exception, a kernel declared independent of its predecessor, is below (begin_overlapping_kernel).
// Consequence used there: when a kernel starts, every kernel before its predecessor has completed. The fused
// convolution stem's later passes use it too: they stage x and w, written by earlier kernels, before their
// wait (kernels/cuda/conv_batchnorm_pool.cu, enter_stem_block).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/cuda_check.h"
#include "kernels/cuda/global_timer.cuh"
#include "kernels/exec.h"
#include "profile/launch_stamps.h"
#include "profile/nvtx.h"

namespace nt::kernels::cuda {

[[noreturn]] void throw_launch_error(const char* kernel, cudaError_t err, dim3 grid, dim3 block, size_t smem,
                                     bool after_sync);

inline cudaStream_t stream_of(const Exec& exec) { return static_cast<cudaStream_t>(exec.stream); }

// Launch stamps (profile/launch_stamps.h), in a build configured with NT_LAUNCH_STAMPS: the ring this translation
// unit's kernels write to while the profiler times replayed graphs with them. Each unit has its own copy (no
// relocatable device code) and registers how to set it. A kernel reads it only when its launch says it stamps
// (launch_smem_bytes). Not in the default build: with profiling off it still cost every kernel 0.1 to 0.2 us on an
// H100, as did a module variable that no kernel read (docs/profiler.md, "Launch stamps").
#if NT_LAUNCH_STAMPS
namespace {
__device__ profile::LaunchStampRing launch_stamp_ring;
void install_launch_stamp_ring(const profile::LaunchStampRing& ring) {
  NT_CUDA_CHECK(cudaMemcpyToSymbol(launch_stamp_ring, &ring, sizeof ring));
}
[[maybe_unused]] const bool launch_stamp_ring_registered =
    profile::register_launch_stamp_installer(&install_launch_stamp_ring);
}  // namespace
#endif

// How a launch tells its kernel to stamp, without a load: its dynamic shared memory size is odd. Kernels ask for
// whole floats and ints, so no other launch has an odd size (and one that did would only read an empty ring);
// launch() adds the byte when the observer asks for stamps.
inline size_t launch_smem_bytes(size_t smem) { return smem | 1u; }

#if NT_LAUNCH_STAMPS && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define NT_STAMPS_IN_KERNELS 1
// Whether this thread stamps its launch: thread 0 of block 0 of a launch flagged by launch_smem_bytes. Registers only.
__device__ __forceinline__ bool stamps_launch() {
  unsigned int smem_bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem_bytes));
  return (smem_bytes & 1u) && (threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0;
}
// Writes a stamp into the next slot of `ring`, if one is installed (past capacity the slot is counted and lost). The
// slots' order does not matter (profile/launch_stamps.h sorts them by time), so this comes after the kernel has let
// its successor launch: neither the ring's load nor the atomic is on the stream's critical path.
__device__ __forceinline__ void write_launch_stamp(const profile::LaunchStampRing& ring, unsigned long long start_ns,
                                                   unsigned long long release_ns) {
  if (ring.slots == nullptr) return;
  const unsigned int slot = atomicAdd(ring.count, 1u);
  if (slot < ring.capacity) ring.slots[slot] = profile::LaunchStamp{start_ns, release_ns};
}
#else
#define NT_STAMPS_IN_KERNELS 0
#endif

// The first statement of every kernel of the engine (see above). A no-op before sm_90, and when the
// kernel was launched without the programmatic attribute. Stamping: the ring is read before the wait and looked at
// only after the kernel has let its successor launch, off the chain of waits.
__device__ __forceinline__ void begin_dependent_kernel() {
#if NT_STAMPS_IN_KERNELS
  const bool stamping = stamps_launch();
  profile::LaunchStampRing ring{};
  unsigned long long start_ns = 0, release_ns = 0;
  if (stamping) start_ns = global_timer_ns(), ring = launch_stamp_ring;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (stamping) release_ns = global_timer_ns();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (stamping) write_launch_stamp(ring, start_ns, release_ns);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A kernel that its caller declares independent of its predecessor (GemmArgs::overlaps_previous;
// GatherBatchArgs::overlaps_previous, a training step's gather beside the previous step's optimizer update; and
// conv2d_backward's backward_data beside backward_weight: it reads
// nothing the kernel launched just before it writes, and writes nothing that kernel reads or writes) runs
// beside that predecessor instead: it opens with begin_overlapping_kernel(), which lets its own successor
// launch at once, and ends with end_overlapping_kernel(), which waits until the predecessor has completed,
// so every later kernel, whose wait is on this one, still finds both done. Its inputs come from kernels
// before the predecessor: those had completed when the predecessor passed its own wait, which came before
// it let this kernel launch. So the predecessor must be an ordinary kernel (begin_dependent_kernel), never
// an overlapping one.
// Stamping, it writes its start when it starts and, in a second slot, when its closing wait returns: its
// predecessor's end.
__device__ __forceinline__ void begin_overlapping_kernel() {
#if NT_STAMPS_IN_KERNELS
  const bool stamping = stamps_launch();
  unsigned long long start_ns = 0;
  if (stamping) start_ns = global_timer_ns();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (stamping) write_launch_stamp(launch_stamp_ring, start_ns, 0);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void end_overlapping_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if NT_STAMPS_IN_KERNELS
  if (stamps_launch()) write_launch_stamp(launch_stamp_ring, 0, global_timer_ns());
#endif
}
// The first and last statements of a kernel that is either, as its launch says (overlaps_previous): every thread
// calls both.
__device__ __forceinline__ void begin_kernel(bool overlaps_previous) {
  if (overlaps_previous)
    begin_overlapping_kernel();
  else
    begin_dependent_kernel();
}
__device__ __forceinline__ void end_kernel(bool overlaps_previous) {
  if (overlaps_previous) end_overlapping_kernel();
}

bool programmatic_launch_supported();  // the current device is sm_90 or newer, and runs sm_90 code
// The shared memory size of a launch whose kernel stamps (launch_smem_bytes), with the kernel opted in to it where it
// passes the 48 KB default or the kernel's own opt-in. Left as it is where the device has no byte to spare: that
// launch then writes no stamps, and the profiler counts its batch untimed.
size_t stamped_smem_bytes(const void* kernel, size_t smem);
// The TF32 tensor-core kernels' guard: the current device runs sm_80 code or newer. Context refuses --tf32
// elsewhere (engine/context.cpp), so failing here is a caller's bug, or the kernel lab forcing a TF32 tile.
void require_tf32_code(const char* kernel);
size_t max_shared_bytes_per_block();  // the current device's limit for a kernel that opts in (dynamic smem)
int multiprocessor_count();           // the current device's SMs

// Thread-block clusters exist from sm_90 on. Device passes for older GPUs compile cluster kernels as stubs
// (NT_CLUSTERS is 0 there: guard their bodies with it) and launchers ask cluster_kernels_run first.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define NT_CLUSTERS 0
#define NT_CLUSTER_DIMS(x, y, z)
#else
#define NT_CLUSTERS 1
#define NT_CLUSTER_DIMS(x, y, z) __cluster_dims__(x, y, z)
#endif

// The last cluster barrier of a kernel: no block may exit, taking its shared memory with it, while another
// block of the cluster still reads that memory. Every thread calls it. Relaxed (no release fence): reads
// whose values a thread has consumed are complete, and nothing else needs ordering, so unlike
// cluster.sync() it does not wait until the block's global stores have reached L2 (Nsight Compute counted
// that wait, "membar", among the split-K GEMM's leading stalls).
__device__ __forceinline__ void cluster_exit_barrier() {
#if defined(__CUDA_ARCH__) && NT_CLUSTERS
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
#endif
}

// Whether `kernel`, a cluster kernel, runs on the current device: sm_90 or newer, and an image of the
// kernel compiled for it (not a stub).
bool cluster_kernels_run(const void* kernel);
template <class... Params>
bool cluster_kernels_run(void (*kernel)(Params...)) {
  return cluster_kernels_run(reinterpret_cast<const void*>(kernel));
}

template <class... KernelParams, class... Args>
void launch(const Exec& exec, const char* name, const profile::OpCost& cost, void (*kernel)(KernelParams...), dim3 grid,
            dim3 block, size_t smem, Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;  // empty problem: nothing to launch
  profile::NvtxRange range(name);
  cudaStream_t stream = stream_of(exec);
  if (exec.observer) exec.observer->begin(name, stream);
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  const bool stamping = exec.observer && exec.observer->stamps_launches();
  if (stamping) smem = stamped_smem_bytes(reinterpret_cast<const void*>(kernel), smem);
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = exec.programmatic_launch && programmatic_launch_supported() ? 1u : 0u;
  cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess) throw_launch_error(name, err, grid, block, smem, false);
  if (exec.observer) {
    profile::OpCost told = cost;
    told.overlaps_previous = cost.overlaps_previous && config.numAttrs > 0;
    exec.observer->end(name, stream, told);
  }
  if (exec.debug_sync) {
    err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) throw_launch_error(name, err, grid, block, smem, true);
  }
}

// Ceiling division for grid sizes.
template <class T>
constexpr T div_up(T a, T b) {
  return (a + b - 1) / b;
}

}  // namespace nt::kernels::cuda
