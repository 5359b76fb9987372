#include "engine/arena.h"

#include "kernels/runtime.h"

namespace nt {

void ArenaPlan::request(Tensor* target, const Shape& shape, DType dtype) {
  NT_CHECK(target != nullptr, "arena request without a target");
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  requests_.push_back({target, shape, dtype, offset_});
  offset_ += (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

Arena ArenaPlan::commit(const kernels::Exec& exec) {
  Arena arena;
  arena.bytes_ = offset_;
  arena.block_ = Tensor::empty(Shape{static_cast<int64_t>(std::max<size_t>(offset_, 1))}, DType::u8, exec.backend);
  kernels::fill_zero(exec, arena.block_.raw(), arena.bytes_);
  kernels::synchronize(exec);
  auto* base = static_cast<uint8_t*>(arena.block_.raw());
  for (const auto& r : requests_) *r.target = Tensor::view(base + r.offset, r.shape, r.dtype, exec.backend);
  requests_.clear();
  offset_ = 0;
  return arena;
}

}  // namespace nt
