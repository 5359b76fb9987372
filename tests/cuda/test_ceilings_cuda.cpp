// The measured ceilings on the GPU (kernels/ceilings.h): every rate positive and physically plausible for any GPU,
// tensor cores faster than the FMA units where the code has them (0 where it does not), the loops reported through
// the one launch path, and `nanotrain devices --measure` caching what it measured.
#include "test_support.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

#include "counting_observer.h"
#include "kernels/ceilings.h"
#include "kernels/runtime.h"
#include "profile/ceilings.h"

using namespace nt;

namespace {

// CUDA tests synchronize after every launch (test::CudaExec); a measurement is timed as the CLI runs it, without.
kernels::Exec timing_exec(const test::CudaExec& cuda) {
  kernels::Exec e = cuda.exec;
  e.debug_sync = false;
  return e;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

}  // namespace

TEST_CASE("measured ceilings are positive and physically plausible, tensor cores above fp32", "[cuda][ceilings]") {
  test::CudaExec cuda;
  test::CountingObserver counter;
  kernels::Exec exec = timing_exec(cuda);
  exec.observer = &counter;
  const profile::Ceilings c = kernels::measure_ceilings(exec);
  INFO(profile::describe(c) << "\n" << c.method);

  const auto& info = test::cuda_device();
  CHECK(c.uuid == kernels::cuda_device_uuid(0));
  CHECK(c.uuid.size() == 40);  // "GPU-" + 8-4-4-4-12
  CHECK(c.uuid.starts_with("GPU-"));
  CHECK(c.device == info.name);
  CHECK(c.measured_at.size() == 20);  // 2026-11-26T14:03:12Z
  CHECK(c.measured_at.ends_with("Z"));
  CHECK(!c.method.empty());
  CHECK(c.method.find('\n') == std::string::npos);

  // Any GPU of the last decade and the next: from a small laptop part to well beyond a B200.
  CHECK(c.copy_gb_per_s > 50);
  CHECK(c.copy_gb_per_s < 20000);
  CHECK(c.fp32_gflop_per_s > 500);
  CHECK(c.fp32_gflop_per_s < 300000);
  if (info.has_tf32()) {
    CHECK(c.tf32_gflop_per_s > c.fp32_gflop_per_s);
    CHECK(c.bf16_gflop_per_s > c.fp32_gflop_per_s);
    CHECK(c.tf32_gflop_per_s < 5'000'000);
    CHECK(c.bf16_gflop_per_s < 10'000'000);
  } else {
    WARN("compute_" << info.code_arch << " code: the TF32 and BF16 loops need sm_80 code, so they read 0");
    CHECK(c.tf32_gflop_per_s == 0);
    CHECK(c.bf16_gflop_per_s == 0);
  }

  // Every loop went through the launch path under its name (the copy is no kernel).
  auto launched = [&](const std::string& kernel) {
    int64_t n = 0;
    for (const auto& [key, calls] : counter.calls)
      if (std::get<0>(key) == kernel) n += calls;
    return n;
  };
  CHECK(launched("ceiling_fp32_fma") > 11);  // calibration, warm-up and 11 timed runs
  CHECK(launched("ceiling_tf32_mma") == (info.has_tf32() ? launched("ceiling_fp32_fma") : 0));
  CHECK(launched("ceiling_bf16_mma") == launched("ceiling_tf32_mma"));
}

TEST_CASE("devices --measure caches each GPU's ceilings, and devices then shows them", "[cuda][ceilings][cli]") {
  test::TempDir dir;
  const std::string env = "NT_CACHE_DIR=" + dir.path + " ";
  const std::string path = dir.file("ceilings.json");
  const std::string uuid = kernels::cuda_device_uuid(0);

  // Before: not measured.
  auto before = test::run_command(env + test::cli_path() + " devices");
  INFO(before.out);
  REQUIRE(before.exit_code == 0);
  CHECK(before.out.find("ceilings: not measured (nanotrain devices --measure)") != std::string::npos);

  // A corrupt cache is named, then replaced.
  write(path, "{not json");
  auto measured = test::run_command(env + test::cli_path() + " devices --measure");
  INFO(measured.out);
  REQUIRE(measured.exit_code == 0);
  CHECK(measured.out.find("nanotrain: warning: ceilings cache '" + path + "': not valid JSON") != std::string::npos);
  CHECK(measured.out.find("cuda:0 " + test::cuda_device().name + ": copy ") != std::string::npos);
  CHECK(measured.out.find("ceilings cached in " + path) != std::string::npos);
  const auto cached = profile::load_ceilings(path, uuid);
  REQUIRE(cached.has_value());
  CHECK(cached->fp32_gflop_per_s > 0);

  auto after = test::run_command(env + test::cli_path() + " devices");
  INFO(after.out);
  REQUIRE(after.exit_code == 0);
  CHECK(after.out.find("ceilings: " + profile::describe(*cached) + " (cached in " + path + ")") != std::string::npos);

  // Plain devices names a corrupt cache in a warning and goes on.
  write(path, "[]");
  auto corrupt = test::run_command(env + test::cli_path() + " devices");
  INFO(corrupt.out);
  CHECK(corrupt.exit_code == 0);
  CHECK(corrupt.out.find("nanotrain: warning: ceilings cache '" + path + "'") != std::string::npos);
  CHECK(corrupt.out.find("--device auto: ") != std::string::npos);
}
