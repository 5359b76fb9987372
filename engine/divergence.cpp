#include "engine/divergence.h"

#include <vector>

#include "kernels/nonfinite.h"
#include "kernels/runtime.h"

namespace nt {

std::string NonfiniteTensor::describe() const {
  return cat(name, ": ", count, " of ", size, " values are NaN or infinite");
}

std::optional<NonfiniteTensor> first_nonfinite_tensor(const Context& ctx, const Model& model) {
  const auto& exec = ctx.exec();
  const ParamStore& store = model.params();
  if (store.dtype() != DType::f32) return std::nullopt;  // f64 models serve gradient checks only
  struct Candidate {
    std::string name;
    const Tensor* tensor;
  };
  std::vector<Candidate> candidates;
  for (const Param& p : store.params()) candidates.push_back({p.name, &p.value});
  for (const Param& p : store.params()) candidates.push_back({p.name + " (gradient)", &p.grad});
  for (const Buffer& b : store.buffers())
    if (b.value.dtype() == DType::f32) candidates.push_back({b.name, &b.value});

  const Tensor count = Tensor::empty(Shape{1}, DType::i64, ctx.backend());
  for (const Candidate& c : candidates) {
    kernels::fill_zero(exec, count.data<int64_t>(), sizeof(int64_t));
    kernels::count_nonfinite(exec, {.x = c.tensor->f32(), .n = c.tensor->numel(), .count = count.data<int64_t>()});
    const int64_t bad = count.to_host<int64_t>(exec).front();
    if (bad > 0) return NonfiniteTensor{c.name, bad, c.tensor->numel()};
  }
  return std::nullopt;
}

}  // namespace nt
