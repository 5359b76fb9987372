#include "engine/params.h"

#include "kernels/runtime.h"

namespace nt {

namespace {
constexpr size_t kFloatsAlignment = ArenaPlan::kAlignment / sizeof(float);
size_t aligned(size_t n) { return (n + kFloatsAlignment - 1) / kFloatsAlignment * kFloatsAlignment; }
}  // namespace

void ParamStore::build(const std::vector<Entry>& entries, const kernels::Exec& exec, uint64_t seed) {
  std::vector<size_t> offsets;
  total_ = 0;
  for (const auto& e : entries) {
    offsets.push_back(total_);
    total_ += aligned(static_cast<size_t>(e.spec.shape.numel()));
  }

  ArenaPlan plan;
  plan.request(&values_, Shape{static_cast<int64_t>(total_)}, DType::f32);
  plan.request(&grads_, Shape{static_cast<int64_t>(total_)}, DType::f32);
  arena_ = plan.commit(exec);

  std::vector<float> host(total_, 0.f);
  Rng rng(seed);
  params_.clear();
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    auto n = static_cast<size_t>(e.spec.shape.numel());
    e.spec.init(std::span<float>(host.data() + offsets[i], n), rng);
    params_.push_back({e.full_name, Tensor::view(values_.f32() + offsets[i], e.spec.shape, DType::f32, exec.backend),
                       Tensor::view(grads_.f32() + offsets[i], e.spec.shape, DType::f32, exec.backend)});
  }
  values_.copy_from_host(exec, host.data(), total_ * sizeof(float));
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

Tensor ParamStore::make_state_block(const kernels::Exec& exec, Arena& holder) const {
  Tensor block;
  ArenaPlan plan;
  plan.request(&block, Shape{static_cast<int64_t>(total_)}, DType::f32);
  holder = plan.commit(exec);
  return block;
}

}  // namespace nt
