// NVTX ranges: named spans that Nsight Systems shows on the timeline. Nearly free when no tool listens.
#pragma once

namespace nt::profile {

void nvtx_push(const char* name);
void nvtx_pop();

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtx_push(name); }
  ~NvtxRange() { nvtx_pop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace nt::profile
