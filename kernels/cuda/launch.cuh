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

#include <tuple>
#include <type_traits>
#include <utility>

#include "core/cuda_check.h"
#include "kernels/cuda/global_timer.cuh"
#include "kernels/cuda/stamping_twins.h"
#include "kernels/exec.h"
#include "profile/launch_stamps.h"
#include "profile/nvtx.h"

namespace nt::kernels::cuda {

[[noreturn]] void throw_launch_error(const char* kernel, cudaError_t err, dim3 grid, dim3 block, size_t smem,
                                     bool after_sync);

inline cudaStream_t stream_of(const Exec& exec) { return static_cast<cudaStream_t>(exec.stream); }

// Launch stamps (profile/launch_stamps.h): every kernel's last parameter is a StampRing, which launch() appends. The
// engine's kernels are compiled without stamping code, their StampRing an empty struct: with profiling off, any
// stamping code cost the mlp's graph epoch about 0.2 us per kernel on an H100 even when it wrote nothing, and a
// parameter of 8 bytes or more about 0.1 us on an H200 (docs/profiler.md, "Launch stamps"). A profiling build
// (NT_LAUNCH_STAMPS) also compiles every kernel a second time with the stamping code (NT_STAMPING_KERNELS, the
// stamping twins: kernels/cuda/stamping_twins.h), and the launch path runs a launch's twin, with the profiler's
// ring, only when the profiler asks to time that launch (LaunchObserver::launch_stamp_ring); every other launch runs
// the same kernel as the default build. The struct has one name in both compilations, so a twin has its kernel's
// mangled name.
#if NT_STAMPING_KERNELS
struct StampRing : profile::LaunchStampRing {};
#else
struct StampRing {};
#endif

#if NT_STAMPING_KERNELS && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define NT_STAMPS_IN_KERNELS 1
// Where a kernel that runs beside its predecessor writes its closing stamp: the release field of the slot its opening
// stamp reserved, or nullptr (not stamping, or past capacity). Set by thread 0 of block 0 only, which alone reads it.
// Why in shared memory, and why the overlapping pair is written in PTX: a closing stamp that reads the ring's fields
// after the kernel's main loop makes the compiler hold them through it, which changed the register allocation of 31
// of the 100 GEMM kernels (one spilled); stores the compiler can see in C++ made the gather kernels copy their
// by-value arrays to local memory. In this form ptxas allocates as in the default build but for 1 GEMM kernel and 2
// convolution kernels (docs/profiler.md, "Launch stamps").
static __shared__ unsigned long long* launch_stamp_closing_release;
// PTX that sets the predicate `first` in thread 0 of block 0 (the stamping thread's test, inside an asm block).
#define NT_PTX_FIRST_THREAD_OF_LAUNCH                          \
  ".reg .pred first;\n\t.reg .u32 index, part;\n\t"            \
  "mov.u32 index, %%tid.x;\n\t"                                \
  "mov.u32 part, %%tid.y;\n\tor.b32 index, index, part;\n\t"   \
  "mov.u32 part, %%tid.z;\n\tor.b32 index, index, part;\n\t"   \
  "mov.u32 part, %%ctaid.x;\n\tor.b32 index, index, part;\n\t" \
  "mov.u32 part, %%ctaid.y;\n\tor.b32 index, index, part;\n\t" \
  "mov.u32 part, %%ctaid.z;\n\tor.b32 index, index, part;\n\t" \
  "setp.eq.u32 first, index, 0;\n\t"
// The dependent stamp, out of line: a stamping twin must run as its plain kernel does, and the stamping code inlined
// changed ptxas's register allocation of some kernels (nchw_pool_backward 39 -> 42 registers, one block fewer per SM:
// 1.3 us slower). Called first, with nothing live, it leaves the kernel's own code as it is. Thread 0 of block 0,
// given a ring, takes its slot and writes its start before the wait, while the predecessor still runs, and after the
// wait its release. Static: nvcc names a file's anonymous namespace after its first definition with external
// linkage, and the twin's kernels must keep their plain kernels' names (stamping_twins.h).
static __device__ __noinline__ void stamped_dependent_wait(profile::LaunchStamp* slots, unsigned int* count,
                                                           unsigned int capacity) {
  profile::LaunchStamp* stamp = nullptr;
  if (slots != nullptr && (threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0) {
    const unsigned long long start_ns = global_timer_ns();
    const unsigned int slot = atomicAdd(count, 1u);
    if (slot < capacity) {
      stamp = slots + slot;
      stamp->start_ns = start_ns;
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (stamp != nullptr) stamp->release_ns = global_timer_ns();
}
#else
#define NT_STAMPS_IN_KERNELS 0
#endif

// The first statement of every kernel of the engine (see above). A no-op before sm_90, and when the
// kernel was launched without the programmatic attribute.
__device__ __forceinline__ void begin_dependent_kernel([[maybe_unused]] const StampRing& stamps) {
#if NT_STAMPS_IN_KERNELS
  stamped_dependent_wait(stamps.slots, stamps.count, stamps.capacity);
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
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
__device__ __forceinline__ void begin_overlapping_kernel([[maybe_unused]] const StampRing& stamps) {
#if NT_STAMPS_IN_KERNELS
  // Thread 0 of block 0, given a ring: reads the timer, lets the successor launch, takes two slots with one atomic,
  // writes {start, 0} into the first and zeroes the second's start (the host reads it as {0, release}), and leaves
  // the second's release field for end_overlapping_kernel. Every other thread only lets the successor launch.
  const auto closing = static_cast<unsigned int>(__cvta_generic_to_shared(&launch_stamp_closing_release));
  asm volatile(
      "{\n\t"
      ".reg .pred stamping, open_fits, close_fits;\n\t"
      ".reg .u32 slot, next_slot;\n\t"
      ".reg .u64 start, zero, offset, open_slot, close_release;\n\t" NT_PTX_FIRST_THREAD_OF_LAUNCH
      "setp.ne.and.u64 stamping, %0, 0, first;\n\t"
      "@stamping mov.u64 start, %%globaltimer;\n\t"
      "griddepcontrol.launch_dependents;\n\t"
      "mov.u64 zero, 0;\n\t"
      "mov.u64 close_release, 0;\n\t"
      "@stamping atom.global.add.u32 slot, [%1], 2;\n\t"
      "setp.lt.and.u32 open_fits, slot, %2, stamping;\n\t"
      "add.u32 next_slot, slot, 1;\n\t"
      "setp.lt.and.u32 close_fits, next_slot, %2, stamping;\n\t"
      "mul.wide.u32 offset, slot, 16;\n\t"
      "add.u64 open_slot, %0, offset;\n\t"
      "@open_fits st.global.u64 [open_slot], start;\n\t"
      "@open_fits st.global.u64 [open_slot+8], zero;\n\t"
      "@close_fits st.global.u64 [open_slot+16], zero;\n\t"
      "@close_fits add.u64 close_release, open_slot, 24;\n\t"
      "@first st.shared.u64 [%3], close_release;\n\t"
      "}" ::"l"(stamps.slots),
      "l"(stamps.count), "r"(stamps.capacity), "r"(closing)
      : "memory");
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void end_overlapping_kernel([[maybe_unused]] const StampRing& stamps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if NT_STAMPS_IN_KERNELS
  // Thread 0 of block 0 writes the time its wait returned (the predecessor's end) where its opening stamp said. The
  // shared pointer's address is the only operand: nothing of the ring is held through the kernel.
  const auto closing = static_cast<unsigned int>(__cvta_generic_to_shared(&launch_stamp_closing_release));
  asm volatile(
      "{\n\t"
      ".reg .pred stamping;\n\t"
      ".reg .u64 release, close_release;\n\t" NT_PTX_FIRST_THREAD_OF_LAUNCH
      "@first ld.shared.u64 close_release, [%0];\n\t"
      "setp.ne.and.u64 stamping, close_release, 0, first;\n\t"
      "@stamping mov.u64 release, %%globaltimer;\n\t"
      "@stamping st.global.u64 [close_release], release;\n\t"
      "}" ::"r"(closing)
      : "memory");
#endif
}
// The first and last statements of a kernel that is either, as its launch says (overlaps_previous): every thread
// calls both.
__device__ __forceinline__ void begin_kernel(bool overlaps_previous, const StampRing& stamps) {
  if (overlaps_previous)
    begin_overlapping_kernel(stamps);
  else
    begin_dependent_kernel(stamps);
}
__device__ __forceinline__ void end_kernel(bool overlaps_previous, const StampRing& stamps) {
  if (overlaps_previous) end_overlapping_kernel(stamps);
}

bool programmatic_launch_supported();  // the current device is sm_90 or newer, and runs sm_90 code
// The TF32 tensor-core kernels' guard: the current device runs sm_80 code or newer. Context refuses --tf32
// elsewhere (engine/context.cpp), so failing here is a caller's bug, or the kernel lab forcing a TF32 tile.
void require_tf32_code(const char* kernel);
bool runs_tensor_core_code();         // the current device runs sm_80 code or newer: mma.sync on TF32 and BF16 operands
bool runs_warpgroup_mma();            // the current device runs sm_90a code: wgmma (kernels/cuda/wgmma.cuh)
size_t max_shared_bytes_per_block();  // the current device's limit for a kernel that opts in (dynamic smem)
int multiprocessor_count();           // the current device's SMs
// Blocks of `kernel` (`threads` each, `smem` bytes of dynamic shared memory) that the current device holds at once:
// one wave. Asked once per thread, device and kernel.
int resident_blocks(const void* kernel, int threads, size_t smem = 0);

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

#if NT_LAUNCH_STAMPS
// Launches the stamping twin of `kernel` (kernels/cuda/stamping_twins.h) with its arguments and the profiler's ring as
// the last one, which has the layout of the twin's StampRing.
template <class... KernelParams, size_t... I, class... Args>
cudaError_t launch_stamping_twin(const cudaLaunchConfig_t& config, void (*kernel)(KernelParams...),
                                 const profile::LaunchStampRing& ring, std::index_sequence<I...>, Args&&... args) {
  using Params = std::tuple<KernelParams...>;
  [[maybe_unused]] std::tuple<std::tuple_element_t<I, Params>...> values(std::forward<Args>(args)...);
  void* pointers[] = {const_cast<void*>(static_cast<const void*>(&std::get<I>(values)))...,
                      const_cast<profile::LaunchStampRing*>(&ring)};
  return cudaLaunchKernelExC(&config, stamping_twin(reinterpret_cast<const void*>(kernel), config.dynamicSmemBytes),
                             pointers);
}
#endif

// Every kernel's last parameter is its StampRing, which this supplies: args are the ones before it. cooperative: the
// blocks must all be resident at once (a persistent kernel's grid barriers, kernels/cuda/grid_barrier.cuh); the launch
// fails, and says so, where they cannot be. A cooperative launch is not programmatic: it starts when its predecessor
// has completed.
template <class... KernelParams, class... Args>
void launch_with(const Exec& exec, const char* name, const profile::OpCost& cost, void (*kernel)(KernelParams...),
                 dim3 grid, dim3 block, size_t smem, bool cooperative, Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;  // empty problem: nothing to launch
  profile::NvtxRange range(name);
  cudaStream_t stream = stream_of(exec);
  if (exec.observer) exec.observer->begin(name, stream);
  cudaLaunchAttribute attributes[2] = {};
  unsigned int count = 0;
  if (exec.programmatic_launch && !cooperative && programmatic_launch_supported()) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  const bool programmatic = count > 0;
  if (cooperative) {
    attributes[count].id = cudaLaunchAttributeCooperative;
    attributes[count++].val.cooperative = 1;
  }
#if NT_LAUNCH_STAMPS
  const profile::LaunchStampRing ring = exec.observer ? exec.observer->launch_stamp_ring() : profile::LaunchStampRing{};
#endif
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  static_assert(
      std::is_same_v<std::tuple_element_t<sizeof...(KernelParams) - 1, std::tuple<KernelParams...>>, StampRing>,
      "a kernel's last parameter is its StampRing (see above)");
  cudaError_t err;
#if NT_LAUNCH_STAMPS
  if (ring.slots != nullptr)
    err = launch_stamping_twin(config, kernel, ring, std::make_index_sequence<sizeof...(KernelParams) - 1>{},
                               std::forward<Args>(args)...);
  else
#endif
    err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)..., StampRing{});
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess) throw_launch_error(name, err, grid, block, smem, false);
  if (exec.observer) {
    profile::OpCost told = cost;
    told.overlaps_previous = cost.overlaps_previous && programmatic;
    exec.observer->end(name, stream, told);
  }
  if (exec.debug_sync) {
    err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) throw_launch_error(name, err, grid, block, smem, true);
  }
}

template <class... KernelParams, class... Args>
void launch(const Exec& exec, const char* name, const profile::OpCost& cost, void (*kernel)(KernelParams...), dim3 grid,
            dim3 block, size_t smem, Args&&... args) {
  launch_with(exec, name, cost, kernel, grid, block, smem, /*cooperative=*/false, std::forward<Args>(args)...);
}

// Ceiling division for grid sizes.
template <class T>
constexpr T div_up(T a, T b) {
  return (a + b - 1) / b;
}

}  // namespace nt::kernels::cuda
