#include "test_support.h"

#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "engine/checkpoint.h"
#include "engine/context.h"
#include "kernels/operand.h"

namespace nt::test {

Tolerance fp32_dot(int K) {
  double eps = std::ldexp(1.0, -23);
  return {1e-30, 8.0 * std::sqrt(std::max(1, K)) * eps, "fp32 dot products: 8*sqrt(K)*eps of the result's scale"};
}

double xent_loss_allowed(int B, int C, double total) {
  return B * 8 * std::sqrt(double(C)) * kEps + 4 * kEps * std::abs(total);
}

Tolerance xent_grad_tolerance(int B, int C) {
  return {2 * kEps / B, 8 * std::sqrt(double(C)) * kEps,
          "softmax gradient: sqrt(C)*eps relative from the exp sum, eps/B absolute where p rounds near 1"};
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
  static std::mt19937_64 engine(random_seed());
  return engine;
}

std::vector<float> random_floats(size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng());
  return v;
}

size_t staged_words(kernels::Math math, size_t elements) {
  return (elements * kernels::staged_element_bytes(math) + sizeof(uint32_t) - 1) / sizeof(uint32_t);
}

std::vector<uint32_t> staged_copy(kernels::Math math, const std::vector<float>& nchw, int64_t n, int64_t c,
                                  int64_t hw) {
  std::vector<uint32_t> words(staged_words(math, nchw.size()), 0);
  kernels::stage_channels_last(nchw.data(), n, c, hw, math, words.data());
  return words;
}

std::vector<float> unstaged_copy(kernels::Math math, const std::vector<uint32_t>& words, int64_t n, int64_t c,
                                 int64_t hw) {
  std::vector<float> nchw(size_t(n * c * hw));
  kernels::unstage_channels_last(words.data(), n, c, hw, math, nchw.data());
  return nchw;
}

