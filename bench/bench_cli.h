// The command line and the device of the small CUDA benchmarks that take one count (bench_grid_barrier,
// bench_kernel_params, bench_persistent_mlp): `--NAME N` within a range, anything else a usage error (exit 2), and
// no CUDA device an error of its own (exit 1).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "kernels/exec.h"
#include "kernels/runtime.h"

namespace nt::bench {

// argv holds at most `--flag N` with lo <= N <= hi (else *value keeps its default). Returns the exit code on an
// error, after saying why; nullopt when the arguments are good.
inline std::optional<int> parse_count(int argc, char** argv, const char* bench, const char* flag, int lo, int hi,
                                      int* value) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], flag) && i + 1 < argc) {
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < lo || v > hi) {
        std::fprintf(stderr, "%s: expected %d..%d, got %s\n", flag, lo, hi, argv[i]);
        return 2;
      }
      *value = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "usage: %s [%s N]\n", bench, flag);
      return 2;
    }
  }
  return std::nullopt;
}

// Device 0 on a stream of its own, or nullopt after saying there is no CUDA device.
inline std::optional<kernels::Exec> cuda_bench_exec(const char* bench) {
  if (kernels::cuda_device_count() == 0) {
    std::fprintf(stderr, "%s: no CUDA device\n", bench);
    return std::nullopt;
  }
  kernels::Exec exec;
  exec.backend = kernels::Backend::cuda;
  exec.stream = kernels::create_stream();
  return exec;
}

}  // namespace nt::bench
