// The CPU's twin of the tensor cores' operand formats (kernels/operand.h): an op whose Exec::math rounds its
// operands runs its fp32 loops on rounded copies of them. A product of two rounded values is exact in fp32, so the
// twin differs from the GPU only in the order of the fp32 additions. The copies live in per-thread buffers that grow
// to the largest operand once and are reused: the op allocates nothing after its first call.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/operand.h"

namespace nt::kernels::cpu {

// A copy of src[0, count), each value rounded as `math` says, in the calling thread's buffer `slot` (an op with
// several operands gives each its own slot). Valid until the next call with the same slot on this thread.
inline const float* rounded_copy(const float* src, size_t count, Math math, int slot) {
  constexpr int kSlots = 3;
  thread_local std::vector<float> buffers[kSlots];
  NT_CHECK(slot >= 0 && slot < kSlots, "rounded_copy: slot ", slot, " out of range");
  std::vector<float>& buffer = buffers[slot];
  if (buffer.size() < count) buffer.resize(count);
  for (size_t i = 0; i < count; ++i) buffer[i] = round_operand(src[i], math);
  return buffer.data();
}

}  // namespace nt::kernels::cpu
