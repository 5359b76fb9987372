// Tensor: a typed, shaped view of memory on one backend, optionally owning that memory.
//
// Most tensors of a compiled model are views into its arena (engine/arena.h); owning tensors
// (Tensor::empty) serve datasets and tests. Layout is always dense row-major; a view of the first
// n rows (`rows(n)`) and a reshape (`reshaped`) are the only derived views the engine needs.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/exec.h"

namespace nt {

using kernels::Backend;

// bf16: BF16 bits (uint16_t), as the GPU kernels store activations they multiply in BF16 (kernels/conv.h, 'Staged
// input').
enum class DType { f32, f64, i32, i64, u8, bf16 };
size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* backend_name(Backend b);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<uint16_t>() {
  return DType::bf16;
}

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int i) const { return dims_.at(static_cast<size_t>(i)); }
  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }
  Shape prepend(int64_t dim) const;  // (d0, ...) -> (dim, d0, ...)
  Shape drop_front() const;          // (d0, d1, ...) -> (d1, ...)
  std::string str() const;           // "(64, 784)"
  bool operator==(const Shape& o) const = default;

 private:
  std::vector<int64_t> dims_;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, Backend backend);  // one owning allocation
  static Tensor view(void* data, const Shape& shape, DType dtype, Backend backend);

  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Backend backend() const { return backend_; }
  int64_t numel() const { return shape_.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr; }
  void* raw() const { return data_; }

  template <class T>
  T* data() const {
    NT_CHECK(dtype_ == dtype_of<T>(), "tensor holds ", dtype_name(dtype_), ", asked for ", dtype_name(dtype_of<T>()));
    return static_cast<T*>(data_);
  }
  float* f32() const { return data<float>(); }
  int32_t* i32() const { return data<int32_t>(); }
  uint8_t* u8() const { return data<uint8_t>(); }

  // Whether the two tensors' bytes overlap (views of one buffer may).
  bool shares_memory(const Tensor& other) const {
    const auto a = reinterpret_cast<uintptr_t>(data_), b = reinterpret_cast<uintptr_t>(other.data_);
    return a && b && a < b + other.bytes() && b < a + bytes();
  }

  Tensor rows(int64_t n) const;               // the first n entries along dimension 0
  Tensor reshaped(const Shape& shape) const;  // same elements, another shape

  // Host round trips (they synchronize: for set-up, evaluation read-back and tests, never in a step).
  void copy_from_host(const kernels::Exec& exec, const void* src, size_t bytes) const;
  template <class T>
  std::vector<T> to_host(const kernels::Exec& exec) const {
    (void)data<T>();  // checks the element type
    std::vector<T> out(static_cast<size_t>(numel()));
    copy_to_host_raw(exec, out.data(), bytes());
    return out;
  }

 private:
  void copy_to_host_raw(const kernels::Exec& exec, void* dst, size_t bytes) const;

  std::shared_ptr<void> owner_;  // set for owning tensors; views leave it empty
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::f32;
  Backend backend_ = Backend::cpu;
};

}  // namespace nt
