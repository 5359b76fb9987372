// Phase stamps: a long or persistent kernel tells the profiler where its phases begin, from the device.
//
//   // host, in the op's launcher: the names, in the order the kernel numbers them
//   static constexpr const char* kPhases[] = {"forward", "backward", "update"};
//   const profile::PhaseStamps stamps = profile::phase_stamps_for(exec.observer, kPhases, 3);
//   launch(exec, "persistent_step", cost, kernel, grid, block, smem, ..., stamps);
//
//   // device: one thread of one block marks each boundary (after the barrier that ends the previous phase)
//   if (blockIdx.x == 0 && threadIdx.x == 0) stamps.mark(0);   // "forward" begins
//   ...grid barrier...
//   if (blockIdx.x == 0 && threadIdx.x == 0) stamps.mark(1);   // "backward" begins
//   ...
//   if (blockIdx.x == 0 && threadIdx.x == 0) stamps.end();     // the last phase ends: every launch must end()
//
// A mark is one %globaltimer read and one 16-byte store into a buffer the profiler owns (slot from an atomic
// counter): about as cheap as a store, and nothing when no profiler asks (slots == nullptr: one branch). The profiler
// reads the buffer once per flush, splits each launch's marks into slices (mark k to the next mark is phase k; a
// phase may come back, as the steps of a persistent kernel do), and reports each phase as a child row of its
// kernel's row and as slices inside the kernel's slice in the trace. Durations are differences of %globaltimer
// readings, exact to its resolution (1 us on some GPUs' default update rate, 32 ns or better on Hopper under a
// profiler); a slice's place in the trace is its offset from the launch's first mark, counted from the start of the
// launch's exclusive time (docs/profiler.md, "Phase stamps").
//
// A launch replayed from a CUDA graph keeps the tag it had when captured; its replays are told apart by their
// end() marks, in time order.
#pragma once

#include <cstdint>
#include <vector>

namespace nt::profile {

struct PhaseStamp {
  unsigned long long time_ns = 0;  // %globaltimer
  uint32_t launch = 0;             // the tag of the launch that wrote it (PhaseStamps::launch)
  uint32_t phase = 0;              // the phase that begins; kPhaseEnd ends the launch's last phase
};
inline constexpr uint32_t kPhaseEnd = 0xffffffffu;

// A kernel argument: where to write, and the launch's tag. Empty (slots == nullptr) when no profiler keeps stamps.
struct PhaseStamps {
  PhaseStamp* slots = nullptr;
  unsigned int* count = nullptr;  // slots taken so far; past capacity a mark is counted and lost
  uint32_t capacity = 0;
  uint32_t launch = 0;

#ifdef __CUDACC__
  __device__ __forceinline__ void mark(uint32_t phase) const {
    if (!slots) return;
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    const unsigned int slot = atomicAdd(count, 1u);
    if (slot < capacity) slots[slot] = PhaseStamp{now, launch, phase};
  }
  __device__ __forceinline__ void end() const { mark(kPhaseEnd); }
#endif
};

// ---- reading them back (host; pure, so the CPU tests drive it) ----------------------------------------

struct StampedSlice {
  uint32_t launch = 0;      // tag
  uint32_t occurrence = 0;  // which run of the tag, in time order (a graph replayed twice: 0 and 1)
  uint32_t phase = 0;       // index into the launch's names
  uint64_t offset_ns = 0;   // from the run's first mark
  uint64_t dur_ns = 0;
};

struct StampedRuns {
  std::vector<StampedSlice> slices;  // by tag, then occurrence, then time
  int64_t unended = 0;               // marks after a tag's last end(): a launch that did not end() (or was cut off)
};

// Splits the stamps (in any order) into slices per launch tag: sorted by time, each tag's marks run from one end()
// to the next; a phase lasts from its mark to the next mark of the same run.
StampedRuns split_stamps(const std::vector<PhaseStamp>& stamps);

}  // namespace nt::profile