std::vector<int32_t> random_labels(size_t n, int classes) {
  std::uniform_int_distribution<int32_t> dist(0, classes - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(rng());
  return v;
}

std::vector<float> pool_input(size_t n, PoolInput kind) {
  std::vector<float> x = random_floats(n, -2.f, 2.f);
  if (kind == PoolInput::ties)
    for (auto& v : x) v = std::floor(v);  // four values: ties in most windows
  if (kind == PoolInput::nan)
    for (size_t i = 0; i < n; i += 11) x[i] = kNaN;  // a NaN in many windows, sometimes two
  return x;
}

CudaExec::CudaExec() {
  exec.backend = kernels::Backend::cuda;
  exec.stream = kernels::create_stream();
  exec.debug_sync = true;
}
CudaExec::~CudaExec() { kernels::destroy_stream(exec.stream); }

StreamExec::StreamExec() {
  exec.backend = kernels::Backend::cuda;
  exec.stream = kernels::create_stream();
}
StreamExec::~StreamExec() {
  kernels::synchronize(exec);
  kernels::destroy_stream(exec.stream);
}

const kernels::DeviceInfo& cuda_device() {
  static const kernels::DeviceInfo info = kernels::cuda_device_info(0);
  return info;
}

void check_context_refuses(kernels::Math math) {
  INFO(cuda_device().name << " runs " << cuda_device().code_path());
  ContextOptions options;
  options.device = "cuda";
  options.math = math;
  CHECK_THROWS_WITH(Context(options),
                    Contains(math == kernels::Math::tf32 ? "--tf32" : "--bf16") && Contains("compute_"));
}

void check_divergence_stops_the_run(const std::string& device) {
  const TempDir dir;
  const std::string good = dir.file("good.safetensors"), bad = dir.file("bad.safetensors");
  const std::string metrics = dir.file("metrics.jsonl");
  const std::string train = cat(cli_path(), " train --device ", device, " --data ", mnist_dir(),
                                " --train-limit 1280 --batch 64 --log-level warn");
  REQUIRE(run_command(train + " --epochs 1 --save " + good).exit_code == 0);
  const std::string saved = read_file(good);

  const auto r = run_command(train + " --epochs 3 --lr 1e6 --save " + good + " --metrics " + metrics);
  INFO(r.out);
  CHECK(r.exit_code == 3);
  CHECK(r.out.find("nanotrain: training diverged in epoch 1 (steps 1..20): train loss ") != std::string::npos);
  CHECK(r.out.find("first non-finite tensor ") != std::string::npos);
  CHECK(r.out.find("--save " + good + " left as it was") != std::string::npos);
  CHECK(r.out.find("epoch   2") == std::string::npos);  // it stopped
  CHECK(read_file(good) == saved);
  const std::string lines = read_file(metrics);
  INFO(lines);
  CHECK(lines.find("\"train_loss\": null") != std::string::npos);
  CHECK(lines.find("\"nonfinite\": true}") != std::string::npos);
  CHECK(lines.find("nan") == std::string::npos);
  CHECK(lines.find("inf") == std::string::npos);

  // Asked for, the last good weights are written beside --save: here the epoch before the bad one is the start,
  // the weights of `good`.
  const std::string kept = dir.file("kept.safetensors");
  const auto saving =
      run_command(train + " --epochs 2 --lr 1e6 --init-from " + good + " --save " + kept + " --save-on-divergence");
  INFO(saving.out);
  CHECK(saving.exit_code == 3);
  CHECK(saving.out.find("; the weights after epoch 0 are in " + kept + ".diverged-at-epoch-1;") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(kept));
  const auto start = SafetensorsFile::read(good), last_good = SafetensorsFile::read(kept + ".diverged-at-epoch-1");
  CHECK(last_good.metadata().at("diverged_at_epoch") == "1");
  CHECK(last_good.metadata().at("epochs_trained") == "0");
  REQUIRE(last_good.tensors().size() == start.tensors().size());
  for (const auto& t : start.tensors()) {
    INFO(t.name);
    const auto* same = last_good.find(t.name);
    REQUIRE(same != nullptr);
    CHECK(std::equal(start.bytes(t), start.bytes(t) + (t.end - t.begin), last_good.bytes(*same)));
  }

  const auto allowed = run_command(train + " --epochs 2 --lr 1e6 --allow-nonfinite --save " + bad);
  INFO(allowed.out);
  CHECK(allowed.exit_code == 0);
  CHECK(allowed.out.find("epoch   2") != std::string::npos);
  const auto eval = run_command(cat(cli_path(), " eval --device ", device, " --data ", mnist_dir(), " --load ", bad));
  INFO(eval.out);
  CHECK(eval.exit_code == 1);
  CHECK(eval.out.find("nanotrain: --load: " + bad + " holds a diverged model (") != std::string::npos);
  CHECK(std::count(eval.out.begin(), eval.out.end(), '\n') == 1);
}

namespace {
// Every tensor of two checkpoints, byte for byte.
void check_same_tensors(const std::string& a_path, const std::string& b_path) {
  const auto a = SafetensorsFile::read(a_path), b = SafetensorsFile::read(b_path);
  REQUIRE(a.tensors().size() == b.tensors().size());
  for (const auto& t : a.tensors()) {
    INFO(t.name);
    const auto* same = b.find(t.name);
    REQUIRE(same != nullptr);
    REQUIRE(same->end - same->begin == t.end - t.begin);
    CHECK(std::equal(a.bytes(t), a.bytes(t) + (t.end - t.begin), b.bytes(*same)));
  }
}

// The metrics lines without their timings (epoch_ms, eval_ms, samples_per_s differ run to run).
std::vector<std::string> metrics_without_timings(const std::string& path) {
  std::vector<std::string> lines;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) lines.push_back(line.substr(0, line.find(", \"epoch_ms\"")));
  return lines;
}
}  // namespace

