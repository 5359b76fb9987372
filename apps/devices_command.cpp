// nanotrain devices: the CUDA devices this build sees, what its code can do on each, why one cannot be used, and each
// one's measured ceilings (profile/ceilings.h) when they are cached. --measure measures them and caches them.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <system_error>

#include "apps/command.h"
#include "kernels/ceilings.h"
#include "kernels/runtime.h"
#include "profile/ceilings.h"

namespace nt::app {

namespace {

void warn(const std::string& what) { std::fprintf(stderr, "nanotrain: warning: %s\n", what.c_str()); }

// The cache's path, and why it cannot be read ("" when it can, or when there is none yet).
struct Cache {
  std::string path;
  std::string problem;
};

Cache open_cache() {
  Cache cache;
  try {
    cache.path = profile::ceilings_cache_path();
    profile::load_ceilings(cache.path, "");  // checks the whole file
  } catch (const Error& e) {
    cache.problem = e.what();
  }
  return cache;
}

// "    ceilings: copy 2951 GB/s, ... (measured 2026-11-26) (cached in PATH)", or why there are none.
void print_cached_ceilings(const Cache& cache, int device) {
  if (!cache.problem.empty()) {
    std::printf("    ceilings: unknown (the cache cannot be read: see the warning)\n");
    return;
  }
  const std::optional<profile::Ceilings> c = profile::load_ceilings(cache.path, kernels::cuda_device_uuid(device));
  if (c)
    std::printf("    ceilings: %s (cached in %s)\n", profile::describe(*c).c_str(), cache.path.c_str());
  else
    std::printf("    ceilings: not measured (nanotrain devices --measure)\n");
}

int list_devices() {
  const int n = kernels::cuda_device_count();
  if (kernels::cuda_built())
    std::printf("CUDA backend: built for %s\n", kernels::cuda_built_for());
  else
    std::printf("CUDA backend: not built\n");
  std::printf("CUDA devices: %d\n", n);
  if (n == 0) {
    const std::string problem = kernels::cuda_unusable_reason();
    if (!problem.empty()) std::printf("  unusable: %s\n", problem.c_str());
  }
  const Cache cache = n > 0 ? open_cache() : Cache{};
  if (!cache.problem.empty()) {
    std::fflush(stdout);
    warn(cache.problem + "; nanotrain devices --measure replaces it");
  }
  for (int i = 0; i < n; ++i) {
    const auto d = kernels::cuda_device_info(i);
    std::printf("  cuda:%d %s, %d SMs, %.1f GiB, sm_%d%d: %s\n", i, d.name.c_str(), d.sm_count,
                static_cast<double>(d.total_memory) / (1u << 30), d.cc_major, d.cc_minor, d.code_path().c_str());
    print_cached_ceilings(cache, i);
  }
  // What auto would choose, and why, exactly as train, eval and profile decide it.
  const Context ctx(ContextOptions{});
  if (ctx.on_cuda())
    std::printf("--device auto: %s\n", ctx.describe().c_str());
  else
    std::printf("--device auto: %s, because %s\n", ctx.describe().c_str(), ctx.why_cpu().c_str());
  return 0;
}

// An execution handle on the current device with a stream of its own: what measure_ceilings needs, no more.
class DeviceExec {
 public:
  DeviceExec() {
    exec_.backend = kernels::Backend::cuda;
    exec_.stream = kernels::create_stream();
  }
  ~DeviceExec() { kernels::destroy_stream(exec_.stream); }
  DeviceExec(const DeviceExec&) = delete;
  DeviceExec& operator=(const DeviceExec&) = delete;
  const kernels::Exec& exec() const { return exec_; }

 private:
  kernels::Exec exec_;
};

int measure_devices() {
  const int n = kernels::cuda_device_count();
  if (n == 0) {
    std::string why = kernels::cuda_unusable_reason();
    if (why.empty())
      why = kernels::cuda_built()
                ? "no CUDA device is visible (no NVIDIA GPU or no driver)"
                : "this build of nanotrain has no CUDA backend (nvcc was not found when it was built)";
    throw Error("devices --measure: no GPU to measure: " + why);
  }
  const Cache cache = open_cache();
  if (cache.path.empty()) throw Error("devices --measure: " + cache.problem);  // no folder for the cache
  if (!cache.problem.empty()) {
    warn(cache.problem + "; replacing it");
    std::error_code ec;
    std::filesystem::remove(cache.path, ec);
    if (ec) throw Error(cat("devices --measure: cannot remove '", cache.path, "': ", ec.message()));
  }
  int measured = 0;
  for (int i = 0; i < n; ++i) {
    const auto d = kernels::cuda_device_info(i);
    if (!d.runs_code()) {
      std::printf("cuda:%d %s: not measured: %s\n", i, d.name.c_str(), d.code_path().c_str());
      continue;
    }
    kernels::cuda_set_device(i);
    const DeviceExec device;
    const profile::Ceilings c = kernels::measure_ceilings(device.exec());
    std::printf("cuda:%d %s: %s\n", i, d.name.c_str(), profile::describe(c).c_str());
    std::fflush(stdout);
    profile::store_ceilings(cache.path, c);
    ++measured;
  }
  if (measured == 0) throw Error("devices --measure: none of the GPUs could be measured (see above)");
  std::printf("ceilings cached in %s\n", cache.path.c_str());
  return 0;
}

}  // namespace

Command register_devices(CLI::App& app) {
  auto* cmd = app.add_subcommand("devices", "List the CUDA devices this build can see, and what auto chooses");
  auto measure = std::make_shared<bool>(false);
  cmd->add_flag("--measure", *measure,
                "Measure each GPU's ceilings (copy GB/s; fp32, TF32 and BF16 GFLOP/s) for the profiler's roofline "
                "percentages, and cache them");
  return {cmd, [measure] { return *measure ? measure_devices() : list_devices(); }};
}

}  // namespace nt::app
