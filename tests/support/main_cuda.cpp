// CUDA tests need a GPU. Without one they are skipped (kSkipExitCode, which ctest reports as "Skipped"),
// but listing them still works so that ctest can discover them on any machine.
#include "catch2_main.h"

#include <cstdio>
#include <string_view>

#include "kernels/runtime.h"

namespace {
bool only_listing(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]).starts_with("--list")) return true;
  return false;
}
}  // namespace

int main(int argc, char** argv) {
  if (!only_listing(argc, argv)) {
    if (nt::kernels::cuda_device_count() == 0) {
      std::puts("no CUDA device: CUDA tests skipped");
      return nt::test::kSkipExitCode;
    }
    std::string built_for;
    auto info = nt::kernels::cuda_device_info(0);
    if (!nt::kernels::cuda_build_runs_on(info, &built_for)) {
      // A GPU that the build cannot drive is a build problem, not a reason to skip.
      std::printf("this build (%s) has no code for %s (sm_%d%d)\n", built_for.c_str(), info.name.c_str(),
                  info.cc_major, info.cc_minor);
      return 1;
    }
  }
  return nt::test::run_catch_session(argc, argv);
}
