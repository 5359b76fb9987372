#include "test_support.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <sys/wait.h>

namespace nt::test {

Tolerance fp32_dot(int K) {
  double eps = std::ldexp(1.0, -23);
  return {1e-30, 8.0 * std::sqrt(std::max(1, K)) * eps, "fp32 dot products: 8*sqrt(K)*eps of the result's scale"};
}

std::string Mismatch::describe() const {
  if (ok) return "all elements within tolerance";
  std::ostringstream s;
  s << "element " << index << ": got " << got << ", want " << want << ", allowed error " << allowed;
  return s.str();
}

namespace {
template <class Want>
Mismatch compare_impl(std::span<const float> got, std::span<const Want> want, const Tolerance& tol) {
  Mismatch m;
  if (got.size() != want.size()) {
    m.ok = false;
    m.index = std::min(got.size(), want.size());
    return m;
  }
  double scale = 0;
  for (auto w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
  double allowed = tol.abs_tol + tol.rel_tol * scale;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], w = static_cast<double>(want[i]);
    if (!(std::abs(g - w) <= allowed)) {  // written so that NaN fails
      m = {false, i, g, w, allowed};
      return m;
    }
  }
  return m;
}
}  // namespace

Mismatch compare(std::span<const float> got, std::span<const double> want, const Tolerance& tol) {
  return compare_impl(got, want, tol);
}
Mismatch compare(std::span<const float> got, std::span<const float> want, const Tolerance& tol) {
  return compare_impl(got, want, tol);
}

std::mt19937_64& rng() {
  static std::mt19937_64 engine(Catch::rngSeed() ? Catch::rngSeed() : 20261121u);
  return engine;
}

std::vector<float> random_floats(size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng());
  return v;
}

std::vector<int32_t> random_labels(size_t n, int classes) {
  std::uniform_int_distribution<int32_t> dist(0, classes - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(rng());
  return v;
}

CudaExec::CudaExec() {
  exec.backend = kernels::Backend::cuda;
  exec.stream = kernels::create_stream();
  exec.debug_sync = true;
}
CudaExec::~CudaExec() { kernels::destroy_stream(exec.stream); }

std::string mnist_dir() {
  if (const char* env = std::getenv("NT_DATA_DIR"); env && *env) return env;
  return NT_TEST_DATA_DIR;
}

std::string cli_path() { return NT_CLI_PATH; }

CommandResult run_command(const std::string& command) {
  CommandResult r;
  std::string full = command + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buf{};
  while (size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) r.out.append(buf.data(), n);
  int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace nt::test
