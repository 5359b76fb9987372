// How an op reaches a backend: one typed dispatcher for every op, and one for their size queries.
//
// An op family's header (kernels/<family>.h) declares its implementations over the family's args struct,
//   namespace cpu  { template <class T> void softmax_xent(const Exec&, const SoftmaxXentArgs<T>&); }  // f32, f64
//   namespace cuda { void softmax_xent(const Exec&, const SoftmaxXentArgs<float>&); }
// and its entry point names both:
//   template <class T>
//   void softmax_xent(const Exec& exec, const SoftmaxXentArgs<T>& a) {
//     dispatch<cpu::softmax_xent<T>, cuda::softmax_xent>(exec, a);
//   }
// A reader, or a tool, follows the call into either implementation. Without a CUDA implementation for the
// arguments' element type (f64: gradient checks run on the CPU), the GPU gets a clear error. In a build without
// the CUDA backend the CUDA function is never referenced (a discarded `if constexpr` branch), so it need not exist.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kernels/exec.h"

namespace nt::kernels {

#if NT_WITH_CUDA
inline constexpr bool kCudaBuilt = true;
#else
inline constexpr bool kCudaBuilt = false;
#endif

[[noreturn]] void throw_no_cuda_backend();           // "this build of nanotrain has no CUDA backend"
[[noreturn]] void throw_cpu_only(const char* what);  // "<what> runs on the CPU backend only"

// Returns what the op returns (the same type on both backends).
template <auto CpuOp, auto CudaOp, class Args>
auto dispatch(const Exec& exec, const Args& args) -> decltype(CpuOp(exec, args)) {
  if (!exec.on_cuda()) return CpuOp(exec, args);
  if constexpr (!std::is_invocable_v<decltype(CudaOp), const Exec&, const Args&>)
    throw_cpu_only("an op on f64 tensors (a gradient check's)");
  else if constexpr (!kCudaBuilt)
    throw_no_cuda_backend();
  else
    return CudaOp(exec, args);
}

// A size the op needs on `backend` (workspace elements, say): CpuQuery(shape...) or CudaQuery(shape...). nullptr
// for a backend that needs none gives 0.
template <auto CpuQuery, auto CudaQuery, class... Shape>
size_t by_backend(Backend backend, const Shape&... shape) {
  if (backend == Backend::cpu) {
    if constexpr (std::is_null_pointer_v<decltype(CpuQuery)>)
      return 0;
    else
      return CpuQuery(shape...);
  }
  if constexpr (!kCudaBuilt)
    throw_no_cuda_backend();
  else if constexpr (std::is_null_pointer_v<decltype(CudaQuery)>)
    return 0;
  else
    return CudaQuery(shape...);
}

}  // namespace nt::kernels
