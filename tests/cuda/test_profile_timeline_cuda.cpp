// The profiler's timeline on the GPU: two kernels made to overlap on two streams show their real overlap in CUPTI's
// concurrent-kernel records, checked against CUDA events recorded around them; and a kernel's phase stamps come back
// as child rows and slices whose lengths are the ones it spun for and whose sum is its own time.
#include "test_support.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>

#include <cuda_runtime.h>

#include "gpu_timer.h"
#include "kernels/runtime.h"
#include "profile/kernel_profiler.h"
#include "profile/report.h"
#include "tests/cuda/timeline_kernels.h"

using namespace nt;
using test::StreamExec;

namespace {

// CUPTI times the kernels of replayed graphs too; events cannot.
profile::ProfilerOptions timer_options(profile::Timing timing) {
  return test::gpu_timer(timing, /*graphs=*/timing == profile::Timing::cupti);
}

// Microseconds between two recorded events.
double us_between(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  REQUIRE(cudaEventElapsedTime(&ms, a, b) == cudaSuccess);
  return 1e3 * static_cast<double>(ms);
}

}  // namespace

TEST_CASE("two kernels on two streams: CUPTI's records show the overlap that events around them see",
          "[cuda][profile][cupti]") {
  StreamExec first, second;
  // Warm-up: the kernel's module is loaded before anything is timed.
  test::launch_spin(first.exec, "spin_a", 1);
  kernels::synchronize(first.exec);

  std::array<cudaEvent_t, 4> events{};
  for (auto& e : events) REQUIRE(cudaEventCreate(&e) == cudaSuccess);
  const auto a_stream = static_cast<cudaStream_t>(first.exec.stream);
  const auto b_stream = static_cast<cudaStream_t>(second.exec.stream);

  profile::KernelProfiler profiler(timer_options(profile::Timing::cupti));
  first.exec.observer = second.exec.observer = &profiler;
  profiler.start();
  // The profiler meets each stream once first (a short kernel on each, waited for): what that costs the host once per
  // stream (CUPTI's id for it) must not fall between the two measured launches.
  test::launch_spin(first.exec, "lead_in", 1);
  test::launch_spin(second.exec, "lead_in", 1);
  kernels::synchronize(first.exec);
  kernels::synchronize(second.exec);
  // Long enough that the host's launch of b, which a busy host can stretch to a few hundred us, stays a small part.
  constexpr int kSpinUs = 5000;
  REQUIRE(cudaEventRecord(events[0], a_stream) == cudaSuccess);
  test::launch_spin(first.exec, "spin_a", kSpinUs);
  REQUIRE(cudaEventRecord(events[1], a_stream) == cudaSuccess);
  const auto b_host_start = std::chrono::steady_clock::now();
  REQUIRE(cudaEventRecord(events[2], b_stream) == cudaSuccess);
  test::launch_spin(second.exec, "spin_b", kSpinUs);
  const double b_host_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - b_host_start).count();
  REQUIRE(cudaEventRecord(events[3], b_stream) == cudaSuccess);
  profiler.stop();
  first.exec.observer = second.exec.observer = nullptr;

  // By events: a's bracket [0, 1], b's [2, 3], both against a's start.
  const double a_end = us_between(events[0], events[1]);
  const double b_start = us_between(events[0], events[2]), b_end = us_between(events[0], events[3]);
  const double events_overlap = std::min(a_end, b_end) - std::max(0.0, b_start);
  for (auto e : events) cudaEventDestroy(e);

  const auto& d = profiler.data();
  REQUIRE(d.launches_without_record == 0);
  REQUIRE(d.launches().size() == 4);
  const auto& a = d.launches()[2];
  const auto& b = d.launches()[3];
  CHECK(a.stream != b.stream);
  // Alone on its stream, each kernel's exclusive time is its span.
  CHECK(a.exclusive_us == a.span_us);
  CHECK(b.exclusive_us == b.span_us);
  CHECK(a.span_us >= kSpinUs);
  const double cupti_overlap = std::min(a.end_us(), b.end_us()) - std::max(a.start_us, b.start_us);
  INFO("overlap: cupti " << cupti_overlap << " us, events " << events_overlap << " us; a [" << a.start_us << ", "
                         << a.end_us() << "], b [" << b.start_us << ", " << b.end_us() << "]");
  CHECK(cupti_overlap > 0.9 * kSpinUs);  // launched back to back: they ran side by side for most of their length
  // An event pair contains its kernel, and more: a start event fires when the stream reaches it, before the host has
  // even submitted the kernel behind it (docs/profiler.md, Fidelity). So the brackets overlap at least as much as the
  // kernels do, and more by at most the host's time from b's start event to b's launch (13 us seen on an H100, a few
  // hundred when the host is busy; measured here), plus the GPU's start of b.
  INFO("the host took " << b_host_us << " us from b's start event to its launch");
  CHECK(cupti_overlap <= events_overlap + 2.0);
  CHECK(cupti_overlap >= events_overlap - b_host_us - 30.0);

  // The step-free launches sit on separate tracks of the trace, one per stream.
  const std::string trace = profile::to_trace_json(d);
  CHECK(trace.find("\"stream 1\"") != std::string::npos);
}

