// The host's side of an eager training step: how long the launching thread takes to enqueue one mlp step,
// unprofiled and with every launch timed by CUPTI, against the pace of steps run back to back. An eager epoch runs at
// the slower of the host and the GPU, so a timer's host cost per launch is free while the host stays ahead and costs
// in full once it does not (docs/profiler.md, "CUPTI's eager overhead is the host's").
//
//   bench_eager_host [--batch 64] [--steps 48] [--rounds 30] [--data DIR]
//
// Host time: the stream is held by profile_hold (a kernel that waits for a host-mapped flag) while the host enqueues
// `steps` steps, so no launch waits for the GPU; the flag is then released and the stream drained, outside the
// clock. Median over `rounds`. The same for an empty kernel launched 8 x `steps` times on a stream of its own and
// unobserved (CUPTI, when on, records it all the same): through the launch path, and directly by the runtime's and the
// driver's launch calls, the floor under a launch's host cost. Paced:
// 8 x `steps` steps enqueued back to back, from the first enqueue to the stream's end, per step (an eager epoch's
// pace). Launches per step are counted by an observer of one step.
//
// The events timer is left out: its own hold waits for each step's start on the GPU, which the held stream never
// reaches (it times an eager epoch sampled, docs/profiler.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/launch/spin_kernels.h"
#include "core/cuda_check.h"
#include "data/batcher.h"
#include "data/dataset.h"
#include "engine/trainer.h"
#include "kernels/profile_delay.h"
#include "kernels/runtime.h"
#include "layers/builder.h"
#include "layers/softmax_xent.h"
#include "profile/kernel_profiler.h"

using namespace nt;

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int batch = 64, steps = 48, rounds = 30;
  std::string data;
};

Args parse(int argc, char** argv) {
  Args a;
  if (const char* env = std::getenv("NT_DATA_DIR")) a.data = env;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&](int lo, int hi) {
      if (i + 1 >= argc) throw Error(cat(k, ": missing value"));
      const int v = std::atoi(argv[++i]);
      if (v < lo || v > hi) throw Error(cat(k, ": expected ", lo, "..", hi, ", got ", argv[i]));
      return v;
    };
    if (k == "--batch")
      a.batch = value(1, 4096);
    else if (k == "--steps")  // a round's launches must fit the stream's queue, or the host would wait for the GPU
      a.steps = value(1, 64);
    else if (k == "--rounds")
      a.rounds = value(1, 1000);
    else if (k == "--data" && i + 1 < argc)
      a.data = argv[++i];
    else
      throw Error(cat("unknown argument ", k,
                      " (usage: bench_eager_host [--batch B] [--steps S] [--rounds R] "
                      "[--data DIR])"));
  }
  if (a.data.empty()) a.data = ".data/mnist";
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Counts the launches it observes (for launches per step).
struct LaunchCounter final : profile::LaunchObserver {
  int64_t launches = 0;
  void begin(const char*, void*) override { ++launches; }
  void end(const char*, void*, const profile::OpCost&) override {}
};

// A host-mapped counter that profile_hold waits on.
class HostFlag {
 public:
  HostFlag() {
    NT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_), sizeof(uint32_t), cudaHostAllocMapped));
    *host_ = 0;
    NT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
  }
  ~HostFlag() { cudaFreeHost(host_); }
  HostFlag(const HostFlag&) = delete;
  HostFlag& operator=(const HostFlag&) = delete;
  // Holds `exec`'s stream (unobserved: the hold is not a kernel of the step) until release().
  void hold(const kernels::Exec& exec) {
    kernels::Exec e = exec;
    e.observer = nullptr;
    kernels::profile_hold(e, {.flag = device_, .target = target_ + 1});
  }
  void release() { __atomic_store_n(host_, ++target_, __ATOMIC_RELEASE); }

 private:
  uint32_t* host_ = nullptr;
  uint32_t* device_ = nullptr;
  uint32_t target_ = 0;
};

struct Result {
  std::string mode;
  double host_us = 0, host_min_us = 0, host_max_us = 0;  // per step, enqueue only
  double empty_launch_us = 0;                            // per launch of an empty kernel, enqueue only
  double empty_runtime_us = 0,
         empty_driver_us = 0;  // the same launched directly (cudaLaunchKernelExC, cuLaunchKernelEx)
  double paced_us = 0;         // per step, back to back until the stream drains
};

