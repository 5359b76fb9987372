#include "profile/nvtx.h"

#if NT_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace nt::profile {

#if NT_WITH_CUDA
void nvtx_push(const char* name) { nvtxRangePushA(name); }
void nvtx_pop() { nvtxRangePop(); }
#else
void nvtx_push(const char*) {}
void nvtx_pop() {}
#endif

}  // namespace nt::profile
