#include "engine/params.h"

#include "kernels/runtime.h"

namespace nt {

namespace {
constexpr size_t kFloatsAlignment = ArenaPlan::kAlignment / sizeof(float);
size_t aligned(size_t n) { return (n + kFloatsAlignment - 1) / kFloatsAlignment * kFloatsAlignment; }
}  // namespace

void ParamStore::build(const std::vector<Entry>& entries, const kernels::Exec& exec, uint64_t seed, DType dtype) {
  NT_CHECK(dtype == DType::f32 || dtype == DType::f64, "parameters are f32 or f64");
  dtype_ = dtype;
  std::vector<size_t> offsets;
  total_ = 0;
  for (const auto& e : entries) {
    offsets.push_back(total_);
    total_ += aligned(static_cast<size_t>(e.spec.shape.numel()));
  }

  ArenaPlan plan;
  plan.request(&values_, Shape{static_cast<int64_t>(total_)}, dtype);
  plan.request(&grads_, Shape{static_cast<int64_t>(total_)}, dtype);
  arena_ = plan.commit(exec);
  auto* values = static_cast<uint8_t*>(values_.raw());
  auto* grads = static_cast<uint8_t*>(grads_.raw());
  const size_t element = dtype_size(dtype);

  std::vector<float> host(total_, 0.f);
  Rng rng(seed);
  params_.clear();
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    auto n = static_cast<size_t>(e.spec.shape.numel());
    e.spec.init(std::span<float>(host.data() + offsets[i], n), rng);
    params_.push_back({e.full_name, Tensor::view(values + offsets[i] * element, e.spec.shape, dtype, exec.backend),
                       Tensor::view(grads + offsets[i] * element, e.spec.shape, dtype, exec.backend)});
  }
  if (dtype == DType::f64) {  // the same initial values, widened
    std::vector<double> wide(host.begin(), host.end());
    values_.copy_from_host(exec, wide.data(), total_ * sizeof(double));
  } else {
    values_.copy_from_host(exec, host.data(), total_ * sizeof(float));
  }
}

void ParamStore::build_buffers(const std::vector<BufferEntry>& entries, const kernels::Exec& exec) {
  buffers_.assign(entries.size(), Buffer{});
  ArenaPlan plan;
  for (size_t i = 0; i < entries.size(); ++i) {
    buffers_[i].name = entries[i].full_name;
    plan.request(&buffers_[i].value, entries[i].spec.shape, entries[i].spec.integer ? DType::i64 : dtype_);
  }
  buffer_arena_ = plan.commit(exec);
  for (size_t i = 0; i < entries.size(); ++i) {
    const Tensor& t = buffers_[i].value;
    const auto n = static_cast<size_t>(t.numel());
    const double fill = entries[i].spec.fill;
    if (t.dtype() == DType::i64) {
      t.copy_from_host(exec, std::vector<int64_t>(n, static_cast<int64_t>(fill)).data(), t.bytes());
    } else if (t.dtype() == DType::f64) {
      t.copy_from_host(exec, std::vector<double>(n, fill).data(), t.bytes());
    } else {
      t.copy_from_host(exec, std::vector<float>(n, static_cast<float>(fill)).data(), t.bytes());
    }
  }
}

const Param& ParamStore::find(const std::string& full_name) const {
  for (const auto& p : params_)
    if (p.name == full_name) return p;
  throw Error(cat("no parameter named '", full_name, "' in this model"));
}

int64_t ParamStore::count() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.value.numel();
  return n;
}

}  // namespace nt