// Median host microseconds per call of `enqueue` over `rounds`, each with `exec`'s stream held meanwhile.
template <class Enqueue>
std::vector<double> held_host_us(HostFlag& flag, const kernels::Exec& exec, int rounds, int calls, Enqueue enqueue,
                                 profile::KernelProfiler* profiler) {
  std::vector<double> us;
  for (int round = 0; round < rounds; ++round) {
    flag.hold(exec);
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) enqueue();
    const auto t1 = Clock::now();
    flag.release();
    kernels::synchronize(exec);
    if (profiler) profiler->flush();  // outside the clock: a flush synchronizes
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / calls);
  }
  return us;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  auto split = data::load_dataset_dir(args.data, "mnist");
  Context ctx({"cuda", 0, false});
  auto model = layers::build_model("mlp", Shape{1, 28, 28}, 10);
  model->init_params(ctx, 1);
  data::DeviceBatcher train(ctx, split.train, true, 1);
  layers::SoftmaxCrossEntropy loss;
  Sgd sgd(ctx.exec(), model->params(), {0.03f, 0.9f, 0.f});
  TrainOptions options;
  options.batch = args.batch;
  options.use_graphs = false;
  Trainer trainer(ctx, *model, loss, sgd, train, options);
  const int64_t steps_per_epoch = trainer.steps_per_epoch();
  int64_t step = 0;
  auto enqueue = [&](int n) {
    for (int i = 0; i < n; ++i) trainer.enqueue_train_step(step++ % steps_per_epoch);
  };
  const kernels::Exec& exec = ctx.exec();

  LaunchCounter counter;
  ctx.set_observer(&counter);
  enqueue(1);
  ctx.set_observer(nullptr);
  kernels::synchronize(exec);
  const double launches_per_step = static_cast<double>(counter.launches);

  HostFlag flag;
  kernels::Exec empty_exec = exec;  // its own stream, so that the profiler's stream order is not disturbed
  empty_exec.stream = kernels::create_stream();
  empty_exec.observer = nullptr;
  bench::launch_spin(empty_exec, 0);  // loads the kernel
  kernels::synchronize(empty_exec);
  std::vector<Result> results;
  for (const bool cupti : {false, true}) {
    std::unique_ptr<profile::KernelProfiler> profiler;
    if (cupti) {
      profile::ProfilerOptions o;
      o.timing = profile::Timing::cupti;
      o.cupti_fallback = false;
      o.device = "cuda";
      profiler = std::make_unique<profile::KernelProfiler>(std::move(o));
      ctx.set_observer(profiler.get());
      profiler->start();
    }
    enqueue(args.steps);  // warm-up
    kernels::synchronize(exec);
    Result r{cupti ? "cupti" : "unprofiled"};
    const auto host = held_host_us(
        flag, exec, args.rounds, args.steps, [&] { enqueue(1); }, profiler.get());
    r.host_us = median(host);
    r.host_min_us = *std::min_element(host.begin(), host.end());
    r.host_max_us = *std::max_element(host.begin(), host.end());
    r.empty_launch_us = median(held_host_us(
        flag, empty_exec, args.rounds, 8 * args.steps, [&] { bench::launch_spin(empty_exec, 0); }, profiler.get()));
    for (const auto api : {bench::LaunchApi::runtime, bench::LaunchApi::driver})
      (api == bench::LaunchApi::runtime ? r.empty_runtime_us : r.empty_driver_us) = median(held_host_us(
          flag, empty_exec, args.rounds, 8 * args.steps, [&] { bench::launch_empty_directly(empty_exec.stream, api); },
          profiler.get()));
    std::vector<double> paced;
    for (int round = 0; round < 5; ++round) {
      const auto t0 = Clock::now();
      enqueue(8 * args.steps);
      kernels::synchronize(exec);
      paced.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / (8 * args.steps));
      if (profiler) profiler->flush();
    }
    r.paced_us = median(paced);
    if (profiler) {
      profiler->stop();
      ctx.set_observer(nullptr);
      if (profiler->timing() != profile::Timing::cupti)
        throw Error(cat("cupti: the profiler fell back (", profiler->timing_note(), ")"));
    }
    results.push_back(r);
  }

  std::printf(
      "mlp batch %d, eager, %.0f launches per step; host: enqueue of %d steps with the stream held, median of "
      "%d rounds\n",
      args.batch, launches_per_step, args.steps, args.rounds);
  std::printf("%-11s %13s %14s %15s %14s %14s %14s %11s\n", "timer", "host us/step", "(min..max)", "host us/launch",
              "empty: path", "runtime", "driver", "paced us/step");
  for (const Result& r : results)
    std::printf("%-11s %13.2f %6.1f..%-7.1f %15.2f %14.2f %14.2f %14.2f %11.2f\n", r.mode.c_str(), r.host_us,
                r.host_min_us, r.host_max_us, r.host_us / launches_per_step, r.empty_launch_us, r.empty_runtime_us,
                r.empty_driver_us, r.paced_us);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_eager_host: %s\n", e.what());
  return 1;
}
