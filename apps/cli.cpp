#include "apps/cli.h"

#include <cstdio>
#include <exception>
#include <new>
#include <vector>

#include "apps/command.h"

namespace nt::app {

namespace {
const char* active_command(const std::vector<Command>& commands) {
  for (const auto& command : commands)
    if (command.app->parsed()) return command.app->get_name().c_str();
  return "nanotrain";
}
}  // namespace

int run_cli(int argc, char** argv) {
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
      if (command.app->parsed()) return command.run();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "nanotrain: %s\n", e.what());
    return 2;
  } catch (const DivergedError& e) {
    std::fprintf(stderr, "nanotrain: %s\n", e.what());
    return 3;
  } catch (const std::bad_alloc&) {  // the places that know the file or flag say so (nt::OutOfMemory); the rest
    std::fprintf(stderr, "nanotrain: %s: out of host memory (std::bad_alloc)\n", active_command(commands));
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nanotrain: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace nt::app
