// The mains' side of catch2.h: the session, with one fixed random seed unless --rng-seed gives another, so that
// a test's random inputs are the same in every run. (Catch2 v2 defaulted to seed 0, which test_support.cpp maps
// to its own constant; v3 draws a new seed each run.)
#pragma once

#define CATCH_CONFIG_RUNNER
#include "catch2.h"

#if NT_CATCH2_MAJOR >= 3
#include <catch2/catch_session.hpp>
#endif

#include <string_view>

namespace nt::test {

inline constexpr uint32_t kDefaultRandomSeed = 20261121u;

inline int run_catch_session(int argc, char** argv) {
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  bool seed_given = false;
  for (int i = 1; i < argc; ++i) seed_given |= std::string_view(argv[i]).starts_with("--rng-seed");
  if (!seed_given) session.configData().rngSeed = kDefaultRandomSeed;
  return session.run();
}

}  // namespace nt::test
