// CUDA tests need a GPU. Without one they are skipped (kSkipExitCode, which ctest reports as "Skipped"),
// but listing them still works so that ctest can discover them on any machine.
#include "catch2_main.h"

#include <cstdio>
#include <string>
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
      // A GPU that is there but unusable (driver too old, no CUDA backend) is a problem to fix, not a reason to skip.
      if (const std::string problem = nt::kernels::cuda_unusable_reason(); !problem.empty()) {
        std::printf("CUDA tests cannot run: %s\n", problem.c_str());
        return 1;
      }
      std::puts("no CUDA device: CUDA tests skipped");
      return nt::test::kSkipExitCode;
    }
    const auto info = nt::kernels::cuda_device_info(0);
    if (!info.runs_code()) {  // likewise a GPU that the build cannot drive
      std::printf("this build (%s) cannot run on %s (sm_%d%d): %s\n", nt::kernels::cuda_built_for(), info.name.c_str(),
                  info.cc_major, info.cc_minor, info.code_path().c_str());
      return 1;
    }
    std::printf("CUDA tests on %s (sm_%d%d), %s\n", info.name.c_str(), info.cc_major, info.cc_minor,
                info.code_path().c_str());
  }
  return nt::test::run_catch_session(argc, argv);
}
