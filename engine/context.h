// Context: where a model runs. It owns the execution handle's resources (CUDA stream or CPU thread
// pool) and resolves the user's device choice: "auto" takes a usable GPU, else the CPU.
#pragma once

#include <memory>
#include <string>

#include "kernels/cpu/thread_pool.h"
#include "kernels/exec.h"
#include "kernels/runtime.h"

namespace nt {

struct ContextOptions {
  std::string device = "auto";      // auto | cpu | cuda
  int threads = 0;                  // CPU threads, 0 = all cores
  bool debug_sync = false;          // CUDA: synchronize and check after every launch
  bool programmatic_launch = true;  // CUDA: programmatic dependent launch (--no-pdl turns it off)
  // What the convolutions' and GEMMs' products see (kernels/operand.h): fp32; TF32 convolutions (--tf32, CUDA sm_80+);
  // or BF16 convolution and Linear operands (--bf16: CUDA sm_80+ tensor cores, or the CPU's twin of them).
  kernels::Math math = kernels::Math::fp32;
  int gpu = 0;  // CUDA: which GPU (a data-parallel rank takes the one of its local rank)
};

class Context {
 public:
  // Throws nt::Error naming --device when the choice cannot be honoured.
  explicit Context(const ContextOptions& options);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const kernels::Exec& exec() const { return exec_; }
  kernels::Math math() const { return exec_.math; }
  kernels::Backend backend() const { return exec_.backend; }
  bool on_cuda() const { return exec_.on_cuda(); }
  const kernels::DeviceInfo& device_info() const { return device_; }
  std::string describe() const;  // one line: "cuda:0 NVIDIA H100 80GB HBM3 (132 SMs, 79.1 GiB, sm_90)"
  // On the CPU: why ("--device cpu", or why no GPU could be used). When a GPU is there all the same, the user most
  // likely expected it to be used: the apps warn with why_cpu(), which names the fix.
  bool gpu_unusable() const { return gpu_unusable_; }
  const std::string& why_cpu() const { return why_cpu_; }

  void set_observer(profile::LaunchObserver* observer) { exec_.observer = observer; }

 private:
  kernels::Exec exec_;
  std::unique_ptr<kernels::ThreadPool> pool_;
  kernels::DeviceInfo device_;
  std::string why_cpu_;        // on the CPU: the reason ("--device cpu", or why no GPU could be used)
  bool gpu_unusable_ = false;  // on the CPU with a GPU present that could not be used
};

}  // namespace nt
