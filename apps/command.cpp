#include "apps/command.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "engine/divergence.h"

namespace nt::app {

void add_common_options(CLI::App& cmd, CommonOptions& o) {
  cmd.add_option("--device", o.device, "Where to run: auto (GPU if usable, else CPU), cpu or cuda")
      ->capture_default_str();
  cmd.add_option("--threads", o.threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd.add_option("--log-level", o.log_level, "trace, debug, info, warn, error or off")->capture_default_str();
  cmd.add_flag("--debug-sync", o.debug_sync, "Synchronize and check after every kernel (slow; pins faults)");
  cmd.add_flag("--no-pdl", o.no_pdl,
               "GPU: start each kernel only when its predecessor has finished (no programmatic dependent launch)");
  cmd.add_flag("--no-fused-head", o.no_fused_head,
               "Run the last Linear and the softmax cross-entropy as separate ops instead of one classifier head");
  cmd.add_flag("--tf32", o.tf32,
               "Convolutions round their operands to TF32 (GPU: tensor cores; CPU: the same rounding, no faster), "
               "sums in fp32 (PyTorch's default for cuDNN convolutions); off: fp32 throughout");
  cmd.add_flag("--bf16", o.bf16,
               "Mixed precision as PyTorch's autocast to bfloat16: convolution and Linear operands rounded to BF16 "
               "(GPU: tensor cores; CPU: the same rounding, no faster), sums, weights, optimizer, BatchNorm and loss "
               "in fp32");
}

CLI::Validator unsigned_64_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec == std::errc{} && end == text.data() + text.size()) return "";
        return "must be a whole number from 0 to 18446744073709551615, got '" + text + "'";
      },
      "UINT64");
}

CLI::Validator non_empty_path() {
  return CLI::Validator([](std::string& text) -> std::string { return text.empty() ? "must not be empty" : ""; },
                        "PATH");
}

void validate_common(const CommonOptions& o) {
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda")
    throw UsageError(cat("--device: unknown device '", o.device, "' (expected auto, cpu or cuda)"));
  if (o.threads < 0 || o.threads > 1024) throw UsageError(cat("--threads: must be in [0, 1024], got ", o.threads));
  if (o.tf32 && o.bf16)
    throw UsageError("--bf16 and --tf32 are two math modes: give one (--bf16 also covers the convolutions)");
  if (spdlog::level::from_str(o.log_level) == spdlog::level::off && o.log_level != "off")
    throw UsageError(cat("--log-level: unknown level '", o.log_level, "' (trace, debug, info, warn, error, off)"));
}

void setup_logging(const CommonOptions& o) {
  auto logger = spdlog::stderr_color_mt("nanotrain");
  logger->set_pattern("[%^%l%$] %v");
  logger->set_level(spdlog::level::from_str(o.log_level));
  spdlog::set_default_logger(logger);
}

namespace {
namespace fs = std::filesystem;

// The check every output gets: the folder takes a new file. The probe is what an atomic write does first.
void probe_folder(const char* flag, const std::string& shown, const fs::path& folder) {
  std::string probe = (folder / ".nanotrain-probe.XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0)
    throw UsageError(cat(flag, ": cannot write '", shown, "': folder '", folder.string(),
                         "' takes no new file: ", std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
}
}  // namespace

void check_output_folder(const char* flag, const std::string& folder) {
  std::error_code ec;
  if (fs::exists(folder, ec) && !fs::is_directory(folder, ec))
    throw UsageError(cat(flag, ": '", folder, "' is a file, not a folder"));
  // Made here or, at the same moment, by another process (a data-parallel rank): either way it must be there now.
  if (!fs::is_directory(folder, ec) && !fs::create_directories(folder, ec) && !fs::is_directory(folder, ec))
    throw UsageError(cat(flag, ": cannot make the folder '", folder, "': ", ec.message()));
  probe_folder(flag, folder, folder);
}

void check_outputs(const std::vector<OutputPath>& outputs) {
  std::vector<std::pair<fs::path, const char*>> seen;
  for (const OutputPath& o : outputs) {
    if (o.path.empty()) continue;
    const std::string shown = o.written_as.empty() ? o.path : o.written_as;
    std::error_code ec;
    if (fs::is_directory(o.path, ec)) throw UsageError(cat(o.flag, ": '", o.path, "' is a folder, not a file"));
    const fs::path folder = fs::path(o.path).has_parent_path() ? fs::path(o.path).parent_path() : fs::path(".");
    if (!fs::is_directory(folder, ec))
      throw UsageError(cat(o.flag, ": cannot write '", shown, "': folder '", folder.string(), "' does not exist"));
    probe_folder(o.flag, shown, folder);
    const fs::path canonical = fs::weakly_canonical(o.path, ec);
    for (const auto& [other, flag] : seen)
      if (other == canonical) throw UsageError(cat(o.flag, " and ", flag, " name the same file '", o.path, "'"));
    seen.emplace_back(canonical, o.flag);
  }
}

void require_finite_checkpoint(const Context& ctx, const Model& model, const char* flag, const std::string& path) {
  if (const auto bad = first_nonfinite_tensor(ctx, model))
    throw Error(cat(flag, ": ", path, " holds a diverged model (", bad->describe(), ")"));
}

void log_device(const Context& ctx) {
  if (ctx.on_cuda()) {
    spdlog::info("device: {}, {}", ctx.describe(), ctx.device_info().code_path());
  } else if (ctx.gpu_unusable()) {
    spdlog::warn("GPU not used, running on the CPU: {}", ctx.why_cpu());
    spdlog::info("device: {}", ctx.describe());
  } else {
    spdlog::info("device: {}: {}", ctx.describe(), ctx.why_cpu());
  }
}

}  // namespace nt::app
