// ParamStore: every parameter of a model, its gradient, and any optimizer state, laid out so that
// element i of the value block, the gradient block and each state block belong to the same parameter.
// One flat pass (one launch) can then update the whole model.
//
//   values: [ 0.weight | pad | 0.bias | pad | 2.weight | ... ]   total() elements
//   grads:  [ same offsets ]                                     total() elements
// Padding between tensors (to 16 floats) is zero in every block and stays zero under any update.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/arena.h"
#include "engine/layer.h"

namespace nt {

class ParamStore {
 public:
  struct Entry {
    ParamSpec spec;
    std::string full_name;
  };

  // Lays out, allocates (one block for values and gradients), initializes from `seed` on the host
  // in declaration order, and uploads. f32 for training; f64 (CPU only) for gradient checks.
  void build(const std::vector<Entry>& entries, const kernels::Exec& exec, uint64_t seed, DType dtype = DType::f32);
  DType dtype() const { return dtype_; }

  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  const Param& find(const std::string& full_name) const;  // throws nt::Error naming the tensor
  size_t total() const { return total_; }                 // elements per block, padding included
  int64_t count() const;                                  // parameters, padding excluded
  const Tensor& values() const { return values_; }        // (total)
  const Tensor& grads() const { return grads_; }          // (total)

  // Buffers (BatchNorm's running statistics): one more block, floating ones in the parameters'
  // dtype and counters in i64, each filled with its spec's value. Not touched by optimizers.
  struct BufferEntry {
    BufferSpec spec;
    std::string full_name;
  };
  void build_buffers(const std::vector<BufferEntry>& entries, const kernels::Exec& exec);
  std::vector<Buffer>& buffers() { return buffers_; }
  const std::vector<Buffer>& buffers() const { return buffers_; }

 private:
  std::vector<Param> params_;
  std::vector<Buffer> buffers_;
  Arena arena_, buffer_arena_;
  Tensor values_, grads_;
  size_t total_ = 0;
  DType dtype_ = DType::f32;
};

}  // namespace nt