TEST_CASE("phase stamps: a kernel's phases come back as child rows whose lengths it spun for, inside its own time",
          "[cuda][profile]") {
  StreamExec s;
  const std::array<int, 3> phases{20, 40, 10};
  test::launch_phased_spin(s.exec, phases.data(),
                           static_cast<int>(phases.size()));  // warm-up, no observer: its stamps go nowhere
  kernels::synchronize(s.exec);

  for (const auto timing : {profile::Timing::cupti, profile::Timing::cuda_events}) {
    INFO("timer " << profile::timing_name(timing));
    profile::KernelProfiler profiler(timer_options(timing));
    s.exec.observer = &profiler;
    profiler.start();
    test::launch_phased_spin(s.exec, phases.data(), static_cast<int>(phases.size()));
    test::launch_phased_spin(s.exec, phases.data(), static_cast<int>(phases.size()));
    // Replayed from a graph: the captured launch keeps its tag, and each replay's stamps are its own.
    kernels::Graph graph;
    if (timing == profile::Timing::cupti) {
      graph = kernels::Graph::capture(
          s.exec, [&] { test::launch_phased_spin(s.exec, phases.data(), static_cast<int>(phases.size())); });
      graph.launch(s.exec);
      graph.launch(s.exec);
    }
    profiler.stop();
    s.exec.observer = nullptr;

    const auto& d = profiler.data();
    const int launches = timing == profile::Timing::cupti ? 4 : 2;
    CHECK(d.stamps_lost == 0);
    REQUIRE(d.launches().size() == static_cast<size_t>(launches));
    const auto rows = d.rows();
    REQUIRE(rows.size() == 4);  // the kernel, then its three phases in their declared order
    CHECK(rows[0].kernel == "phased_spin");
    for (size_t k = 0; k < phases.size(); ++k) {
      const auto& r = rows[k + 1];
      INFO(r.part << ": " << r.avg_us() << " us");
      CHECK(r.part == "phase " + std::to_string(k));
      CHECK(r.calls == launches);
      // %globaltimer measured the spin and the stamps alike: a phase is its spin and the few instructions of a mark.
      CHECK(r.min_us >= phases[k] - 0.05);
      CHECK(r.max_us < phases[k] + 2.0);
    }
    // The phases add up to the kernel's own time, less its start-up before the first mark and after the last. (An
    // event pair, without the hold here, also brackets the host's launch after its start event: only the first
    // bound holds for it.)
    const double phases_sum = rows[1].avg_us() + rows[2].avg_us() + rows[3].avg_us();
    INFO("phases " << phases_sum << " us, kernel " << rows[0].avg_us() << " us");
    CHECK(phases_sum <= rows[0].avg_us() + 0.5);
    if (timing == profile::Timing::cupti) CHECK(phases_sum >= rows[0].avg_us() - 3.0);
    // In the trace, each phase slice lies inside its kernel's.
    CHECK(d.parts().size() == static_cast<size_t>(3 * launches));
    for (const auto& p : d.parts()) {
      const auto& parent = d.launches()[p.launch];
      CHECK(p.start_us >= parent.exclusive_start_us() - 1e-6);
    }
  }
}
