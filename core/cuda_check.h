// CUDA runtime error checks. Include only from code compiled when NT_WITH_CUDA is set.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

#include "core/error.h"

namespace nt {
[[noreturn]] void throw_cuda(cudaError_t err, const char* what, const char* file, int line);
}

// Throwing check for any cudaError_t-returning call; names the statement, file:line and device.
#define NT_CUDA_CHECK(call)                                                           \
  do {                                                                                \
    cudaError_t nt_err_ = (call);                                                     \
    if (nt_err_ != cudaSuccess) ::nt::throw_cuda(nt_err_, #call, __FILE__, __LINE__); \
  } while (0)

// Non-throwing variant for destructors: report and carry on.
#define NT_CUDA_CHECK_NOTHROW(call)                                                          \
  do {                                                                                       \
    cudaError_t nt_err_ = (call);                                                            \
    if (nt_err_ != cudaSuccess)                                                              \
      std::fprintf(stderr, "nanotrain: %s failed at %s:%d: %s\n", #call, __FILE__, __LINE__, \
                   cudaGetErrorString(nt_err_));                                             \
  } while (0)
