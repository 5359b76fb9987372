// Shared test helpers: the tolerance policy, random inputs, poisoned outputs, device buffers.
#pragma once

#include "catch2.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "data/batcher.h"
#include "engine/context.h"
#include "kernels/batch.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/exec.h"
#include "kernels/runtime.h"

namespace nt::test {

// Sets (or, with nullptr, removes) an environment variable for the length of a scope, then restores it.
struct ScopedEnv {
  std::string name, old;
  bool had = false;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (const char* v = std::getenv(n)) had = true, old = v;
    if (value)
      ::setenv(n, value, 1);
    else
      ::unsetenv(n);
  }
  ~ScopedEnv() {
    if (had)
      ::setenv(name.c_str(), old.c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

// ---- tolerance policy -------------------------------------------------------------------------------
// One rule for comparing a computed array with a reference:
//   |got - want| <= abs_tol + rel_tol * scale     for every element, NaN never passes,
// where `scale` is the magnitude of the result (max |want|), because fp32 rounding errors grow with the
// size of the values summed, not with each element's own size (an output near 0 after cancellation
// carries the absolute error of its large summands).
struct Tolerance {
  double abs_tol;
  double rel_tol;
  const char* reason;
};

// fp32 dot products of length K: each product rounds at eps/2 and the running sum's error grows like
// sqrt(K)·eps on random data (K·eps worst case); 8·sqrt(K)·eps with eps = 2^-23 leaves room for
// fixed-order summation differences between backends without hiding a wrong index (which is O(1)).
Tolerance fp32_dot(int K);

struct Mismatch {
  bool ok = true;
  size_t index = 0;
  double got = 0, want = 0, allowed = 0;
  std::string describe() const;
};

Mismatch compare(std::span<const float> got, std::span<const double> want, const Tolerance& tol);
Mismatch compare(std::span<const float> got, std::span<const float> want, const Tolerance& tol);

#define NT_REQUIRE_CLOSE(got, want, tol)                    \
  do {                                                      \
    auto nt_m_ = ::nt::test::compare((got), (want), (tol)); \
    INFO(nt_m_.describe() << " [" << (tol).reason << "]");  \
    REQUIRE(nt_m_.ok);                                      \
  } while (0)

// fp32's machine epsilon (2^-23), the unit of the tolerances written in ulps of a result's scale.
inline const double kEps = std::ldexp(1.0, -23);

// Bit-for-bit equality (NaNs included, +0 and -0 told apart), for ops that promise identical results.
template <class T>
bool same_bits(const T* a, const T* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(T)) == 0;
}
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && same_bits(a.data(), b.data(), a.size());
}

// softmax_xent's loss and gradient, on the CPU against a double-precision reference and on CUDA against the CPU twin
// (tests/cpu/test_softmax_xent.cpp, tests/cuda/test_softmax_xent_cuda.cpp).
// Loss: each row loss is log(s) + (m - x_label) in fp32: s sums C terms, so its relative error (which becomes the
// absolute error of log s) grows like sqrt(C)·eps on random data, and the final additions add a few eps of the row
// loss's own size. Summed over B rows (losses are >= 0, so Σ|loss_b| = |total|). Between the backends, which share
// the row arithmetic and the summation order, the same bound holds: they differ by expf (CUDA: 2 ulp, glibc: 1 ulp)
// and logf, which perturb s by a few eps relative before the rounding of its sum of C terms.
double xent_loss_allowed(int B, int C, double total);
// Gradient: dlogits = (p - onehot)/B: p carries ~sqrt(C)·eps relative error from s (and, between the backends, that
// of expf), and where p is near 1 it is rounded on a 2^-24 grid, so p - 1 has an absolute error of ~eps/2 however
// small the result: hence an absolute term of 2·eps/B besides the relative one.
Tolerance xent_grad_tolerance(int B, int C);

// Both ways to run a CPU op: on the calling thread, and on a pool (the chunked parallel paths).
struct CpuExecs {
  kernels::ThreadPool pool{3};
  kernels::Exec serial{};
  kernels::Exec pooled{};
  CpuExecs() { pooled.pool = &pool; }
};

// ---- inputs -----------------------------------------------------------------------------------------
// Fresh random inputs for every check: a fixed seed per test keeps failures reproducible, and
// Catch's --rng-seed changes them when asked.
std::mt19937_64& rng();
std::vector<float> random_floats(size_t n, float lo = -1.f, float hi = 1.f);
std::vector<int32_t> random_labels(size_t n, int classes);

// Poison used to prove every output element was written: a quiet NaN.
inline constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
inline std::vector<float> poisoned(size_t n) { return std::vector<float>(n, kPoison); }
// The same quiet NaN, as an input value.
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// An activation (n, c, hw) as the GPU's writers stage it under `math` (kernels/operand.h, stage_channels_last:
// channels-last, BF16 bits or TF32-rounded fp32), held in 32-bit words (two BF16 elements a word), and back to fp32
// NCHW. staged_words: the words `elements` staged elements take. kStagedPoison: a word that is NaN in either format
// (two BF16 NaNs, or one fp32 NaN), to prove what a kernel wrote and where it stopped.
size_t staged_words(kernels::Math math, size_t elements);
std::vector<uint32_t> staged_copy(kernels::Math math, const std::vector<float>& nchw, int64_t n, int64_t c, int64_t hw);
std::vector<float> unstaged_copy(kernels::Math math, const std::vector<uint32_t>& words, int64_t n, int64_t c,
                                 int64_t hw);
inline constexpr uint32_t kStagedPoison = 0x7fc17fc1u;

// Max-pooling inputs in [-2, 2): uniform; ties (four values: ties in most windows); nan (a NaN in many windows,
// sometimes two).
enum class PoolInput { uniform, ties, nan };
std::vector<float> pool_input(size_t n, PoolInput kind);

// ---- batch shifts ----------------------------------------------------------------------------------
// Brute force: every (dy, dx) in [-k, k]^2, in row-major order, for which `image` (C,H,W) translated by it,
// black (a 0 pixel) outside, normalized with (mean, std), equals `got` (C,H,W) bit for bit.
std::vector<kernels::PixelShift> matching_shifts(const uint8_t* image, int C, int H, int W, int k, float mean,
                                                 float std_dev, const float* got);

// ---- device buffers ---------------------------------------------------------------------------------
// An owning buffer on a backend, with host round trips for tests.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer(const kernels::Exec& exec, size_t n) : exec_(exec), n_(n) {
    ptr_ = static_cast<T*>(kernels::device_alloc(exec.backend, n * sizeof(T)));
  }
  DeviceBuffer(const kernels::Exec& exec, const std::vector<T>& host) : DeviceBuffer(exec, host.size()) {
    upload(host);
  }
  ~DeviceBuffer() { kernels::device_free(exec_.backend, ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() { return ptr_; }
  const T* get() const { return ptr_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    kernels::copy_host_to_device(exec_, ptr_, host.data(), n_ * sizeof(T));
    kernels::synchronize(exec_);
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    kernels::copy_device_to_host(exec_, host.data(), ptr_, n_ * sizeof(T));
    kernels::synchronize(exec_);
    return host;
  }

 private:
  kernels::Exec exec_;
  size_t n_;
  T* ptr_ = nullptr;
};

// A host vector placed at `offset` elements into a device buffer whose other elements hold `pad`, so that
// misaligned pointers can be tested and writes outside [offset, offset+n) detected.
template <class T>
std::vector<T> padded(const std::vector<T>& v, size_t offset, T pad) {
  std::vector<T> out(v.size() + offset + 1, pad);
  std::copy(v.begin(), v.end(), out.begin() + offset);
  return out;
}

// A device op's step or draw counter as the host writes it: {value, 0} (kernels/cuda/grid_counter.cuh).
inline std::vector<uint64_t> counter_at(uint64_t value) { return {value, 0}; }

// The CUDA execution handle for tests: its own stream, debug-sync on so faults name their kernel.
struct CudaExec {
  CudaExec();
  ~CudaExec();
  kernels::Exec exec;
};

// A CUDA execution handle on a stream of its own without debug-sync, which would synchronize after every launch and
// forbid both overlap and graph capture. Waits for its stream before destroying it.
struct StreamExec {
  StreamExec();
  ~StreamExec();
  kernels::Exec exec;
};

// Device 0 as the CUDA tests find it: what the code this binary runs there can do (kernels/runtime.h). A test of
// a feature that the code path lacks checks what the engine does instead, or skips with the reason.
const kernels::DeviceInfo& cuda_device();
// The maths a test covers (Exec::math): fp32, and TF32 and BF16 where the code path has them (else a warning says they
// are not).
std::vector<kernels::Math> math_modes();
// On a code path without TF32 and BF16 MMAs (compute_75 code), what such a run meets instead: the context refuses
// --tf32 or --bf16 with the reason, before anything runs. Checks that, for a test whose half cannot run here.
void check_context_refuses(kernels::Math math);
// A run that diverges (--lr 1e6) on `device` stops after the first epoch with exit code 3 and one line naming the
// epoch, keeps the checkpoint at --save, writes JSON metrics (null for NaN); with --allow-nonfinite it goes on, and
// eval refuses the checkpoint it saved.
void check_divergence_stops_the_run(const std::string& device);
// Through the CLI on `device`: a run stopped after an epoch and resumed from its resumable checkpoint ends in the
// same bits and metrics as the run that was never stopped (SGD with momentum; Adam with the cosine schedule and
// --shift), and a resume that changes the model, batch or optimizer is refused naming the flag.
void check_resume_is_exact(const std::string& device);

// Largest Σ_k |a(i,k)|·|b(j,k)| over i < I, j < J: what bounds the fp32 rounding of the dot products
// a(i,·)·b(j,·), whose results may cancel to far less than their terms.
template <class A, class Bf>
inline double max_term_sum(int I, int J, int K, A a, Bf b) {
  double most = 0;
  for (int i = 0; i < I; ++i)
    for (int j = 0; j < J; ++j) {
      double sum = 0;
      for (int k = 0; k < K; ++k) sum += std::abs(double(a(i, k))) * std::abs(double(b(j, k)));
      most = std::max(most, sum);
    }
  return most;
}
// Rows of `logits` (B, C) whose two largest values differ by at most `gap` (and are not equal): the rows whose
// argmax two backends may pick differently when their logits differ by gap/2 each. Exact ties take the lowest index on
// both.
int64_t near_ties(const std::vector<float>& logits, int B, int C, double gap);

// adam_update on CUDA against the CPU: both backends run the same correctly rounded fp32 operations (explicit FMAs,
// IEEE sqrt and division, the same double-precision bias corrections), so they are expected to agree bit for bit. The
// tolerance still allows what one ulp of difference in a sqrt or division (should the device's differ) would do after a
// few steps: a few ulp of the update, which is below a few ulp of the result's scale (max |p|, |m| or |v|), since |p| ~
// 1 and the update ~ lr. A wrong t, index or missing decay is far larger.
inline const Tolerance kAdamTolerance{0, 4 * kEps,
                                      "sqrt/div rounding may differ by an ulp: 4 eps of the scale (max |x|)"};

// ---- data and binaries ------------------------------------------------------------------------------
std::string mnist_dir();  // NT_DATA_DIR, else the folder scripts/fetch-data fills
std::string cli_path();   // the nanotrain binary under test

struct CommandResult {
  int exit_code = 0;
  std::string out;  // stdout and stderr together
};
CommandResult run_command(const std::string& command);

// `command` for a shell, in a process that may allocate about `mib` MiB at most: `ulimit -v`, or under
// AddressSanitizer (scripts/sanitize), which reserves terabytes of address space up front, its own limit on one
// allocation, past which malloc returns null (operator new still aborts with a report there).
std::string with_memory_limit(int mib, const std::string& command);
// `out` without the notes AddressSanitizer prints where such a limit makes malloc return null.
std::string without_allocator_notes(const std::string& out);
// A fresh folder of its own under the system's temporary folder (mkdtemp), removed with its contents when the
// test ends.
struct TempDir {
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const;  // a path inside it
  std::string path;
};

std::string read_file(const std::string& path);

// An error message that names the file `path` and holds `phrase`, on one line: what every nt::Error about a file
// must be. REQUIRE_THROWS_WITH(read(p), names(p, "truncated payload")).
class NamesFileAnd : public TextMatcher {
 public:
  NamesFileAnd(std::string path, std::string phrase) : path_(std::move(path)), phrase_(std::move(phrase)) {}
  bool match(const std::string& msg) const override {
    return msg.find(path_) != std::string::npos && msg.find(phrase_) != std::string::npos &&
           msg.find('\n') == std::string::npos;
  }
  std::string describe() const override { return "one line naming \"" + path_ + "\" with \"" + phrase_ + "\""; }

 private:
  std::string path_, phrase_;
};
inline NamesFileAnd names(const std::string& path, const std::string& phrase) { return {path, phrase}; }

// The whole epoch of a batcher, `batch` rows at a time after begin_epoch(epoch), each batch's output poisoned
// before its gather.
struct GatheredEpoch {
  std::vector<float> x;    // (examples, values per example)
  std::vector<int32_t> y;  // (examples)
};
GatheredEpoch gather_epoch(const Context& ctx, data::DeviceBatcher& batcher, const data::Dataset& d, int epoch,
                           int batch);  // every byte of it ("" when it cannot be read)

// How two weight files (safetensors, the same tensors) differ: bit for bit, and the largest relative difference of a
// tensor, |a - b| / |b| in the L2 norm.
struct WeightsDifference {
  bool same_bits = true;
  double max_relative = 0;
  std::string worst;  // the tensor with the largest relative difference
};
WeightsDifference compare_weights(const std::string& a, const std::string& b);

// The data-parallel launchers under test: `mpirun` of this machine with the arguments every test needs.
std::string mpirun(int ranks);
// Starts `command` (a data-parallel training whose launcher's children are its ranks, and which writes `metrics`
// after each epoch) in the background, kills its newest rank with SIGKILL once the first epoch is written, and
// waits for the launcher. Returns what the run printed and a report: "ranks: PIDS", "launcher exit CODE" and
// "left running: PIDS" for ranks still there 30 s after the launcher ended.
std::string kill_a_rank_mid_run(const std::string& command, const std::string& metrics, const TempDir& dir);
// That report: two ranks were found, the launcher failed, and none was left running.
void check_killed_run(const std::string& report);

// The temporary files of an atomic write to `path` that are still beside it (core/atomic_file.h: PATH.tmp.*).
std::vector<std::string> temporaries_of(const std::string& path);

}  // namespace nt::test
