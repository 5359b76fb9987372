// The stamping twins of a profiling build (NT_LAUNCH_STAMPS; kernels/cuda/launch.cuh, StampRing).
//
// Such a build compiles every file of kernels/cuda twice: once as the default build does, into the engine, and once
// with the stamping code (NT_STAMPING_KERNELS) into a fatbin per file that the binary carries (CMakeLists.txt,
// nt_stamping_twins). The launch path runs a kernel's twin only for a launch the profiler times with launch stamps;
// the twin has the kernel's mangled name, its parameters and the ring as its last one. So with profiling off, and
// for every launch the profiler does not stamp, a profiling build runs exactly the default build's kernels.
#pragma once

#include <cstddef>

namespace nt::kernels::cuda {

// Loads the twins' images (once per process) and resolves every twin by name. Called before a capture that may
// stamp (Graph::capture), so that no library is loaded inside a stream capture. Throws nt::Error when an image does
// not load.
void load_stamping_twins();

// The twin of `kernel` (a kernel of the engine, as its host stub), ready to launch with `smem` bytes of dynamic
// shared memory: a cudaKernel_t, passed where the runtime takes a kernel. Loads the twins first if needed. Throws
// nt::InternalError, naming the kernel, when it has no twin (a kernel compiled outside kernels/cuda).
const void* stamping_twin(const void* kernel, size_t smem);

// The twins' images: one fatbin per source file that defines kernels, which the build generates and embeds
// (CMakeLists.txt, nt_stamping_twins: the engine's kernels/cuda, and the test kernels) and registers at static
// initialization, before any load.
struct StampingImage {
  const unsigned char* begin;
  const unsigned char* end;
  const char* file;  // the source file, for messages
};
bool register_stamping_images(const StampingImage* images, size_t count);  // returns true

}  // namespace nt::kernels::cuda