void check_resume_is_exact(const std::string& device) {
  const TempDir dir;
  const std::string base =
      cat(cli_path(), " train --device ", device, " --data ", mnist_dir(), " --train-limit 1280 --log-level warn");
  struct Recipe {
    const char* name;
    std::string flags;
  };
  std::vector<Recipe> recipes = {
      {"sgd-momentum", " --model mlp --lr 0.05 --momentum 0.9"},
      // A small convolution, BatchNorm (running statistics) and dropout (its draw counter).
      {"adam-cosine-shift",
       " --model conv:4:3,bn,relu,maxpool:2,flatten,dropout:0.2,linear:10"
       " --optimizer adam --lr 0.002 --lr-schedule cosine --shift 2"},
      // A per-step schedule: its step count is optimizer state, restored with the rest.
      {"sgd-one-cycle", " --model mlp --lr 0.1 --momentum 0.9 --lr-schedule one-cycle --warmup 0.4"}};
  // The math mode is part of the run: the resume, given no --bf16, must go on in BF16 to end in the same bits.
  if (device == "cpu" || cuda_device().has_tf32())
    recipes.push_back({"bf16", " --model conv:4:3,bn,relu,maxpool:2,flatten,linear:10 --optimizer adam --bf16"});
  for (const auto& r : recipes) {
    INFO(r.name);
    const std::string whole = dir.file(cat(r.name, "-whole.safetensors")),
                      resumed = dir.file(cat(r.name, "-resumed.safetensors"));
    const std::string whole_metrics = dir.file(cat(r.name, "-whole.jsonl")), metrics = dir.file(cat(r.name, ".jsonl"));
    const std::string checkpoints = dir.file(r.name);
    const auto straight = run_command(base + r.flags + " --epochs 3 --save " + whole + " --metrics " + whole_metrics);
    INFO(straight.out);
    REQUIRE(straight.exit_code == 0);
    // The same run, checkpointed after every epoch; its epoch-1 checkpoint is what a run stopped there leaves.
    const auto first = run_command(base + r.flags + " --epochs 3 --checkpoint-every 1 --checkpoint-dir " + checkpoints +
                                   " --metrics " + metrics);
    INFO(first.out);
    REQUIRE(first.exit_code == 0);
    const std::string resume_point = dir.file(cat(r.name, "-epoch1.safetensors"));
    std::filesystem::copy_file(checkpoints + "/epoch-000001.safetensors", resume_point);
    // Resumed with no flags but where to write: the rest comes from the checkpoint. The metrics file keeps epoch 1
    // and gets epochs 2 and 3 again.
    const auto resume =
        run_command(cat(cli_path(), " train --device ", device, " --data ", mnist_dir(), " --log-level warn --resume ",
                        resume_point, " --epochs 3 --save ", resumed, " --metrics ", metrics));
    INFO(resume.out);
    REQUIRE(resume.exit_code == 0);
    CHECK(resume.out.find("epoch   1 |") == std::string::npos);
    CHECK(resume.out.find("epoch   2 |") != std::string::npos);
    check_same_tensors(whole, resumed);
    CHECK(metrics_without_timings(metrics) == metrics_without_timings(whole_metrics));
  }
  // --keep: the newest K.
  const auto kept =
      run_command(base + " --epochs 3 --checkpoint-every 1 --keep 2 --checkpoint-dir " + dir.file("kept"));
  REQUIRE(kept.exit_code == 0);
  CHECK_FALSE(std::filesystem::exists(dir.file("kept/epoch-000001.safetensors")));
  CHECK(std::filesystem::exists(dir.file("kept/epoch-000002.safetensors")));
  CHECK(std::filesystem::exists(dir.file("kept/epoch-000003.safetensors")));
  // A resume that changes what the run is: refused, naming the flag and both values.
  const std::string point = dir.file("sgd-momentum-epoch1.safetensors");
  struct Change {
    const char* flags;
    const char* says;
  };
  for (const Change c : {Change{" --batch 32", "--batch 64, this command gives 32"},
                         Change{" --model linear:10", "--model mlp, this command gives linear:10"},
                         Change{" --optimizer adam", "--optimizer sgd, this command gives adam"},
                         Change{" --bf16", "no --bf16, this command gives --bf16"}}) {
    const auto r =
        run_command(cat(cli_path(), " train --device ", device, " --data ", mnist_dir(), " --resume ", point, c.flags));
    INFO(r.out);
    CHECK(r.exit_code == 2);
    CHECK(r.out.find(c.says) != std::string::npos);
  }
}

