// nanotrain train: train a model, evaluate it after every epoch, print and record the metrics.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "apps/command.h"
#include "data/batcher.h"
#include "data/dataset.h"
#include "engine/trainer.h"
#include "layers/builder.h"
#include "layers/softmax_xent.h"

namespace nt::app {

namespace {

namespace fs = std::filesystem;

struct TrainCommand {
  CommonOptions common;
  std::string model = "mlp";
  std::string dataset = "mnist";
  std::string data_dir;
  int epochs = 5;
  int batch = 64;
  double lr = 0.03;
  double momentum = 0.0;
  double weight_decay = 0.0;
  uint64_t seed = 1;
  std::string metrics_path;
  int64_t train_limit = 0;
  bool no_graphs = false;
};

void validate_train(const TrainCommand& t) {
  validate_common(t.common);
  if (t.epochs < 1 || t.epochs > 100000) throw UsageError(cat("--epochs: must be in [1, 100000], got ", t.epochs));
  if (t.batch < 1 || t.batch > 1 << 20) throw UsageError(cat("--batch: must be in [1, 1048576], got ", t.batch));
  if (!(std::isfinite(t.lr) && t.lr > 0)) throw UsageError(cat("--lr: must be a positive number, got ", t.lr));
  if (!(std::isfinite(t.momentum) && t.momentum >= 0 && t.momentum < 1))
    throw UsageError(cat("--momentum: must be in [0, 1), got ", t.momentum));
  if (!(std::isfinite(t.weight_decay) && t.weight_decay >= 0))
    throw UsageError(cat("--weight-decay: must be a number >= 0, got ", t.weight_decay));
  if (t.dataset != "mnist" && t.dataset != "fashion-mnist")
    throw UsageError(cat("--dataset: unknown dataset '", t.dataset, "' (expected mnist or fashion-mnist)"));
  if (t.train_limit < 0) throw UsageError(cat("--train-limit: must be >= 0, got ", t.train_limit));
}

// ---- data ------------------------------------------------------------------------------------------

// --data, then $NT_DATA_DIR, then ./.data/<dataset>, then the Debian package's folder.
std::string resolve_data_dir(const TrainCommand& t) {
  if (!t.data_dir.empty()) return t.data_dir;
  if (const char* env = std::getenv("NT_DATA_DIR"); env && *env) return env;
  std::vector<std::string> candidates{".data/" + t.dataset};
  if (t.dataset == "fashion-mnist") candidates.push_back("/usr/share/datasets/fashion-mnist");
  for (const auto& c : candidates)
    if (fs::is_directory(c)) return c;
  throw Error(cat("--data: no ", t.dataset, " folder found (looked in ./", candidates.front(),
                  t.dataset == "fashion-mnist" ? " and /usr/share/datasets/fashion-mnist" : "",
                  "); run scripts/fetch-data ", t.dataset, " or pass --data DIR"));
}

// ---- output ----------------------------------------------------------------------------------------

// Metrics as JSON lines, rewritten whole after each epoch through a temporary file and a rename, so
// the file on disk is always complete.
class MetricsFile {
 public:
  explicit MetricsFile(std::string path) : path_(std::move(path)) {
    if (path_.empty()) return;
    fs::path parent = fs::path(path_).parent_path();
    if (!parent.empty() && !fs::is_directory(parent))
      throw UsageError(cat("--metrics: folder '", parent.string(), "' does not exist"));
  }
  void append(const EpochMetrics& m) {
    if (path_.empty()) return;
    char line[512];
    std::snprintf(line, sizeof line,
                  "{\"epoch\": %d, \"train_loss\": %.6f, \"train_acc\": %.6f, \"test_loss\": %.6f, "
                  "\"test_acc\": %.6f, \"epoch_ms\": %.3f, \"eval_ms\": %.3f, \"samples_per_s\": %.1f}\n",
                  m.epoch, m.train_loss, m.train_acc, m.test_loss, m.test_acc, m.epoch_ms, m.eval_ms,
                  m.samples_per_s);
    lines_ += line;
    const std::string tmp = path_ + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << lines_;
      out.flush();
      if (!out) throw Error(cat("--metrics: cannot write '", tmp, "'"));
    }
    std::error_code ec;
    fs::rename(tmp, path_, ec);
    if (ec) throw Error(cat("--metrics: cannot replace '", path_, "': ", ec.message()));
  }

 private:
  std::string path_;
  std::string lines_;
};

class Progress {
 public:
  explicit Progress(bool enabled) : enabled_(enabled) {}
  void update(int epoch, int64_t step, int64_t steps) {
    if (!enabled_) return;
    const int64_t percent = 100 * step / steps;
    if (percent == last_percent_ && step != steps) return;
    last_percent_ = percent;
    constexpr int width = 30;
    const auto filled = static_cast<int>(width * step / steps);
    std::printf("\r  epoch %3d [%.*s%*s] %3lld%%", epoch, filled, "##############################",
                width - filled, "", static_cast<long long>(percent));
    std::fflush(stdout);
  }
  void clear() {
    if (!enabled_ || last_percent_ < 0) return;
    std::printf("\r%*s\r", 60, "");
    last_percent_ = -1;
  }

