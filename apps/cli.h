// The nanotrain command line: subcommands, flag parsing and validation, and the exit-code policy.
//
// Exit codes: 0 success; 1 a runtime error (a file, a device, a failing kernel); 2 a usage error
// (a bad flag or value). Every error is one line on stderr that names the flag or file.
#pragma once

namespace nt::app {

int run_cli(int argc, char** argv);

}  // namespace nt::app
