#include "catch2_main.h"

int main(int argc, char** argv) { return nt::test::run_catch_session(argc, argv); }
