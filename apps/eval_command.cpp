// nanotrain eval: load a saved model (safetensors) and print its test loss and accuracy.
//
// The evaluation is Trainer::evaluate, the very code `train` runs after each epoch, so a model saved by
// `train --save` evaluates here to exactly the last epoch's test accuracy (same batch size, same device).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "apps/command.h"
#include "apps/workload.h"
#include "data/batcher.h"
#include "data/dataset.h"
#include "engine/checkpoint.h"
#include "engine/trainer.h"
#include "layers/builder.h"
#include "layers/softmax_xent.h"

namespace nt::app {

namespace {

namespace fs = std::filesystem;

struct EvalCommand {
  CommonOptions common;
  WorkloadOptions workload;
  std::string load_path;
  int batch = 64;
};

void validate_eval(const EvalCommand& e) {
  validate_common(e.common);
  if (e.batch < 1 || e.batch > 1 << 20) throw UsageError(cat("--batch: must be in [1, 1048576], got ", e.batch));
  validate_workload(e.workload);
  std::error_code ec;
  if (!fs::is_regular_file(e.load_path, ec)) throw UsageError(cat("--load: no file '", e.load_path, "'"));
}

int run_eval(const EvalCommand& e) {
  validate_eval(e);
  setup_logging(e.common);

  Context ctx(e.common.context());
  // Both splits: normalization comes from the train split, as in training.
  Workload w = load_workload(e.workload, 1);
  const auto& split = w.split;
  auto& model = w.model;
  model->init_params(ctx, 0);  // lays out the parameters; every value is replaced by the file's
  const CheckpointMetadata metadata = load_safetensors(e.load_path, *model, ctx.exec());
  require_finite_checkpoint(ctx, *model, "--load", e.load_path);
  if (auto it = metadata.find("dataset"); it != metadata.end() && it->second != e.workload.dataset)
    spdlog::warn("{} was trained on {}, evaluating on {}", e.load_path, it->second, e.workload.dataset);

  log_device(ctx);
  spdlog::info("{}", model->summary());
  // Trainer::evaluate needs a trainer; its optimizer is never stepped and its training source is the
  // test set itself (no shuffle), so nothing but the evaluation runs.
  data::DeviceBatcher test_data(ctx, split.test, /*shuffle=*/false, 0);
  layers::SoftmaxCrossEntropy loss;
  Sgd unused(ctx.exec(), model->params(), {1.f, 0.f, 0.f});
  TrainOptions options;
  options.fuse_head = !e.common.no_fused_head;
  options.batch = static_cast<int>(std::min<int64_t>(e.batch, split.test.count));
  options.use_graphs = !e.common.debug_sync;
  Trainer trainer(ctx, *model, loss, unused, test_data, options);
  const EvalResult r = trainer.evaluate(test_data);

  const auto examples = split.test.count;
  const auto correct = static_cast<long long>(r.accuracy * static_cast<double>(examples) + 0.5);
  std::printf("test loss %.6f | test acc %.2f%% (%lld/%lld) | %.1f ms\n", r.loss, 100 * r.accuracy, correct,
              static_cast<long long>(examples), r.ms);
  return 0;
}

}  // namespace

Command register_eval(CLI::App& app) {
  auto eval = std::make_shared<EvalCommand>();
  auto* cmd = app.add_subcommand("eval", "Evaluate a saved model (safetensors) on the test set");
  add_common_options(*cmd, eval->common);
  add_workload_options(*cmd, eval->workload, "The saved model's architecture: mlp, or a layer spec");
  cmd->add_option("--load", eval->load_path, "The model to evaluate (from train --save)")
      ->required()
      ->check(non_empty_path());
  cmd->add_option("--batch", eval->batch, "Evaluation batch size")->capture_default_str();
  return {cmd, [eval] { return run_eval(*eval); }};
}

}  // namespace nt::app
