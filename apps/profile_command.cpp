// nanotrain profile: time every kernel of a few training steps and one evaluation pass, and print where the
// time goes (see profile/report.h for the table, docs/profiler.md for how the times are taken).
//
//   nanotrain profile --model mlp --batch 64 --steps 50 [--warmup 10] [--device cpu|cuda] [--profile-out P]
//                     [--profile-timer auto|cupti|events|stamps] [--no-hold] [--profile-graphs]
//
// The model, data and optimizer are set up as `train` sets them up. W warm-up steps run unprofiled (first
// launches load kernels, first touches fault pages in); then N steps run under the profiler, then one
// evaluation pass over the first N x batch test examples (so the eval phase shows at a comparable scale).
// Steps run on past the end of an epoch into the next one, with its new data order. With --profile-graphs the
// profiled steps and the evaluation are captured as CUDA graphs and replayed once (one graph per epoch's share of
// the steps): the same kernels in the same order as the eager run, timed as `train --profile-graphs` times them.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "apps/command.h"
#include "apps/profiling.h"
#include "apps/workload.h"
#include "data/batcher.h"
#include "engine/trainer.h"
#include "kernels/runtime.h"
#include "layers/softmax_xent.h"

namespace nt::app {

namespace {

struct ProfileCommand {
  CommonOptions common;
  WorkloadOptions workload;
  int batch = 64;
  int64_t steps = 50;
  int64_t warmup = 10;
  double lr = 0.03;
  uint64_t seed = 1;
  std::string out_prefix;
  std::string timer = "auto";
  bool no_hold = false;
  bool graphs = false;
};

void validate_profile(const ProfileCommand& p) {
  validate_common(p.common);
  if (p.batch < 1 || p.batch > 1 << 20) throw UsageError(cat("--batch: must be in [1, 1048576], got ", p.batch));
  if (p.steps < 1 || p.steps > 1'000'000) throw UsageError(cat("--steps: must be in [1, 1000000], got ", p.steps));
  if (p.warmup < 0 || p.warmup > 1'000'000) throw UsageError(cat("--warmup: must be in [0, 1000000], got ", p.warmup));
  if (!(std::isfinite(p.lr) && p.lr > 0)) throw UsageError(cat("--lr: must be a positive number, got ", p.lr));
  validate_workload(p.workload);
  validate_profile_out(p.out_prefix);
  parse_profile_timer(p.timer);
  if (p.graphs && p.common.debug_sync)
    throw UsageError("--profile-graphs: profiles replayed CUDA graphs, and --debug-sync forbids capturing them");
}

// Enqueues steps [first, first + count) of an endless run of epochs, starting each epoch's data order as
// the steps reach it. With `graphs`, each epoch's share of the steps is captured as a CUDA graph and replayed once (the
// data order is set eagerly, before the graph); the graphs are kept there until the work is read back.
void enqueue_steps(Trainer& trainer, BatchSource& data, const kernels::Exec& exec, int64_t first, int64_t count,
                   std::vector<kernels::Graph>* graphs = nullptr) {
  const int64_t per_epoch = trainer.steps_per_epoch();
  for (int64_t s = first; s < first + count;) {
    if (s % per_epoch == 0) data.begin_epoch(exec, static_cast<int>(s / per_epoch) + 1);
    const int64_t run = std::min(first + count - s, per_epoch - s % per_epoch);
    const auto enqueue_run = [&] {
      for (int64_t i = s; i < s + run; ++i) trainer.enqueue_train_step(i % per_epoch);
    };
    if (graphs) {
      graphs->push_back(kernels::Graph::capture(exec, enqueue_run));
      graphs->back().launch(exec);
    } else {
      enqueue_run();
    }
    s += run;
  }
}

int run_profile(const ProfileCommand& p) {
  validate_profile(p);
  setup_logging(p.common);

  Context ctx(p.common.context());
  Workload w = load_workload(p.workload, p.batch);
  Model& model = *w.model;
  model.init_params(ctx, p.seed);
  log_device(ctx);
  spdlog::info("{}", model.summary());

  const int64_t eval_examples = std::min<int64_t>(w.split.test.count, p.steps * p.batch);
  data::DeviceBatcher train_data(ctx, w.split.train, /*shuffle=*/true, p.seed);
  data::DeviceBatcher eval_data(ctx, data::subset(w.split.test, 0, eval_examples), /*shuffle=*/false, p.seed);
  layers::SoftmaxCrossEntropy loss;
  Sgd sgd(ctx.exec(), model.params(), {static_cast<float>(p.lr), 0.f, 0.f});
  TrainOptions options;
  options.fuse_head = !p.common.no_fused_head;
  options.batch = p.batch;
  Trainer trainer(ctx, model, loss, sgd, train_data, options);  // eager: a profiler is attached (graph policy)

  enqueue_steps(trainer, train_data, ctx.exec(), 0, p.warmup);
  kernels::synchronize(ctx.exec());

  ProfileSession profiling(ctx, /*enabled=*/true, p.out_prefix, /*hold=*/!p.no_hold, parse_profile_timer(p.timer),
                           p.graphs && ctx.on_cuda());
  profiling.resume();
  std::vector<kernels::Graph> graphs;
  const bool replayed = ctx.exec().observer && ctx.exec().observer->times_graph_replays();
  enqueue_steps(trainer, train_data, ctx.exec(), p.warmup, p.steps, replayed ? &graphs : nullptr);
  const EvalResult eval = trainer.evaluate(eval_data);
  profiling.pause();
  const auto [train_loss, train_acc] = trainer.read_train_totals(p.warmup + p.steps);

  std::printf("profile: %s, batch %d, %lld steps after %lld warm-up, then evaluation of %lld test examples, on %s\n",
              p.workload.model.c_str(), p.batch, static_cast<long long>(p.steps), static_cast<long long>(p.warmup),
              static_cast<long long>(eval_examples), ctx.describe().c_str());
  std::printf("training loss %.4f (mean over all %lld steps), eval accuracy %.2f%%\n", train_loss,
              static_cast<long long>(p.warmup + p.steps), 100 * eval.accuracy);
  (void)train_acc;
  profiling.finish();
  return 0;
}

}  // namespace

Command register_profile(CLI::App& app) {
  auto prof = std::make_shared<ProfileCommand>();
  auto* cmd = app.add_subcommand("profile", "Time every kernel of a few training steps and an evaluation pass");
  add_common_options(*cmd, prof->common);
  add_workload_options(*cmd, prof->workload, "mlp, or a layer spec such as linear:128,relu,linear:10");
  cmd->add_option("--batch", prof->batch, "Mini-batch size")->capture_default_str();
  cmd->add_option("--steps", prof->steps, "Training steps to profile")->capture_default_str();
  cmd->add_option("--warmup", prof->warmup, "Unprofiled training steps before them")->capture_default_str();
  cmd->add_option("--lr", prof->lr, "Learning rate of the SGD steps")->capture_default_str();
  cmd->add_option("--seed", prof->seed, "Seed of the initial weights and the data order")
      ->check(unsigned_64_validator())
      ->capture_default_str();
  cmd->add_option("--profile-out", prof->out_prefix, "Also write PREFIX.csv, PREFIX.json and PREFIX.trace.json")
      ->check(non_empty_path());
  cmd->add_option("--profile-timer", prof->timer, kProfileTimerHelp)->capture_default_str();
  cmd->add_flag("--profile-graphs", prof->graphs,
                "GPU: capture the profiled steps and the evaluation as CUDA graphs and time their replay (CUPTI; "
                "launch stamps in a profiling build), as train --profile-graphs does");
  cmd->add_flag("--no-hold", prof->no_hold,
                "GPU, events timer: do not hold the stream behind the host within a step (for runs under Nsight "
                "Compute, which serializes launches); short kernels may then read long");
  return {cmd, [prof] { return run_profile(*prof); }};
}

}  // namespace nt::app
