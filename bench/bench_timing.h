// GPU timing shared by the CUDA benchmarks: CUDA events around back-to-back calls after a warm-up,
// the median of many repetitions (docs/gemm-lab.md, "Measuring").
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <system_error>
#include <vector>

#include "core/cuda_check.h"
#include "kernels/exec.h"
#include "kernels/runtime.h"

namespace nt::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median µs per call over `reps` repetitions of `calls` back-to-back calls, each repetition bracketed by
// two events; a warm-up of at least 5 calls and a synchronize come first.
inline double time_loop_us(cudaStream_t stream, int calls, int reps, const std::function<void()>& call) {
  cudaEvent_t start, stop;
  NT_CUDA_CHECK(cudaEventCreate(&start));
  NT_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < std::max(5, calls); ++i) call();
  NT_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    NT_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < calls; ++i) call();
    NT_CUDA_CHECK(cudaEventRecord(stop, stream));
    NT_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    NT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(1e3 * double(ms) / calls);
  }
  NT_CUDA_CHECK(cudaEventDestroy(start));
  NT_CUDA_CHECK(cudaEventDestroy(stop));
  return median(us);
}

// Median µs per call from one CUDA graph holding `calls` calls: the host's launch cost drops out.
inline double time_graph_us(const kernels::Exec& exec, int calls, int reps, const std::function<void()>& call) {
  auto graph = kernels::Graph::capture(exec, [&] {
    for (int i = 0; i < calls; ++i) call();
  });
  return time_loop_us(static_cast<cudaStream_t>(exec.stream), 1, reps, [&] { graph.launch(exec); }) / calls;
}

// Writes `text` to DIR/NAME, creating DIR (and its parents) first; says which file failed and returns false.
inline bool write_result(const std::string& dir, const std::string& name, const std::string& text) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  std::ofstream f(dir + "/" + name);
  f << text;
  f.flush();
  if (error || !f) {
    std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name.c_str());
    return false;
  }
  std::printf("wrote %s/%s\n", dir.c_str(), name.c_str());
  return true;
}

}  // namespace nt::bench
