#include "kernels/cuda/stamping_twins.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"

#if NT_LAUNCH_STAMPS
// The engine's set, generated beside nt_kernels (CMakeLists.txt): naming it links it from the library.
extern "C" const bool nt_stamping_images_engine;
#endif

namespace nt::kernels::cuda {

namespace {

struct Twin {
  cudaKernel_t kernel = nullptr;
  size_t smem_allowed = 48 * 1024;  // dynamic shared memory a launch may take without opting in
};

struct ImageSet {
  const StampingImage* images;
  size_t count;
};
// Filled at static initialization (register_stamping_images), read after it.
std::vector<ImageSet>& registered_images() {
  static std::vector<ImageSet> sets;
  return sets;
}

struct Twins {
  std::mutex mutex;
  bool loaded = false;
  std::unordered_map<std::string, Twin> by_name;
  std::unordered_map<const void*, Twin*> by_kernel;  // the engine's kernels, as their host stubs
};

Twins& twins() {
  static Twins t;
  return t;
}

void load_locked([[maybe_unused]] Twins& t) {
  if (t.loaded) return;
#if NT_LAUNCH_STAMPS
  if (!nt_stamping_images_engine) throw InternalError("profiler: the engine's stamping twins were not registered");
#endif
  for (const ImageSet& set : registered_images())
    for (size_t i = 0; i < set.count; ++i) {
      const StampingImage& image = set.images[i];
      cudaLibrary_t library = nullptr;
      const cudaError_t err = cudaLibraryLoadData(&library, image.begin, nullptr, nullptr, 0, nullptr, nullptr, 0);
      if (err != cudaSuccess) {
        cudaGetLastError();
        throw Error(cat("profiler: the stamping kernels of ", image.file, " do not load on this device: ",
                        cudaGetErrorString(err), " (they are built for sm_90 and newer)"));
      }
      unsigned int count = 0;
      NT_CUDA_CHECK(cudaLibraryGetKernelCount(&count, library));
      std::vector<cudaKernel_t> kernels(count);
      NT_CUDA_CHECK(cudaLibraryEnumerateKernels(kernels.data(), count, library));
      for (cudaKernel_t k : kernels) {
        const char* name = nullptr;
        NT_CUDA_CHECK(cudaFuncGetName(&name, reinterpret_cast<const void*>(k)));
        t.by_name[name].kernel = k;
      }
    }
  t.loaded = true;  // the libraries stay loaded until the process ends, as the engine's own modules do
}

}  // namespace

bool register_stamping_images(const StampingImage* images, size_t count) {
  registered_images().push_back({images, count});
  return true;
}

void load_stamping_twins() {
  Twins& t = twins();
  std::lock_guard lock(t.mutex);
  load_locked(t);
}

const void* stamping_twin(const void* kernel, size_t smem) {
  Twins& t = twins();
  std::lock_guard lock(t.mutex);
  auto found = t.by_kernel.find(kernel);
  if (found == t.by_kernel.end()) {
    load_locked(t);
    const char* name = nullptr;
    NT_CUDA_CHECK(cudaFuncGetName(&name, kernel));
    auto twin = t.by_name.find(name);
    if (twin == t.by_name.end())
      throw InternalError(cat("profiler: kernel ", name, " has no stamping twin (only kernels/cuda has them)"));
    found = t.by_kernel.emplace(kernel, &twin->second).first;
  }
  Twin& twin = *found->second;
  if (smem > twin.smem_allowed) {  // as the kernel's launcher opted the kernel in
    NT_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(twin.kernel),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    twin.smem_allowed = smem;
  }
  return reinterpret_cast<const void*>(twin.kernel);
}

}  // namespace nt::kernels::cuda
