// The outputs of one run of an op, by name, for tests that run the same op on several backends or settings and
// compare whole runs (tests/cuda/test_op_table_cuda.cpp): float arrays (fp32 tensors), double arrays (the loss
// accumulators) and integer arrays (argmax, labels, mask bytes, counters, counts), each with its name, in the
// order the op's row added them.
//
//   require_same_bits(a, b)      the same names in the same order, every array the same bits (NaN payloads and
//                                the sign of zero included): what two runs that promise identical results give
//   require_written(got, want)   no poison left in `got`: no NaN in a float array where `want` (the reference run)
//                                has none there, no element of an integer array still holding its poison value
//   require_written(got)         the same without a reference: no NaN at all (a run on finite inputs)
#pragma once

#include "catch2.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nt::test {

struct OutputArray {
  enum class Type { f32, f64, ints };
  std::string name;
  Type type = Type::f32;
  std::vector<float> f32;             // Type::f32
  std::vector<double> f64;            // Type::f64
  std::vector<int64_t> ints;          // Type::ints (widened from the op's int32, uint8, uint64 or int64)
  std::optional<int64_t> int_poison;  // Type::ints: the value every element held before the run, if poisoned

  size_t size() const { return type == Type::f32 ? f32.size() : type == Type::f64 ? f64.size() : ints.size(); }
  const char* type_name() const { return type == Type::f32 ? "f32" : type == Type::f64 ? "f64" : "int"; }
};

struct Outputs {
  std::vector<OutputArray> arrays;

  Outputs& add(std::string name, std::vector<float> values) {
    OutputArray a{std::move(name), OutputArray::Type::f32, std::move(values), {}, {}, std::nullopt};
    arrays.push_back(std::move(a));
    return *this;
  }
  Outputs& add(std::string name, std::vector<double> values) {
    OutputArray a{std::move(name), OutputArray::Type::f64, {}, std::move(values), {}, std::nullopt};
    arrays.push_back(std::move(a));
    return *this;
  }
  // Integer arrays of any width; `poison`: the value each element held before the run (the op must overwrite it).
  template <class Int>
  Outputs& add_ints(std::string name, const std::vector<Int>& values, std::optional<int64_t> poison = std::nullopt) {
    OutputArray a{std::move(name), OutputArray::Type::ints, {}, {}, {}, poison};
    a.ints.reserve(values.size());
    for (Int v : values) a.ints.push_back(static_cast<int64_t>(v));
    arrays.push_back(std::move(a));
    return *this;
  }

  const OutputArray* find(std::string_view name) const {
    for (const auto& a : arrays)
      if (a.name == name) return &a;
    return nullptr;
  }
  const OutputArray& at(std::string_view name) const {
    const OutputArray* a = find(name);
    INFO("output " << std::string(name));
    REQUIRE(a != nullptr);
    return *a;
  }
  const std::vector<float>& floats(std::string_view name) const {
    const OutputArray& a = at(name);
    REQUIRE(a.type == OutputArray::Type::f32);
    return a.f32;
  }
};

namespace detail {
template <class T>
size_t first_bit_difference(const std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return i;
  return a.size();
}
}  // namespace detail

// Every array of `a` and `b`: the same name, type and size, and the same bits. A failure names the array and its
// first differing element.
inline void require_same_bits(const Outputs& a, const Outputs& b) {
  REQUIRE(a.arrays.size() == b.arrays.size());
  for (size_t k = 0; k < a.arrays.size(); ++k) {
    const OutputArray &x = a.arrays[k], &y = b.arrays[k];
    INFO("output " << x.name << " (" << x.type_name() << ", " << x.size() << " elements)");
    REQUIRE(x.name == y.name);
    REQUIRE(x.type == y.type);
    REQUIRE(x.size() == y.size());
    size_t at = x.size();
    std::ostringstream differ;
    switch (x.type) {
      case OutputArray::Type::f32:
        at = detail::first_bit_difference(x.f32, y.f32);
        if (at < x.size()) differ << x.f32[at] << " vs " << y.f32[at];
        break;
      case OutputArray::Type::f64:
        at = detail::first_bit_difference(x.f64, y.f64);
        if (at < x.size()) differ << x.f64[at] << " vs " << y.f64[at];
        break;
      case OutputArray::Type::ints:
        at = detail::first_bit_difference(x.ints, y.ints);
        if (at < x.size()) differ << x.ints[at] << " vs " << y.ints[at];
        break;
    }
    INFO("first element whose bits differ: " << at << " (" << differ.str() << ")");
    REQUIRE(at == x.size());
  }
}

// No poison left in `got`: a float array may hold a NaN only where `want`'s array of the same name does (outputs
// are poisoned with NaN before a run), an integer array with a poison value holds it nowhere. `want` must have
// every array of `got`.
namespace detail {
inline void require_written(const Outputs& got, const Outputs* want) {
  for (const OutputArray& g : got.arrays) {
    INFO("output " << g.name << " (" << g.type_name() << ", " << g.size() << " elements)");
    const OutputArray* w = want ? want->find(g.name) : nullptr;
    if (want) {
      REQUIRE(w != nullptr);
      REQUIRE(w->type == g.type);
      REQUIRE(w->size() == g.size());
    }
    size_t bad = g.size();
    if (g.type == OutputArray::Type::f32) {
      for (size_t i = 0; i < g.size() && bad == g.size(); ++i)
        if (std::isnan(g.f32[i]) && !(w && std::isnan(w->f32[i]))) bad = i;
    } else if (g.type == OutputArray::Type::f64) {
      for (size_t i = 0; i < g.size() && bad == g.size(); ++i)
        if (std::isnan(g.f64[i]) && !(w && std::isnan(w->f64[i]))) bad = i;
    } else if (g.int_poison) {
      for (size_t i = 0; i < g.size() && bad == g.size(); ++i)
        if (g.ints[i] == *g.int_poison) bad = i;
    }
    INFO("first element left as poisoned, or NaN where the reference has none: " << bad);
    REQUIRE(bad == g.size());
  }
}
}  // namespace detail

inline void require_written(const Outputs& got, const Outputs& want) { detail::require_written(got, &want); }
inline void require_written(const Outputs& got) { detail::require_written(got, nullptr); }

}  // namespace nt::test