std::vector<kernels::Math> math_modes() {
  if (cuda_device().has_tf32()) return {kernels::Math::fp32, kernels::Math::tf32, kernels::Math::bf16};
  WARN("TF32 and BF16 not checked: " << cuda_device().name << " runs " << cuda_device().code_path());
  return {kernels::Math::fp32};
}

std::string mnist_dir() {
  if (const char* env = std::getenv("NT_DATA_DIR"); env && *env) return env;
  return NT_TEST_DATA_DIR;
}

// $NT_CLI_PATH names the binary where the build was moved (a packed build run on another machine: scripts/gpu-check).
std::string cli_path() {
  if (const char* env = std::getenv("NT_CLI_PATH"); env && *env) return env;
  return NT_CLI_PATH;
}

#if defined(__SANITIZE_ADDRESS__)
#define NT_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NT_TEST_ASAN 1
#endif
#endif

std::string with_memory_limit(int mib, const std::string& command) {
#ifdef NT_TEST_ASAN
  return cat("ASAN_OPTIONS=\"$ASAN_OPTIONS:allocator_may_return_null=1:max_allocation_size_mb=", mib, "\" ", command);
#else
  return cat("ulimit -v ", int64_t(mib) * 1024, " && ", command);
#endif
}

std::string without_allocator_notes(const std::string& out) {
  std::istringstream in(out);
  std::string kept;
  for (std::string line; std::getline(in, line);)
    if (!(line.starts_with("==") && line.find("WARNING: AddressSanitizer failed to allocate") != std::string::npos))
      kept += line + "\n";
  return kept;
}

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "nanotrain_test_XXXXXX").string();
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  path = pattern;
}
TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}
std::string TempDir::file(const std::string& name) const { return (std::filesystem::path(path) / name).string(); }

GatheredEpoch gather_epoch(const Context& ctx, data::DeviceBatcher& batcher, const data::Dataset& d, int epoch,
                           int batch) {
  const auto& exec = ctx.exec();
  batcher.begin_epoch(exec, epoch);
  const int64_t D = d.image_size();
  Tensor x = Tensor::empty(Shape{batch, D}, DType::f32, exec.backend);
  Tensor y = Tensor::empty(Shape{batch}, DType::i32, exec.backend);
  GatheredEpoch g;
  for (int64_t first = 0; first < d.count; first += batch) {
    const int rows = static_cast<int>(std::min<int64_t>(batch, d.count - first));
    std::fill_n(x.f32(), x.numel(), kPoison);
    batcher.gather(exec, first, rows, x, y, false);
    const auto xs = x.to_host<float>(exec);
    const auto ys = y.to_host<int32_t>(exec);
    g.x.insert(g.x.end(), xs.begin(), xs.begin() + rows * D);
    g.y.insert(g.y.end(), ys.begin(), ys.begin() + rows);
  }
  return g;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> temporaries_of(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const std::string stem = target.filename().string() + ".tmp";
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(target.has_parent_path() ? target.parent_path() : fs::path(".")))
    if (entry.path().filename().string().starts_with(stem)) found.push_back(entry.path().string());
  return found;
}

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

