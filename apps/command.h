// What every subcommand shares: common flags, the usage-error type, and how a command plugs into
// the CLI. Each subcommand lives in its own apps/<name>_command.cpp and registers itself in cli.cpp.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/context.h"
#include "engine/model.h"

namespace nt::app {

// A bad flag or value: exit code 2 (runtime errors exit with 1).
struct UsageError : Error {
  using Error::Error;
};

// Training diverged (a loss that is NaN or infinite): exit code 3, so that scripts can tell it from a bad flag or
// file; nothing is saved over --save.
struct DivergedError : Error {
  using Error::Error;
};

struct CommonOptions {
  std::string device = "auto";
  int threads = 0;
  std::string log_level = "info";
  bool debug_sync = false;
  bool no_pdl = false;
  bool no_fused_head = false;
  bool tf32 = false;
  bool bf16 = false;

  kernels::Math math() const { return tf32 ? kernels::Math::tf32 : bf16 ? kernels::Math::bf16 : kernels::Math::fp32; }
  ContextOptions context() const { return {device, threads, debug_sync, !no_pdl, math()}; }
};

void add_common_options(CLI::App& cmd, CommonOptions& o);
// A whole number in [0, 2^64 - 1], as written: CLI11 would wrap "-1" and "2^64" into range silently.
CLI::Validator unsigned_64_validator();
// A path flag given with an empty value ("--save ''") would otherwise mean "not given" without a word.
CLI::Validator non_empty_path();
void validate_common(const CommonOptions& o);  // throws UsageError naming the flag
void setup_logging(const CommonOptions& o);
// A file the command will write, named by its flag: checked before any work by check_outputs.
struct OutputPath {
  const char* flag;          // "--save"
  std::string path;          // empty: the flag was not given
  std::string written_as{};  // what is written when it differs from `path`: "PREFIX.csv, .json, .trace.json"
};
// Every output given, before anything runs (an hour of training must not end in "cannot write"): the path is no
// folder, its folder exists and takes a new file (a probe file is made and removed there), and no two flags name
// the same file. Throws UsageError naming the flag.
void check_outputs(const std::vector<OutputPath>& outputs);
// A folder the command will write files into (--misclassified, --checkpoint-dir): made when missing, then checked
// to take a new file. Throws UsageError naming the flag.
void check_output_folder(const char* flag, const std::string& folder);

// The log line that says where the command runs and why; a warning first when a GPU is there but unusable.
void log_device(const Context& ctx);
// A loaded checkpoint that holds NaN or infinite values (a diverged run's) is refused: one line naming the flag, the
// file and the first bad tensor.
void require_finite_checkpoint(const Context& ctx, const Model& model, const char* flag, const std::string& path);

// The process's command line as it was given (argv), for the --gpus launcher to start its ranks with.
const std::vector<std::string>& command_line();

// Seconds since this process started: since its static initialization, which runs before main (the dynamic loader's
// few milliseconds before it are not counted; bench/time_to_accuracy times the whole process from outside).
double seconds_since_process_start();

// A registered subcommand: run() is called when the user chose it.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command register_train(CLI::App& app);
Command register_devices(CLI::App& app);
Command register_eval(CLI::App& app);
Command register_profile(CLI::App& app);
Command register_predict(CLI::App& app);

}  // namespace nt::app
