#include "engine/context.h"

#include <iomanip>
#include <sstream>

namespace nt {

namespace {

constexpr size_t kMinFreeGpuBytes = size_t{256} << 20;  // far above a named model's plan and MNIST on the device

// Whether the first GPU can be used; if not, why not (a sentence with the fix where there is one), and whether a
// GPU was there at all: a machine without one falls back quietly, one whose GPU cannot be used says so.
struct GpuChoice {
  bool usable = false;
  bool gpu_present = false;
  std::string why_not;
};

GpuChoice choose_gpu(kernels::DeviceInfo* info, int index) {
  const int count = kernels::cuda_device_count();
  if (count > 0 && index >= count)  // a data-parallel rank with no GPU of its own: never a quiet fall-back
    throw Error(cat("GPU ", index, " was asked for (one GPU per rank on a machine) and this machine has ", count,
                    ": start at most ", count, " ranks per machine, or give --device cpu"));
  if (count == 0) {
    std::string problem = kernels::cuda_unusable_reason();
    if (!problem.empty()) return {false, true, problem};
    return {false, false,
            kernels::cuda_built()
                ? "no CUDA device is visible (no NVIDIA GPU or no driver)"
                : "this build of nanotrain has no CUDA backend (nvcc was not found when it was built)"};
  }
  *info = kernels::cuda_device_info(index);
  const std::string gpu = cat(info->name, " (sm_", info->cc_major, info->cc_minor, ")");
  if (!info->open_error.empty())
    return {false, true, cat(gpu, " cannot be opened: ", info->open_error, "; see nvidia-smi for what holds it")};
  if (info->code_arch == 0)
    return {false, true,
            cat("this build has GPU code for ", kernels::cuda_built_for(), " only, none of which runs on ", gpu,
                ": rerun scripts/setup on this machine (it builds for the GPU it sees) or configure with "
                "-DCMAKE_CUDA_ARCHITECTURES=",
                info->cc_major, info->cc_minor)};
  if (info->free_memory < kMinFreeGpuBytes)
    return {false, true,
            cat(gpu, " has only ", info->free_memory >> 20, " MiB of ", info->total_memory >> 20,
                " MiB free: other processes hold the rest (see nvidia-smi)")};
  return {true, true, ""};
}

}  // namespace

Context::Context(const ContextOptions& options) {
  if (options.device != "auto" && options.device != "cpu" && options.device != "cuda")
    throw Error(cat("--device: unknown device '", options.device, "' (expected auto, cpu or cuda)"));
  if (options.threads < 0) throw Error(cat("--threads: must be >= 0, got ", options.threads));

  const bool want_gpu = options.device != "cpu";
  GpuChoice choice;
  if (want_gpu) choice = choose_gpu(&device_, options.gpu);
  const bool gpu = choice.usable;
  if (options.device == "cuda" && !gpu) throw Error(cat("--device cuda: ", choice.why_not));
  if (!gpu) {
    why_cpu_ = want_gpu ? choice.why_not : "--device cpu";
    gpu_unusable_ = choice.gpu_present;
  }

  exec_.debug_sync = options.debug_sync;
  exec_.programmatic_launch = options.programmatic_launch;
  if (gpu) {
    kernels::cuda_set_device(device_.index);
    exec_.backend = kernels::Backend::cuda;
    exec_.stream = kernels::create_stream();
    if (options.math != kernels::Math::fp32 && !device_.has_tf32()) {  // TF32 and BF16 MMAs both need sm_80 code
      const std::string arch = cat(device_.cc_major, device_.cc_minor);
      throw Error(cat(options.math == kernels::Math::tf32 ? "--tf32: " : "--bf16: ", device_.name, " (sm_", arch,
                      ") runs this build's ", device_.code_path(),
                      device_.cc_major >= 8 ? "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + arch : ""));
    }
  } else {
    exec_.backend = kernels::Backend::cpu;
    pool_ = std::make_unique<kernels::ThreadPool>(options.threads);
    exec_.pool = pool_.get();
  }
  exec_.math = options.math;  // TF32 or BF16 on the CPU: its twin of the tensor cores' rounding (kernels/operand.h)
}

Context::~Context() {
  if (exec_.on_cuda()) kernels::destroy_stream(exec_.stream);
}

std::string Context::describe() const {
  std::ostringstream s;
  if (on_cuda()) {
    s << "cuda:" << device_.index << " " << device_.name << " (" << device_.sm_count << " SMs, " << std::fixed
      << std::setprecision(1) << static_cast<double>(device_.total_memory) / (1u << 30) << " GiB, sm_"
      << device_.cc_major << device_.cc_minor << ")";
  } else {
    s << "cpu (" << pool_->size() << " threads)";
  }
  if (exec_.math == kernels::Math::tf32)
    s << (on_cuda() ? ", TF32 convolutions"
                    : ", TF32 convolution operands (rounded as the GPU's tensor cores take them)");
  if (exec_.math == kernels::Math::bf16)
    s << (on_cuda() ? ", BF16 convolutions and Linear layers"
                    : ", BF16 convolution and Linear operands (rounded as the GPU's tensor cores take them)");
  return s.str();
}

}  // namespace nt
