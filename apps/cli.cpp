#include "apps/cli.h"

#include <chrono>

#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "apps/command.h"
#include "apps/ranks.h"

namespace nt::app {

namespace {
std::vector<std::string> g_command_line;
const std::chrono::steady_clock::time_point g_process_start = std::chrono::steady_clock::now();

const char* active_command(const std::vector<Command>& commands) {
  for (const auto& command : commands)
    if (command.app->parsed()) return command.app->get_name().c_str();
  return "nanotrain";
}
// One line on stderr, with the rank in a data-parallel run; under mpirun every rank is then ended.
int fail(int exit_code, const std::string& message) {
  std::fprintf(stderr, "nanotrain: %s%s\n", rank_prefix().c_str(), message.c_str());
  return end_ranks_after_error(exit_code);
}
}  // namespace

const std::vector<std::string>& command_line() { return g_command_line; }

double seconds_since_process_start() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_process_start).count();
}

int run_cli(int argc, char** argv) {
  g_command_line.assign(argv, argv + argc);
  CLI::App app{"nanotrain: train small MLPs and CNNs with hand-written CUDA kernels and a CPU reference backend"};
  app.set_version_flag("--version", std::string("nanotrain ") + NT_VERSION);
  app.require_subcommand(1);

  const std::vector<Command> commands{register_train(app), register_devices(app), register_eval(app),
                                      register_profile(app), register_predict(app)};

  // CLI11 says only "A subcommand is required" for a word it does not know: name it.
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const auto& command : commands) known |= command.app->get_name() == argv[1];
    if (!known) {
      std::fprintf(stderr, "nanotrain: unknown command '%s' (commands: train, eval, predict, profile, devices)\n",
                   argv[1]);
      return 2;
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "nanotrain: %s\n", e.what());
    return 2;
  }

  try {
    for (const auto& command : commands)
      if (command.app->parsed()) {
        const int code = command.run();
        finish_ranks();
        return code;
      }
  } catch (const UsageError& e) {
    return fail(2, e.what());
  } catch (const DivergedError& e) {
    return fail(3, e.what());
  } catch (const std::bad_alloc&) {  // the places that know the file or flag say so (nt::OutOfMemory); the rest
    return fail(1, cat(active_command(commands), ": out of host memory (std::bad_alloc)"));
  } catch (const std::exception& e) {
    return fail(1, e.what());
  }
  return 0;
}

}  // namespace nt::app
