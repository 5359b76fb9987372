// What a timer reads for kernels of known length: the calibration behind the profiler's fidelity check
// (docs/profiler.md, "Fidelity"; scripts/profile-check runs it).
//
//   bench_launch [--ncu] [--launches N] [--out FILE.csv]
//
// Each kernel is one block of 32 threads whose thread 0 spins on %globaltimer (ns) for a fixed time: 0 (an
// empty kernel), 2, 5, 10 and 20 us. So each has a true length, and the difference between what a timer
// reads and that length is the timer's own cost per kernel. Launched through the engine's launch path,
// without programmatic dependent launch (each kernel starts after its predecessor ended, as under ncu).
//
// Default: N launches of each kernel under the KernelProfiler with CUPTI's records (the `cupti` column),
// then the same under the CUDA events timer with its hold (`events`), then captured as one CUDA graph with
// programmatic dependent launch and replayed under the launch-stamps timer (`stamps`: the way that timer sees
// kernels, each released by its predecessor's end; 0 where the build's kernels do not stamp (NT_LAUNCH_STAMPS) or
// the code path has no programmatic launch), then back
// to back between two events (`loop`: the stream's cost per kernel, launch processing included). --ncu: the N launches
// of each kernel between cudaProfilerStart/Stop and nothing else, for `ncu --profile-from-start off` to read
// gpu__time_duration (ncu holds CUPTI, so no profiler runs then). --out writes the default table as CSV
// (kernel,true_us,cupti_us,events_us,stamps_us,loop_us) for bench/compare_ncu.py --calibration.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_timing.h"
#include "bench/launch/spin_kernels.h"
#include "core/cuda_check.h"
#include "kernels/exec.h"
#include "kernels/profile_delay.h"
#include "kernels/runtime.h"
#include "profile/kernel_profiler.h"
#include "profile/launch_stamps.h"

namespace {

using nt::bench::kSpinCount;
using nt::bench::kSpins;
using nt::bench::launch_spin;
using nt::kernels::Exec;

// Average us per launch of each spin kernel under a KernelProfiler with this timing (launches back to back).
std::vector<double> profiled_us(Exec exec, nt::profile::Timing timing, int launches) {
  nt::profile::ProfilerOptions o;
  o.timing = timing;
  o.cupti_fallback = false;
  o.device = "cuda";
  o.hold = nt::kernels::profile_hold_fn(exec);
  nt::profile::KernelProfiler profiler(std::move(o));
  exec.observer = &profiler;
  profiler.start();
  for (int k = 0; k < kSpinCount; ++k) {
    nt::profile::StepScope step(kSpins[k].name);  // the events timer holds the stream within a step
    for (int i = 0; i < launches; ++i) launch_spin(exec, k);
  }
  profiler.stop();
  std::vector<double> us;
  for (const auto& s : kSpins) {
    double avg = 0;
    for (const auto& r : profiler.data().rows())
      if (r.kernel == s.name) avg = r.avg_us();
    us.push_back(avg);
  }
  return us;
}

// Average us per launch of each spin kernel under the launch-stamps timer: the launches captured as one graph with
// programmatic dependent launch, replayed once. Zeros where kernels cannot stamp (no sm_90 code).
std::vector<double> stamped_us(Exec exec, int launches) {
  std::vector<double> us(kSpinCount, 0.0);
  if (!nt::profile::launch_stamps_available() || !nt::kernels::cuda_device_info(0).has_programmatic_launch()) return us;
  exec.programmatic_launch = true;
  nt::profile::ProfilerOptions o;
  o.timing = nt::profile::Timing::stamps;
  o.graphs = true;
  o.device = "cuda";
  nt::profile::KernelProfiler profiler(std::move(o));
  exec.observer = &profiler;
  profiler.start();
  const auto graph = nt::kernels::Graph::capture(exec, [&] {
    for (int k = 0; k < kSpinCount; ++k) {
      nt::profile::StepScope step(kSpins[k].name);
      for (int i = 0; i < launches; ++i) launch_spin(exec, k);
    }
  });
  graph.launch(exec);
  profiler.stop();
  for (int k = 0; k < kSpinCount; ++k)
    for (const auto& r : profiler.data().rows())
      if (r.kernel == kSpins[k].name) us[static_cast<size_t>(k)] = r.avg_us();
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  bool ncu = false;
  int launches = 50;
  std::string out;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--ncu")) {
      ncu = true;
    } else if (!std::strcmp(argv[i], "--launches") && i + 1 < argc) {
      launches = std::atoi(argv[++i]);
      if (launches < 1 || launches > 100000) {
        std::fprintf(stderr, "--launches: expected 1..100000, got %s\n", argv[i]);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      out = argv[++i];
    } else {
      std::fprintf(stderr, "usage: bench_launch [--ncu] [--launches N] [--out FILE.csv]\n");
      return 2;
    }
  }
  if (nt::kernels::cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_launch: no CUDA device\n");
    return 1;
  }
  Exec exec;
  exec.backend = nt::kernels::Backend::cuda;
  exec.stream = nt::kernels::create_stream();
  exec.programmatic_launch = false;
  const auto stream = static_cast<cudaStream_t>(exec.stream);
  for (int k = 0; k < kSpinCount; ++k) launch_spin(exec, k);  // loads every kernel
  nt::kernels::synchronize(exec);

  if (ncu) {
    NT_CUDA_CHECK(cudaProfilerStart());
    for (int k = 0; k < kSpinCount; ++k)
      for (int i = 0; i < launches; ++i) launch_spin(exec, k);
    nt::kernels::synchronize(exec);
    NT_CUDA_CHECK(cudaProfilerStop());
    std::printf("bench_launch: %d launches of each of %d spin kernels for ncu\n", launches, kSpinCount);
  } else {
    const auto cupti = profiled_us(exec, nt::profile::Timing::cupti, launches);
    const auto events = profiled_us(exec, nt::profile::Timing::cuda_events, launches);
    const auto stamps = stamped_us(exec, launches);
    std::printf(
        "kernel     | true us | cupti us | events us | stamps us | loop us   (%d launches each, average; loop: "
        "median of 20 loops)\n",
        launches);
    std::string csv = "kernel,true_us,cupti_us,events_us,stamps_us,loop_us\n";
    for (int k = 0; k < kSpinCount; ++k) {
      const double loop = nt::bench::time_loop_us(stream, launches, 20, [&] { launch_spin(exec, k); });
      std::printf("%-10s | %7d | %8.2f | %9.2f | %9.2f | %7.2f\n", kSpins[k].name, kSpins[k].micros, cupti[k],
                  events[k], stamps[k], loop);
      char line[200];
      std::snprintf(line, sizeof line, "%s,%d,%.4f,%.4f,%.4f,%.4f\n", kSpins[k].name, kSpins[k].micros, cupti[k],
                    events[k], stamps[k], loop);
      csv += line;
    }
    if (!out.empty()) {
      const auto slash = out.find_last_of('/');
      const std::string dir = slash == std::string::npos ? "." : out.substr(0, slash);
      if (!nt::bench::write_result(dir, out.substr(slash + 1), csv)) return 1;
    }
  }
  nt::kernels::destroy_stream(exec.stream);
  return 0;
}
