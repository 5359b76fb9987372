// nanotrain devices: the CUDA devices this build sees, and whether it carries code for them.
#include <cstdio>

#include "apps/command.h"
#include "kernels/runtime.h"

namespace nt::app {

namespace {

int run_devices() {
  const int n = kernels::cuda_device_count();
#if NT_WITH_CUDA
  std::printf("CUDA backend: built for %s\n", NT_CUDA_ARCHS);
#else
  std::printf("CUDA backend: not built\n");
#endif
  std::printf("CUDA devices: %d\n", n);
  for (int i = 0; i < n; ++i) {
    auto d = kernels::cuda_device_info(i);
    std::string built_for;
    bool runs = kernels::cuda_build_runs_on(d, &built_for);
    std::printf("  cuda:%d %s, %d SMs, %.1f GiB, sm_%d%d%s\n", i, d.name.c_str(), d.sm_count,
                static_cast<double>(d.total_memory) / (1u << 30), d.cc_major, d.cc_minor,
                runs ? "" : " (no code for it in this build)");
  }
  return 0;
}

}  // namespace

Command register_devices(CLI::App& app) {
  auto* cmd = app.add_subcommand("devices", "List the CUDA devices this build can see");
  return {cmd, [] { return run_devices(); }};
}

}  // namespace nt::app
