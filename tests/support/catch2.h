// Catch2 in both of its generations, behind one spelling. The distributions ship different ones: v2, a single
// header (Debian 12, Ubuntu 22.04), and v3, a compiled library with a header per part (Debian 13, Ubuntu 24.04).
// tests/CMakeLists.txt says which it found (NT_CATCH2_MAJOR). Every test includes this, never <catch2/...>, and
// spells what the two generations name differently through nt::test:
//   Contains("text")         a string matcher (v2 Catch::Matchers::Contains, v3 Catch::Matchers::ContainsSubstring)
//   Approx(x)                (v2 a global name, v3 Catch::Approx)
//   TextMatcher              the base class of a hand-written string matcher
//   random_seed()            the run's --rng-seed (catch2_main.h fixes it when none is given)
//   kSkipExitCode            what a test executable returns when it skips everything (no GPU): v3 reserves 4 for
//                            that; v2 would read 4 as four failures, hence 77 there. tests/CMakeLists.txt agrees
// The two mains run the session through catch2_main.h.
#pragma once

#include <cstdint>
#include <string>

#if NT_CATCH2_MAJOR >= 3
#include <catch2/catch_approx.hpp>
#include <catch2/catch_get_random_seed.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

namespace nt::test {
using Catch::Approx;
using TextMatcher = Catch::Matchers::MatcherBase<std::string>;
inline auto Contains(const std::string& text) { return Catch::Matchers::ContainsSubstring(text); }
inline uint32_t random_seed() { return Catch::getSeed(); }
inline constexpr int kSkipExitCode = 4;
}  // namespace nt::test

#else
#include <catch2/catch.hpp>

namespace nt::test {
using Catch::Detail::Approx;
using TextMatcher = Catch::MatcherBase<std::string>;
inline auto Contains(const std::string& text) { return Catch::Matchers::Contains(text); }
inline uint32_t random_seed() { return Catch::rngSeed(); }
inline constexpr int kSkipExitCode = 77;
}  // namespace nt::test
#endif
