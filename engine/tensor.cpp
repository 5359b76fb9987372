#include "engine/tensor.h"

#include <sstream>

#include "kernels/runtime.h"

namespace nt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
    case DType::bf16:
      return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::bf16:
      return "bf16";
  }
  return "?";
}

const char* backend_name(Backend b) { return b == Backend::cuda ? "cuda" : "cpu"; }

int64_t Shape::numel() const {
  int64_t n = 1;
  for (auto d : dims_) n *= d;
  return n;
}

Shape Shape::prepend(int64_t dim) const {
  std::vector<int64_t> d{dim};
  d.insert(d.end(), dims_.begin(), dims_.end());
  return Shape(std::move(d));
}

Shape Shape::drop_front() const {
  NT_CHECK(!dims_.empty(), "drop_front of a scalar shape");
  return Shape(std::vector<int64_t>(dims_.begin() + 1, dims_.end()));
}

std::string Shape::str() const {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < dims_.size(); ++i) s << (i ? ", " : "") << dims_[i];
  s << ")";
  return s.str();
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Backend backend) {
  Tensor t;
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  void* p = kernels::device_alloc(backend, bytes);
  t.owner_ = std::shared_ptr<void>(p, [backend](void* q) { kernels::device_free(backend, q); });
  t.data_ = p;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.backend_ = backend;
  return t;
}

Tensor Tensor::view(void* data, const Shape& shape, DType dtype, Backend backend) {
  Tensor t;
  t.data_ = data;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.backend_ = backend;
  return t;
}

Tensor Tensor::rows(int64_t n) const {
  NT_CHECK(shape_.rank() >= 1 && n >= 0 && n <= shape_[0], "rows(", n, ") of ", shape_.str());
  Tensor t = *this;
  std::vector<int64_t> d = shape_.dims();
  d[0] = n;
  t.shape_ = Shape(std::move(d));
  return t;
}

Tensor Tensor::reshaped(const Shape& shape) const {
  NT_CHECK(shape.numel() == numel(), "reshape ", shape_.str(), " to ", shape.str());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

void Tensor::copy_from_host(const kernels::Exec& exec, const void* src, size_t n) const {
  NT_CHECK(n <= bytes(), "copy of ", n, " bytes into a tensor of ", bytes());
  kernels::copy_host_to_device(exec, data_, src, n);
  kernels::synchronize(exec);
}

void Tensor::copy_to_host_raw(const kernels::Exec& exec, void* dst, size_t n) const {
  kernels::copy_device_to_host(exec, dst, data_, n);
  kernels::synchronize(exec);
}

}  // namespace nt
