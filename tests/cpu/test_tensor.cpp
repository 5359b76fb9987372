// Tensor views: which ones share memory (the input-gradient GEMM of Linear overlaps its weight gradient
// only where its output shares no byte with what that GEMM touches, layers/linear.cpp).
#include "tests/support/catch2.h"

#include <vector>

#include "engine/tensor.h"

namespace {

using nt::Backend;
using nt::DType;
using nt::Shape;
using nt::Tensor;

TEST_CASE("shares_memory: overlapping views do, neighbours and empty tensors do not", "[cpu][tensor]") {
  std::vector<float> buffer(100);
  const Tensor whole = Tensor::view(buffer.data(), Shape{10, 10}, DType::f32, Backend::cpu);
  const Tensor first = Tensor::view(buffer.data(), Shape{5, 10}, DType::f32, Backend::cpu);
  const Tensor second = Tensor::view(buffer.data() + 50, Shape{5, 10}, DType::f32, Backend::cpu);
  const Tensor straddling = Tensor::view(buffer.data() + 49, Shape{2}, DType::f32, Backend::cpu);
  REQUIRE(whole.shares_memory(first));
  REQUIRE(second.shares_memory(whole));
  REQUIRE_FALSE(first.shares_memory(second));  // adjacent: the last byte of one ends where the other begins
  REQUIRE_FALSE(second.shares_memory(first));
  REQUIRE(straddling.shares_memory(first));
  REQUIRE(straddling.shares_memory(second));
  REQUIRE_FALSE(Tensor().shares_memory(whole));
  REQUIRE_FALSE(whole.rows(0).shares_memory(whole));  // no bytes: nothing shared
}

}  // namespace
