// Arena: the static memory plan. Everything a compiled model touches during a step is requested
// while planning, then taken from ONE allocation; the step itself never allocates.
//
//   ArenaPlan plan;
//   plan.request(&layer_output, Shape{64, 320}, DType::f32);   // binds when the plan commits
//   Arena arena = plan.commit(backend);                          // one device_alloc, tensors bound
//
// Every request starts on a 64-byte boundary (16 floats), so vector loads stay aligned, and the
// whole block starts zeroed so that padding never holds garbage.
#pragma once

#include <vector>

#include "engine/tensor.h"

namespace nt {

class Arena {
 public:
  Arena() = default;
  Arena(Arena&&) noexcept = default;
  Arena& operator=(Arena&&) noexcept = default;

  size_t bytes() const { return bytes_; }
  bool empty() const { return !block_.defined(); }

 private:
  friend class ArenaPlan;
  Tensor block_;  // the one owning allocation (u8)
  size_t bytes_ = 0;
};

class ArenaPlan {
 public:
  static constexpr size_t kAlignment = 64;

  // Reserve space for *target; the pointer must stay valid until commit().
  void request(Tensor* target, const Shape& shape, DType dtype);
  size_t bytes() const { return offset_; }
  Arena commit(const kernels::Exec& exec);

 private:
  struct Request {
    Tensor* target;
    Shape shape;
    DType dtype;
    size_t offset;
  };
  std::vector<Request> requests_;
  size_t offset_ = 0;
};

}  // namespace nt
