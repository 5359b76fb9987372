// The classifier head on the CPU: the unfused ops in sequence (kernels/classifier_head.h), so that a CPU run
// gives the same bits with the head fused or not; each op opens its own profiler scope.
#include "kernels/classifier_head.h"

namespace nt::kernels::cpu {

void classifier_head(const Exec& exec, const ClassifierHeadArgs& h) { classifier_head_unfused(exec, h); }

}  // namespace nt::kernels::cpu
