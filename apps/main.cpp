#include "apps/cli.h"

int main(int argc, char** argv) { return nt::app::run_cli(argc, argv); }
