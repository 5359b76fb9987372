// nanotrain devices: the CUDA devices this build sees, what its code can do on each, and why one cannot be used.
#include <cstdio>

#include "apps/command.h"
#include "kernels/runtime.h"

namespace nt::app {

namespace {

int run_devices() {
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
  for (int i = 0; i < n; ++i) {
    const auto d = kernels::cuda_device_info(i);
    std::printf("  cuda:%d %s, %d SMs, %.1f GiB, sm_%d%d: %s\n", i, d.name.c_str(), d.sm_count,
                static_cast<double>(d.total_memory) / (1u << 30), d.cc_major, d.cc_minor, d.code_path().c_str());
  }
  // What auto would choose, and why, exactly as train, eval and profile decide it.
  const Context ctx(ContextOptions{});
  if (ctx.on_cuda())
    std::printf("--device auto: %s\n", ctx.describe().c_str());
  else
    std::printf("--device auto: %s, because %s\n", ctx.describe().c_str(), ctx.why_cpu().c_str());
  return 0;
}

}  // namespace

Command register_devices(CLI::App& app) {
  auto* cmd = app.add_subcommand("devices", "List the CUDA devices this build can see, and what auto chooses");
  return {cmd, [] { return run_devices(); }};
}

}  // namespace nt::app