std::vector<kernels::PixelShift> matching_shifts(const uint8_t* image, int C, int H, int W, int k, float mean,
                                                 float std_dev, const float* got) {
  auto norm = [&](uint8_t px) { return (float(px) / 255.0f - mean) / std_dev; };
  std::vector<kernels::PixelShift> found;
  for (int dy = -k; dy <= k; ++dy)
    for (int dx = -k; dx <= k; ++dx) {
      bool same = true;
      for (int c = 0; c < C && same; ++c)
        for (int i = 0; i < H && same; ++i)
          for (int j = 0; j < W && same; ++j) {
            const int si = i - dy, sj = j - dx;
            const bool inside = si >= 0 && si < H && sj >= 0 && sj < W;
            const float want = norm(inside ? image[(size_t(c) * H + si) * W + sj] : uint8_t{0});
            same = std::memcmp(&want, &got[(size_t(c) * H + i) * W + j], sizeof(float)) == 0;
          }
      if (same) found.push_back({dy, dx});
    }
  return found;
}

int64_t near_ties(const std::vector<float>& logits, int B, int C, double gap) {
  int64_t n = 0;
  for (int b = 0; b < B; ++b) {
    std::vector<float> row(logits.begin() + int64_t(b) * C, logits.begin() + int64_t(b + 1) * C);
    std::sort(row.begin(), row.end(), std::greater<>());
    n += C > 1 && double(row[0]) - double(row[1]) <= gap && row[0] != row[1];  // exact ties: both take the lowest index
  }
  return n;
}

WeightsDifference compare_weights(const std::string& a, const std::string& b) {
  const auto fa = SafetensorsFile::read(a), fb = SafetensorsFile::read(b);
  WeightsDifference d;
  REQUIRE(fa.tensors().size() == fb.tensors().size());
  for (const auto& t : fa.tensors()) {
    if (t.dtype != "F32") continue;
    const std::vector<float> x = fa.floats(t.name), y = fb.floats(t.name);
    REQUIRE(x.size() == y.size());
    double norm = 0, diff = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      norm += double(y[i]) * double(y[i]);
      diff += (double(x[i]) - double(y[i])) * (double(x[i]) - double(y[i]));
    }
    d.same_bits = d.same_bits && same_bits(x, y);
    const double relative = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
    if (relative > d.max_relative) d.max_relative = relative, d.worst = t.name;
  }
  return d;
}

std::string kill_a_rank_mid_run(const std::string& command, const std::string& metrics, const TempDir& dir) {
  const std::string log = dir.file("killed-run.log"), script = dir.file("kill-a-rank.sh");
  std::ofstream(script) << command << " > " << log << " 2>&1 &\n"
                        << "launcher=$!\n"
                        << "for i in $(seq 1200); do [ -s " << metrics << " ] && break; sleep 0.05; done\n"
                        << "ranks=$(pgrep -P $launcher -x nanotrain)\n"
                        << "echo ranks: $ranks\n"
                        << "kill -KILL $(echo $ranks | tr ' ' '\\n' | tail -n 1)\n"
                        << "wait $launcher; echo launcher exit $?\n"
                        // The launcher stops the other ranks as it ends; give them time to go.
                        << "for i in $(seq 300); do alive=\n"
                        << "  for r in $ranks; do kill -0 $r 2>/dev/null && alive=\"$alive $r\"; done\n"
                        << "  [ -z \"$alive\" ] && break; sleep 0.1\n"
                        << "done\n"
                        << "[ -n \"$alive\" ] && echo left running:$alive; true\n";
  const CommandResult r = run_command("bash " + script);
  REQUIRE(r.exit_code == 0);
  return r.out + read_file(log);
}

void check_killed_run(const std::string& report) {
  const size_t at = report.find("ranks: ");
  REQUIRE(at != std::string::npos);
  const std::string line = report.substr(at, report.find('\n', at) - at);
  CHECK(std::count(line.begin(), line.end(), ' ') == 2);  // two ranks were found
  CHECK(report.find("launcher exit 0") == std::string::npos);
  CHECK(report.find("launcher exit ") != std::string::npos);
  CHECK(report.find("left running") == std::string::npos);
}

std::string mpirun(int ranks) {
  // As root (CI, containers) Open MPI wants to be told; --oversubscribe lets 2 ranks run on 1 core.
  return cat("mpirun --allow-run-as-root --oversubscribe -np ", ranks, " ");
}

}  // namespace nt::test