 private:
  bool enabled_;
  int64_t last_percent_ = -1;
};

void print_epoch(const EpochMetrics& m) {
  std::printf("epoch %3d | train loss %.4f acc %6.2f%% | test loss %.4f acc %6.2f%% | %9.1f ms | %8.0f samples/s\n",
              m.epoch, m.train_loss, 100 * m.train_acc, m.test_loss, 100 * m.test_acc, m.epoch_ms, m.samples_per_s);
  std::fflush(stdout);
}

int run_train(const TrainCommand& t) {
  validate_train(t);
  setup_logging(t.common);
  MetricsFile metrics(t.metrics_path);

  // Everything a user can get wrong is checked before the first log line, so an error is one line.
  Context ctx(t.common.context());
  const std::string dir = resolve_data_dir(t);
  auto split = data::load_dataset_dir(dir, t.dataset);
  if (t.train_limit > 0 && t.train_limit < split.train.count) split.train = data::subset(split.train, 0, t.train_limit);
  auto model = layers::build_model(
      t.model, Shape{split.train.channels, split.train.rows, split.train.cols}, split.train.classes);
  if (t.batch > split.train.count)
    throw UsageError(cat("--batch: ", t.batch, " is larger than the training set (", split.train.count, " examples)"));

  spdlog::info("device: {}", ctx.describe());
  spdlog::info("data: {} from {} ({} train, {} test examples)", t.dataset, dir, split.train.count, split.test.count);
  model->init_params(ctx, t.seed);
  spdlog::info("{}", model->summary());

  data::DeviceBatcher train_data(ctx, split.train, /*shuffle=*/true, t.seed);
  data::DeviceBatcher test_data(ctx, split.test, /*shuffle=*/false, t.seed);
  layers::SoftmaxCrossEntropy loss;
  Sgd sgd(ctx.exec(), model->params(),
          {static_cast<float>(t.lr), static_cast<float>(t.momentum), static_cast<float>(t.weight_decay)});
  spdlog::info("{}, batch {}, {} epochs, seed {}", sgd.describe(), t.batch, t.epochs, t.seed);

  Progress progress(isatty(STDOUT_FILENO) != 0);
  int current_epoch = 0;
  TrainOptions options;
  options.batch = t.batch;
  options.use_graphs = !t.no_graphs && !t.common.debug_sync;
  options.on_step = [&](int64_t step, int64_t steps) { progress.update(current_epoch, step, steps); };
  Trainer trainer(ctx, *model, loss, sgd, train_data, options);

  for (int epoch = 1; epoch <= t.epochs; ++epoch) {
    current_epoch = epoch;
    EpochMetrics m = trainer.run_epoch(epoch, &test_data);
    progress.clear();
    print_epoch(m);
    metrics.append(m);
  }
  return 0;
}

}  // namespace

Command register_train(CLI::App& app) {
  auto train = std::make_shared<TrainCommand>();
  auto* train_cmd = app.add_subcommand("train", "Train a model and evaluate it after every epoch");
  add_common_options(*train_cmd, train->common);
  train_cmd->add_option("--model", train->model, "mlp, or a layer spec such as linear:128,relu,linear:10")
      ->capture_default_str();
  train_cmd->add_option("--dataset", train->dataset, "mnist or fashion-mnist")->capture_default_str();
  train_cmd->add_option("--data", train->data_dir, "Folder of IDX files, raw or .gz (default: $NT_DATA_DIR, ./.data/<dataset>)");
  train_cmd->add_option("--epochs", train->epochs, "Training epochs")->capture_default_str();
  train_cmd->add_option("--batch", train->batch, "Mini-batch size (the last partial batch is dropped)")->capture_default_str();
  train_cmd->add_option("--lr", train->lr, "Learning rate")->capture_default_str();
  train_cmd->add_option("--momentum", train->momentum, "SGD momentum")->capture_default_str();
  train_cmd->add_option("--weight-decay", train->weight_decay, "L2 weight decay")->capture_default_str();
  train_cmd->add_option("--seed", train->seed, "Seed of the initial weights and the data order")->capture_default_str();
  train_cmd->add_option("--metrics", train->metrics_path, "Write one JSON object per epoch to this file");
  train_cmd->add_option("--train-limit", train->train_limit, "Train on the first N examples only (0 = all)");
  train_cmd->add_flag("--no-graphs", train->no_graphs, "GPU: launch every kernel eagerly instead of replaying a CUDA graph");

  return {train_cmd, [train] { return run_train(*train); }};
}

}  // namespace nt::app
