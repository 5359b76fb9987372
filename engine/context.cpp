#include "engine/context.h"

#include <sstream>

namespace nt {

namespace {

// The first GPU, if the binary can drive it; otherwise why not.
bool usable_gpu(kernels::DeviceInfo* info, std::string* why_not) {
  if (!kernels::cuda_built()) {
    *why_not = "this build of nanotrain has no CUDA backend (rebuild with nvcc available)";
    return false;
  }
  if (kernels::cuda_device_count() == 0) {
    *why_not = "no CUDA device is visible (no GPU or no driver)";
    return false;
  }
  *info = kernels::cuda_device_info(0);
  std::string built_for;
  if (!kernels::cuda_build_runs_on(*info, &built_for)) {
    *why_not = cat("this build has GPU code for ", built_for, " only, but ", info->name, " is sm_", info->cc_major,
                   info->cc_minor, " (rebuild with -DCMAKE_CUDA_ARCHITECTURES=", info->cc_major, info->cc_minor, ")");
    return false;
  }
  return true;
}

}  // namespace

Context::Context(const ContextOptions& options) {
  if (options.device != "auto" && options.device != "cpu" && options.device != "cuda")
    throw Error(cat("--device: unknown device '", options.device, "' (expected auto, cpu or cuda)"));
  if (options.threads < 0) throw Error(cat("--threads: must be >= 0, got ", options.threads));

  bool want_gpu = options.device != "cpu";
  std::string why_not;
  bool gpu = want_gpu && usable_gpu(&device_, &why_not);
  if (options.device == "cuda" && !gpu) throw Error(cat("--device cuda: ", why_not));
  if (options.tf32 && !gpu)
    throw Error(cat("--tf32: TF32 tensor cores need a GPU, and ", want_gpu ? why_not : "--device cpu was chosen"));

  exec_.debug_sync = options.debug_sync;
  exec_.programmatic_launch = options.programmatic_launch;
  if (gpu) {
    kernels::cuda_set_device(device_.index);
    exec_.backend = kernels::Backend::cuda;
    exec_.stream = kernels::create_stream();
    if (options.tf32 && device_.cc_major < 8)
      throw Error(cat("--tf32: ", device_.name, " (sm_", device_.cc_major, device_.cc_minor,
                      ") has no TF32 tensor cores (sm_80 or newer)"));
    exec_.tf32 = options.tf32;
  } else {
    exec_.backend = kernels::Backend::cpu;
    pool_ = std::make_unique<kernels::ThreadPool>(options.threads);
    exec_.pool = pool_.get();
  }
}

Context::~Context() {
  if (exec_.on_cuda()) kernels::destroy_stream(exec_.stream);
}

std::string Context::describe() const {
  std::ostringstream s;
  if (on_cuda()) {
    s << "cuda:" << device_.index << " " << device_.name << " (" << device_.sm_count << " SMs, "
      << static_cast<double>(device_.total_memory) / (1u << 30) << " GiB, sm_" << device_.cc_major
      << device_.cc_minor << ")" << (exec_.tf32 ? ", TF32 convolutions" : "");
  } else {
    s << "cpu (" << pool_->size() << " threads)";
  }
  return s.str();
}

}  // namespace nt
