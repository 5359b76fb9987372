// nanotrain train: train a model, evaluate it after every epoch, print and record the metrics.
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <string_view>
#include <utility>

#include "apps/command.h"
#include "apps/model_card.h"
#include "apps/profiling.h"
#include "apps/progress.h"
#include "apps/ranks.h"
#include "apps/workload.h"
#include "core/atomic_file.h"
#include "data/batcher.h"
#include "data/dataset.h"
#include "engine/checkpoint.h"
#include "engine/divergence.h"
#include "engine/trainer.h"
#include "layers/builder.h"
#include "layers/softmax_xent.h"
#include "profile/launch_observer.h"
#include "profile/launch_stamps.h"

namespace nt::app {

namespace {

namespace fs = std::filesystem;

struct TrainCommand {
  CommonOptions common;
  WorkloadOptions workload;
  int epochs = 5;
  int batch = 64;
  OptimizerConfig optimizer;  // --optimizer, --lr, --momentum, --weight-decay, --beta1, --beta2, --eps
  std::string lr_schedule = "constant";
  double warmup = std::numeric_limits<double>::quiet_NaN();  // --warmup; NaN: the schedule's (warmup_fraction)
  uint64_t seed = 1;
  std::string metrics_path;
  int64_t train_limit = 0;
  int shift = 0;      // training augmentation: random translations of up to this many pixels
  bool flip = false;  // training augmentation: random left-right mirroring
  bool no_graphs = false;
  bool allow_nonfinite = false;     // go on through NaN or infinite losses (for studying divergence)
  bool save_on_divergence = false;  // a diverged run writes its last good weights to PATH.diverged-at-epoch-N
  std::string resume_from;          // a resumable checkpoint (--checkpoint-dir) to go on from
  int checkpoint_every = 0;         // write a resumable checkpoint after every N epochs (0: none)
  std::string checkpoint_dir;
  int keep = 0;                        // resumable checkpoints kept, the newest (0: all)
  std::string init_from;               // load the initial weights instead of initializing
  std::string init_out;                // save the initial weights (before training)
  std::string save_path;               // save the weights after the last epoch
  std::string order_out;               // the data order of every epoch, (epochs, examples) int32 .npy
  bool profile = false;                // time every kernel; print the table after the last epoch
  std::string profile_out;             // also write PREFIX.csv, .json, .trace.json (implies profile)
  std::string profile_timer = "auto";  // GPU kernel timer: auto, cupti, events
  bool profile_graphs = false;         // profile the replayed graphs instead of eager launches
  std::optional<int> profile_every;    // time one step in N (implies profile); none: the timer's default
  std::string progress = "auto";       // the progress line: auto (a terminal, long epochs), always, never
  int gpus = 0;                        // data-parallel over this many GPUs of this machine (0: one process)
  int bucket_kib = 25 << 10;           // data-parallel: the smallest all-reduce started during the backward pass
  bool sync_bn = false;                // data-parallel: BatchNorm statistics over every rank's batch
  double target_acc = 0;               // stop after the first epoch whose test accuracy reaches this (0: never)
};

// Exit code of a run that ended without reaching --target-acc (2: usage, 3: diverged).
constexpr int kTargetNotReached = 4;

// The per-step schedules (kernels/lr_schedule.h); "constant" and "cosine" (per epoch) set the factor between epochs.
bool per_step_schedule(const TrainCommand& t) {
  return t.lr_schedule == "warmup-cosine" || t.lr_schedule == "one-cycle";
}
// --warmup as the run uses it: given, else PyTorch's OneCycleLR pct_start for one-cycle, a tenth of the run for
// warmup-cosine, 0 (none) for the per-epoch schedules.
double warmup_fraction(const TrainCommand& t) {
  if (!std::isnan(t.warmup)) return t.warmup;
  return t.lr_schedule == "one-cycle" ? 0.3 : t.lr_schedule == "warmup-cosine" ? 0.1 : 0.0;
}

void validate_train(const TrainCommand& t) {
  validate_common(t.common);
  if (!std::isnan(t.warmup) && !(t.warmup >= 0 && t.warmup < 1))
    throw UsageError(cat("--warmup: must be in [0, 1), got ", t.warmup));
  if (t.warmup > 0 && !per_step_schedule(t))
    throw UsageError(cat("--warmup: applies to --lr-schedule warmup-cosine or one-cycle, not ", t.lr_schedule));
  if (t.epochs < 1 || t.epochs > 100000) throw UsageError(cat("--epochs: must be in [1, 100000], got ", t.epochs));
  if (t.batch < 1 || t.batch > 1 << 20) throw UsageError(cat("--batch: must be in [1, 1048576], got ", t.batch));
  const OptimizerConfig& o = t.optimizer;
  // The optimizer computes in fp32: a value beyond float's range would become infinite there, after set-up.
  const std::pair<const char*, double> in_float[] = {
      {"--lr", o.lr}, {"--weight-decay", o.weight_decay}, {"--eps", o.eps}};
  for (const auto& [flag, v] : in_float)
    if (std::isfinite(v) && std::abs(v) > std::numeric_limits<float>::max())
      throw UsageError(cat(flag, ": ", v, " is beyond the range of float (", std::numeric_limits<float>::max(), ")"));
  if (!(std::isfinite(o.lr) && o.lr > 0)) throw UsageError(cat("--lr: must be a positive number, got ", o.lr));
  if (!(std::isfinite(o.momentum) && o.momentum >= 0 && o.momentum < 1))
    throw UsageError(cat("--momentum: must be in [0, 1), got ", o.momentum));
  if (o.momentum != 0 && o.name != "sgd") throw UsageError("--momentum: applies to --optimizer sgd only");
  if (!(std::isfinite(o.weight_decay) && o.weight_decay >= 0))
    throw UsageError(cat("--weight-decay: must be a number >= 0, got ", o.weight_decay));
  if (!(o.beta1 >= 0 && o.beta1 < 1)) throw UsageError(cat("--beta1: must be in [0, 1), got ", o.beta1));
  if (!(o.beta2 >= 0 && o.beta2 < 1)) throw UsageError(cat("--beta2: must be in [0, 1), got ", o.beta2));
  if (!(std::isfinite(o.eps) && o.eps > 0)) throw UsageError(cat("--eps: must be a positive number, got ", o.eps));
  validate_workload(t.workload);
  if (!t.init_from.empty() && !fs::is_regular_file(t.init_from))
    throw UsageError(cat("--init-from: no file '", t.init_from, "'"));
  if (t.save_on_divergence && t.save_path.empty())
    throw UsageError("--save-on-divergence: writes beside --save PATH (as PATH.diverged-at-epoch-N): give --save too");
  if (t.save_on_divergence && t.allow_nonfinite)
    throw UsageError("--save-on-divergence: --allow-nonfinite goes on through divergence, so nothing would be written");
  if (t.checkpoint_every < 0 || t.checkpoint_every > 100000)
    throw UsageError(cat("--checkpoint-every: must be in [0, 100000], got ", t.checkpoint_every));
  if ((t.checkpoint_every > 0) != !t.checkpoint_dir.empty())
    throw UsageError(t.checkpoint_every > 0 ? "--checkpoint-every: give --checkpoint-dir DIR too"
                                            : "--checkpoint-dir: give --checkpoint-every N too");
  if (t.keep < 0) throw UsageError(cat("--keep: must be >= 0 (0 keeps every checkpoint), got ", t.keep));
  if (!t.resume_from.empty() && !fs::is_regular_file(t.resume_from))
    throw UsageError(cat("--resume: no file '", t.resume_from, "'"));
  if (!t.resume_from.empty() && !t.init_from.empty())
    throw UsageError("--resume: goes on from a checkpoint's weights; --init-from would replace them (not both)");
  if (t.train_limit < 0) throw UsageError(cat("--train-limit: must be >= 0, got ", t.train_limit));
  if (t.shift < 0 || t.shift > 8) throw UsageError(cat("--shift: must be in [0, 8], got ", t.shift));
  // Outputs are checked now, not after an hour of training.
  check_outputs({{"--save", t.save_path},
                 {"--metrics", t.metrics_path},
                 {"--init-out", t.init_out},
                 {"--order-out", t.order_out},
                 {"--profile-out", t.profile_out.empty() ? "" : t.profile_out + ".csv",
                  t.profile_out + ".csv, .json and .trace.json"}});
  if (!t.checkpoint_dir.empty()) check_output_folder("--checkpoint-dir", t.checkpoint_dir);
  parse_progress_mode(t.progress);
  if (t.profile_every && (*t.profile_every < 1 || *t.profile_every > 1'000'000))
    throw UsageError(cat("--profile-every: must be in [1, 1000000], got ", *t.profile_every));
  if (t.profile_graphs && (t.no_graphs || t.common.debug_sync))
    throw UsageError(cat("--profile-graphs: profiles the replayed CUDA graphs, and ",
                         t.no_graphs ? "--no-graphs" : "--debug-sync", " turns them off"));
  if (t.target_acc != 0 && !(t.target_acc > 0 && t.target_acc <= 1))
    throw UsageError(cat("--target-acc: a test accuracy in (0, 1], got ", t.target_acc));
  if (t.bucket_kib < 0 || t.bucket_kib > 1 << 20)
    throw UsageError(cat("--bucket-kib: must be in [0, 1048576], got ", t.bucket_kib));
  if (t.gpus < 0 || t.gpus > 64) throw UsageError(cat("--gpus: must be in [1, 64], got ", t.gpus));
  if (t.gpus > 0 && rank_place().launcher == RankPlace::Launcher::mpi)
    throw UsageError("--gpus: mpirun has started the ranks already; leave --gpus out (or mpirun)");
  const profile::TimerChoice timer = parse_profile_timer(t.profile_timer);
  if (t.profile_every > 1 && t.profile_graphs &&
      (t.common.device == "cpu" || !profile::launch_stamps_available() || timer == profile::TimerChoice::cupti ||
       timer == profile::TimerChoice::events))
    throw UsageError(
        "--profile-every: the steps of replayed graphs (--profile-graphs) are sampled by launch stamps only (a "
        "profiling build on sm_90 code)");
  if (t.gpus > 0 && t.common.device == "cpu")
    throw UsageError("--gpus: starts one rank per GPU, and --device cpu was given (mpirun starts CPU ranks)");
}

// ---- the run's flags, as a resumable checkpoint records them ----------------------------------------

std::string exact(double v) {  // text that reads back to the same double
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

// A flag that makes a run what it is: checkpoints record it as "run.<flag>", and --resume takes it from there
// unless the command line gives it, which must then say the same.
struct RunFlag {
  const char* flag;
  std::string (*get)(const TrainCommand&);
  void (*set)(TrainCommand&, const std::string&);
  const char* before = nullptr;  // a flag added later: its value in checkpoints written before it existed
  bool is_switch = false;        // a flag without a value (--flip): recorded as 1 or 0, shown as given or not
};
std::string shown(const RunFlag& f, const std::string& value) {
  if (!f.is_switch) return cat(f.flag, " ", value);
  return value == "1" ? std::string(f.flag) : cat("no ", f.flag);
}
const std::vector<RunFlag>& run_flags() {
  static const std::vector<RunFlag> flags{
      {"--model", [](const TrainCommand& t) { return t.workload.model; },
       [](TrainCommand& t, const std::string& v) { t.workload.model = v; }},
      {"--dataset", [](const TrainCommand& t) { return t.workload.dataset; },
       [](TrainCommand& t, const std::string& v) { t.workload.dataset = v; }},
      {"--epochs", [](const TrainCommand& t) { return std::to_string(t.epochs); },
       [](TrainCommand& t, const std::string& v) { t.epochs = std::stoi(v); }},
      {"--batch", [](const TrainCommand& t) { return std::to_string(t.batch); },
       [](TrainCommand& t, const std::string& v) { t.batch = std::stoi(v); }},
      {"--optimizer", [](const TrainCommand& t) { return t.optimizer.name; },
       [](TrainCommand& t, const std::string& v) { t.optimizer.name = v; }},
      {"--lr", [](const TrainCommand& t) { return exact(t.optimizer.lr); },
       [](TrainCommand& t, const std::string& v) { t.optimizer.lr = std::stod(v); }},
      {"--momentum", [](const TrainCommand& t) { return exact(t.optimizer.momentum); },
       [](TrainCommand& t, const std::string& v) { t.optimizer.momentum = std::stod(v); }},
      {"--weight-decay", [](const TrainCommand& t) { return exact(t.optimizer.weight_decay); },
       [](TrainCommand& t, const std::string& v) { t.optimizer.weight_decay = std::stod(v); }},
      {"--beta1", [](const TrainCommand& t) { return exact(t.optimizer.beta1); },
       [](TrainCommand& t, const std::string& v) { t.optimizer.beta1 = std::stod(v); }},
      {"--beta2", [](const TrainCommand& t) { return exact(t.optimizer.beta2); },
       [](TrainCommand& t, const std::string& v) { t.optimizer.beta2 = std::stod(v); }},
      {"--eps", [](const TrainCommand& t) { return exact(t.optimizer.eps); },
       [](TrainCommand& t, const std::string& v) { t.optimizer.eps = std::stod(v); }},
      {"--lr-schedule", [](const TrainCommand& t) { return t.lr_schedule; },
       [](TrainCommand& t, const std::string& v) { t.lr_schedule = v; }},
      {"--warmup", [](const TrainCommand& t) { return exact(warmup_fraction(t)); },
       [](TrainCommand& t, const std::string& v) { t.warmup = std::stod(v); }, "0"},
      {"--seed", [](const TrainCommand& t) { return std::to_string(t.seed); },
       [](TrainCommand& t, const std::string& v) { t.seed = std::stoull(v); }},
      {"--shift", [](const TrainCommand& t) { return std::to_string(t.shift); },
       [](TrainCommand& t, const std::string& v) { t.shift = std::stoi(v); }},
      {"--train-limit", [](const TrainCommand& t) { return std::to_string(t.train_limit); },
       [](TrainCommand& t, const std::string& v) { t.train_limit = std::stoll(v); }},
      {"--flip", [](const TrainCommand& t) { return std::string(t.flip ? "1" : "0"); },
       [](TrainCommand& t, const std::string& v) { t.flip = v == "1"; }, nullptr, true},
      {"--classes", [](const TrainCommand& t) { return std::to_string(t.workload.classes); },
       [](TrainCommand& t, const std::string& v) { t.workload.classes = std::stoi(v); }},
      {"--sync-bn", [](const TrainCommand& t) { return std::string(t.sync_bn ? "1" : "0"); },
       [](TrainCommand& t, const std::string& v) { t.sync_bn = v == "1"; }, "0", true},
      // The math mode: a run resumed in another would not be the run it continues (docs/bf16.md).
      {"--tf32", [](const TrainCommand& t) { return std::string(t.common.tf32 ? "1" : "0"); },
       [](TrainCommand& t, const std::string& v) { t.common.tf32 = v == "1"; }, "0", true},
      {"--bf16", [](const TrainCommand& t) { return std::string(t.common.bf16 ? "1" : "0"); },
       [](TrainCommand& t, const std::string& v) { t.common.bf16 = v == "1"; }, "0", true},
  };
  return flags;
}
std::string run_key(const RunFlag& f) { return cat("run.", f.flag + 2); }

// What a checkpoint records about the run that wrote it: the model card, which lets it stand alone
// (apps/model_card.h), the run's flags and how many epochs it has trained.
struct RunRecord {
  const TrainCommand& t;
  ModelCard card;
  int world = 1;  // data-parallel ranks: the global batch is world x batch
  CheckpointMetadata at_epoch(int epochs_trained) const {
    CheckpointMetadata m{{"seed", std::to_string(t.seed)},
                         {"epochs_trained", std::to_string(epochs_trained)},
                         {"batch", std::to_string(t.batch)},
                         {"world_size", std::to_string(world)}};
    for (const RunFlag& f : run_flags()) m[run_key(f)] = f.get(t);
    card.write_to(m);
    return m;
  }
};

// A run as it goes on from a resumable checkpoint: the command, the epochs trained, and the file, read once, so that
// the flags checked and the tensors loaded are the same file's.
struct Resumed {
  TrainCommand command;
  int trained = 0;
  std::optional<SafetensorsFile> checkpoint;
};

// The command as --resume continues it: each run flag from the checkpoint unless given, and then the same; the
// epochs it has trained. Throws UsageError naming what differs.
Resumed resumed(const TrainCommand& t, const CLI::App& cmd) {
  SafetensorsFile file = SafetensorsFile::read(t.resume_from);
  const auto& meta = file.metadata();
  auto field = [&](const std::string& key, const char* before = nullptr) -> std::string {
    const auto it = meta.find(key);
    if (it == meta.end() && before) return before;
    if (it == meta.end())
      throw UsageError(cat("--resume: '", t.resume_from, "' is no resumable checkpoint (no '", key,
                           "' in its metadata; --checkpoint-dir writes them)"));
    return it->second;
  };
  TrainCommand out = t;
  for (const RunFlag& f : run_flags()) {
    const std::string recorded = field(run_key(f), f.before);
    if (cmd.count(f.flag) == 0) {
      f.set(out, recorded);
    } else if (f.get(t) != recorded && std::string_view(f.flag) != "--epochs") {
      throw UsageError(cat("--resume: '", t.resume_from, "' was trained with ", shown(f, recorded),
                           ", this command gives ", f.is_switch ? shown(f, f.get(t)) : f.get(t),
                           " (leave the flag out to go on as it was)"));
    }
  }
  const int trained = std::stoi(field("epochs_trained"));
  // The ranks split each global batch: another number of them would be another run (pre-parallel files: 1).
  const auto world = meta.find("world_size");
  const int recorded_world = world == meta.end() ? 1 : std::stoi(world->second);
  if (recorded_world != rank_place().world)
    throw UsageError(cat("--resume: '", t.resume_from, "' was trained on ", recorded_world, " rank(s), this run has ",
                         rank_place().world, " (each global batch is split over the ranks: give the same number)"));
  if (out.lr_schedule != "constant" && out.epochs != std::stoi(field("run.epochs")))
    throw UsageError(cat("--epochs: the ", out.lr_schedule, " schedule of '", t.resume_from, "' spans ",
                         field("run.epochs"), " epochs; a resumed run must keep them"));
  if (out.epochs <= trained)
    throw UsageError(cat("--epochs: '", t.resume_from, "' has trained ", trained, " epochs already; ask for more"));
  return {out, trained, std::move(file)};
}

// Resumable checkpoints, DIR/epoch-NNNNNN.safetensors after every --checkpoint-every epochs: the model, the
// optimizer's state and each layer's run state (engine/checkpoint.h, StateTensors), written atomically; the
// newest --keep of them kept.
class CheckpointDir {
 public:
  CheckpointDir(const TrainCommand& t, const RunRecord& run) : t_(t), run_(run) {}
  void after_epoch(int epoch, const Context& ctx, const Model& model, const StateTensors& state) const {
    if (t_.checkpoint_every == 0 || epoch % t_.checkpoint_every != 0) return;
    char name[40];
    std::snprintf(name, sizeof name, "epoch-%06d.safetensors", epoch);
    const std::string path = (fs::path(t_.checkpoint_dir) / name).string();
    write_checkpoint(path, checkpoint_image(model, ctx.exec(), run_.at_epoch(epoch), state));
    spdlog::info("checkpoint: {}", path);
    if (t_.keep > 0) prune();
  }

 private:
  void prune() const {
    std::vector<fs::path> written;
    for (const auto& entry : fs::directory_iterator(t_.checkpoint_dir)) {
      const std::string name = entry.path().filename().string();
      if (name.size() == std::string_view("epoch-000000.safetensors").size() && name.starts_with("epoch-") &&
          name.ends_with(".safetensors"))
        written.push_back(entry);
    }
    std::sort(written.begin(), written.end());
    for (size_t i = 0; i + static_cast<size_t>(t_.keep) < written.size(); ++i) fs::remove(written[i]);
  }
  const TrainCommand& t_;
  const RunRecord& run_;
};

// ---- data ------------------------------------------------------------------------------------------

// ---- output ----------------------------------------------------------------------------------------

// Metrics as JSON lines, rewritten whole after each epoch through a temporary file and a rename, so
// the file on disk is always complete.
class MetricsFile {
 public:
  // `math`: the run's math mode, on every line, so that runs in different modes are told apart.
  MetricsFile(std::string path, kernels::Math math)  // the path is checked with the other outputs
      : path_(std::move(path)), math_(profile::math_name(math)) {}
  // A resumed run appends: the file's lines up to `epoch` are kept (later ones, of epochs the run trains again,
  // are not). A file that is not there starts empty.
  void resume_after(int epoch) {
    std::ifstream in(path_);
    int number = 0;
    for (std::string line; std::getline(in, line);) {
      ++number;
      const auto json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!json.is_object() || !json.contains("epoch") || !json["epoch"].is_number_integer())
        throw UsageError(cat("--metrics: line ", number, " of '", path_, "' is not a metrics line; give another file"));
      if (json["epoch"].get<int>() <= epoch) lines_ += line + "\n";
    }
  }
  void append(const EpochMetrics& m) {
    if (path_.empty()) return;
    // JSON has no NaN or infinity: such a loss is written as null, and the line says why.
    const bool nonfinite = !std::isfinite(m.train_loss) || !std::isfinite(m.test_loss);
    lines_ +=
        cat("{\"epoch\": ", m.epoch, ", \"math\": \"", math_, "\", \"train_loss\": ", number(m.train_loss, 6),
            ", \"train_acc\": ", number(m.train_acc, 6), ", \"test_loss\": ", number(m.test_loss, 6),
            ", \"test_acc\": ", number(m.test_acc, 6), ", \"epoch_ms\": ", number(m.epoch_ms, 3),
            ", \"eval_ms\": ", number(m.eval_ms, 3), ", \"capture_ms\": ", number(m.capture_ms + m.eval_capture_ms, 3),
            ", \"samples_per_s\": ", number(m.samples_per_s, 1), nonfinite ? ", \"nonfinite\": true" : "", "}\n");
    write_file_atomically(path_, lines_, "--metrics");
  }

 private:
  static std::string number(double v, int decimals) {
    if (!std::isfinite(v)) return "null";
    char text[64];
    std::snprintf(text, sizeof text, "%.*f", decimals, v);
    return text;
  }

  std::string path_;
  std::string math_;
  std::string lines_;
};

// The weights of the last epoch whose losses were finite (at first, the initial ones), held on the host for
// --save-on-divergence: one read-back per epoch, between epochs, and only when asked.
class LastGoodWeights {
 public:
  LastGoodWeights(const RunRecord& run, const Context& ctx, const Model& model, int start_epoch)
      : run_(run), ctx_(ctx), model_(model), enabled_(run.t.save_on_divergence && rank_place().leader()) {
    keep(start_epoch);
  }
  void keep(int epoch) {
    if (enabled_) image_ = checkpoint_image(model_, ctx_.exec(), run_.at_epoch(epoch));
  }
  // Writes them beside --save and says where; "" when not asked.
  std::string write(int diverged_epoch) const {
    if (!enabled_) return "";
    const std::string path = cat(run_.t.save_path, ".diverged-at-epoch-", diverged_epoch);
    CheckpointImage image = image_;
    image.metadata["diverged_at_epoch"] = std::to_string(diverged_epoch);
    write_checkpoint(path, image);
    return cat("; the weights after epoch ", diverged_epoch - 1, " are in ", path);
  }

 private:
  const RunRecord& run_;
  const Context& ctx_;
  const Model& model_;
  bool enabled_;
  CheckpointImage image_;
};

// A training loss this many times that of guessing uniformly is reported as divergence (a warning: it is finite).
constexpr double kDivergingLossFactor = 100;

// After an epoch: a loss total that is NaN or infinite stops the run (DivergedError, exit 3) with one line naming
// the epoch, its steps and the first tensor that went bad. Nothing is saved over --save.
void check_finite(const EpochMetrics& m, const TrainCommand& t, int64_t steps_per_epoch, const Context& ctx,
                  const Model& model, LastGoodWeights& last_good) {
  if (t.allow_nonfinite) return;
  if (std::isfinite(m.train_loss) && std::isfinite(m.test_loss)) {
    // Finite but far beyond guessing (ln(classes): 2.3 for 10): Adam at --lr 1e6 trains on at losses of 1e21
    // without a NaN. Such a run goes on, as it may recover, but not without a word.
    const double guessing = std::log(static_cast<double>(model.output_shape().numel()));
    if (m.train_loss > kDivergingLossFactor * guessing)
      spdlog::warn(
          "epoch {}: train loss {:.4g} is over {:.0f} times that of guessing ({:.2f}): the run is diverging; "
          "try a lower --lr",
          m.epoch, m.train_loss, kDivergingLossFactor, guessing);
    return last_good.keep(m.epoch);
  }
  const auto bad = first_nonfinite_tensor(ctx, model);
  throw DivergedError(cat("training diverged in epoch ", m.epoch, " (steps ", (m.epoch - 1) * steps_per_epoch + 1, "..",
                          m.epoch * steps_per_epoch, "): train loss ", m.train_loss, ", test loss ", m.test_loss, "; ",
                          bad ? "first non-finite tensor " + bad->describe() : "every tensor is finite",
                          t.save_path.empty() ? "" : "; --save " + t.save_path + " left as it was",
                          last_good.write(m.epoch), "; try a lower --lr, or --allow-nonfinite to go on"));
}

// Where the time of a run goes, for --target-acc: wall-clock seconds of each part, since the process started.
struct RunClock {
  double startup = 0;   // to the device's context, the flags parsed and checked
  double data = 0;      // the data sets read and uploaded, the model built
  double planning = 0;  // parameters, optimizer, the memory plan, the process group; every graph capture
  double training = 0;  // the epochs' steps (their graph captures not counted)
  double evaluation = 0;
  // Adds the seconds since `since` (from seconds_since_process_start()) to `part`, and returns now.
  static double add(double& part, double since) {
    const double now = seconds_since_process_start();
    part += now - since;
    return now;
  }
  void add_epoch(const EpochMetrics& m) {  // each pass's graph capture counts as planning
    planning += (m.capture_ms + m.eval_capture_ms) / 1e3;
    training += (m.epoch_ms - m.capture_ms) / 1e3;
    evaluation += (m.eval_ms - m.eval_capture_ms) / 1e3;
  }
};

// "reached 99.02% (target 99.00%) after epoch 2: 1.84 s from the process's start: start-up 0.21, data 0.05, ..."
void print_target_reached(const EpochMetrics& m, double target, const RunClock& c) {
  const double total = seconds_since_process_start();
  const double other = total - c.startup - c.data - c.planning - c.training - c.evaluation;
  std::printf(
      "reached %.2f%% test accuracy (target %.2f%%) after epoch %d: %.3f s from the process's start: start-up %.3f, "
      "data load %.3f, planning and capture %.3f, training %.3f, evaluation %.3f, other %.3f\n",
      100 * m.test_acc, 100 * target, m.epoch, total, c.startup, c.data, c.planning, c.training, c.evaluation, other);
  std::fflush(stdout);
}

void print_epoch(const EpochMetrics& m) {
  std::printf("epoch %3d | train loss %.4f acc %6.2f%% | test loss %.4f acc %6.2f%% | %9.1f ms | %8.0f samples/s\n",
              m.epoch, m.train_loss, 100 * m.train_acc, m.test_loss, 100 * m.test_acc, m.epoch_ms, m.samples_per_s);
  std::fflush(stdout);
}

int run_train(const TrainCommand& given, const CLI::App& cmd) {
  validate_train(given);
  // A resumed run takes its flags from the checkpoint (those not given) and starts after the epochs it trained.
  const auto [t, trained, checkpoint] =
      given.resume_from.empty() ? Resumed{given, 0, std::nullopt} : resumed(given, cmd);
  if (trained > 0) validate_train(t);
  const RankPlace& place = rank_place();
  if (t.gpus > 0 && !place.parallel()) return launch_gpu_ranks(t.gpus, command_line());
  const bool leader = place.leader();  // prints and writes; the other ranks only compute
  setup_logging(t.common);
  if (!leader) spdlog::set_level(spdlog::level::err);
  MetricsFile metrics(leader ? t.metrics_path : "", t.common.math());
  if (trained > 0) metrics.resume_after(trained);

  // Everything a user can get wrong is checked before the first log line, so an error is one line.
  RunClock clock;
  Context ctx(rank_context(t.common.context()));
  double mark = clock.startup = seconds_since_process_start();
  // --init-from's card gives the model unless --model says otherwise.
  const std::optional<ModelCard> init_card = t.init_from.empty() ? std::nullopt : read_model_card(t.init_from);
  const bool sync_batchnorm = t.sync_bn && place.world > 1;
  Workload w = load_workload(t.workload.with_card(init_card ? &*init_card : nullptr), t.batch, t.train_limit,
                             {.sync_batchnorm = sync_batchnorm});
  mark = RunClock::add(clock.data, mark);
  const auto& split = w.split;
  auto& model = w.model;
  if (!t.order_out.empty()) {
    // Every epoch's order is held at once: refuse a size no one means before allocating it (100000 epochs of
    // MNIST would be 24 GB).
    constexpr int64_t kMaxOrderBytes = int64_t(1) << 30;
    const int64_t order_bytes = int64_t(t.epochs) * split.train.count * int64_t(sizeof(int32_t));
    if (order_bytes > kMaxOrderBytes)
      throw UsageError(cat("--order-out: ", t.epochs, " epochs of ", split.train.count, " examples make ", order_bytes,
                           " bytes, over the ", kMaxOrderBytes, "-byte limit (write fewer --epochs)"));
  }
  model->init_params(ctx, t.seed);
  if (!t.init_from.empty()) {
    load_safetensors(t.init_from, *model, ctx.exec());  // validated: names, dtypes, shapes
    require_finite_checkpoint(ctx, *model, "--init-from", t.init_from);
  }

  log_device(ctx);
  spdlog::info("data: {} from {} ({} train, {} test examples)", t.workload.dataset, w.data_dir, split.train.count,
               split.test.count);
  spdlog::info("{}", model->summary());
  if (!t.init_from.empty()) spdlog::info("initial weights from {}", t.init_from);
  const RunRecord run{t, ModelCard::of(w.model_given_as, split.train), place.world};
  if (!t.init_out.empty() && leader) save_safetensors(t.init_out, *model, ctx.exec(), run.at_epoch(0));

  mark = RunClock::add(clock.planning, mark);  // the parameters, initialized or loaded
  data::DeviceBatcher train_data(ctx, split.train, /*shuffle=*/true, t.seed, t.shift, t.flip);
  if (t.shift > 0 || t.flip)
    spdlog::info("augmentation:{}{}", t.flip ? " random left-right flips" : "",
                 t.shift > 0 ? cat(t.flip ? "," : "", " random shifts of up to ", t.shift, " pixels") : "");
  data::DeviceBatcher test_data(ctx, split.test, /*shuffle=*/false, t.seed);
  mark = RunClock::add(clock.data, mark);  // both sets on the device
  if (!t.order_out.empty() && leader) {
    std::vector<int32_t> orders;
    for (int epoch = 1; epoch <= t.epochs; ++epoch) {
      auto order = train_data.order(epoch);
      orders.insert(orders.end(), order.begin(), order.end());
    }
    write_npy_i32(t.order_out, orders, {t.epochs, split.train.count});
  }
  layers::SoftmaxCrossEntropy loss;
  auto optimizer = make_optimizer(ctx.exec(), model->params(), t.optimizer);
  spdlog::info("{}, {} lr{}, batch {}, {} epochs, seed {}", optimizer->describe(), t.lr_schedule,
               per_step_schedule(t) ? cat(" (per step, warm-up ", warmup_fraction(t), " of the steps)") : "", t.batch,
               t.epochs, t.seed);

  // Every rank joins before the first step; the group carries the gradient block.
  const auto group = join_process_group(ctx, model->params().total());
  if (group)
    spdlog::info("data-parallel: {}; global batch {} ({} x {}); BatchNorm statistics {}", group->describe(),
                 t.batch * group->world(), group->world(), t.batch,
                 sync_batchnorm ? cat("over all ", group->world(), " ranks' batches (--sync-bn)") : "per rank");
  else if (t.sync_bn)
    spdlog::info("--sync-bn: one process, so the BatchNorm statistics are its batch's as without it");
  ProgressLine progress(leader ? parse_progress_mode(t.progress) : ProgressMode::never, t.epochs, stdout,
                        isatty(STDOUT_FILENO) != 0);
  TrainOptions options;
  options.group = group.get();
  options.bucket_bytes = size_t(t.bucket_kib) << 10;
  options.sync_batchnorm = sync_batchnorm;
  options.fuse_head = !t.common.no_fused_head;
  options.batch = t.batch;
  options.use_graphs = !t.no_graphs && !t.common.debug_sync;
  if (progress.wanted()) options.on_progress = [&](const EpochProgress& p) { progress.update(p); };
  if (t.lr_schedule == "cosine") {
    // Cosine annealing per epoch, PyTorch's CosineAnnealingLR(T_max=epochs) stepped once per epoch:
    // epoch e (from 1) trains at lr * (1 + cos(pi * (e - 1) / epochs)) / 2.
    options.lr_factor = [epochs = t.epochs](int epoch) {
      return 0.5 * (1.0 + std::cos(std::numbers::pi * (epoch - 1) / epochs));
    };
  }
  Trainer trainer(ctx, *model, loss, *optimizer, train_data, options);
  if (per_step_schedule(t))
    optimizer->schedule_per_step({.kind = t.lr_schedule == "one-cycle" ? kernels::LrScheduleKind::one_cycle
                                                                       : kernels::LrScheduleKind::warmup_cosine,
                                  .total_steps = int64_t(t.epochs) * trainer.steps_per_epoch(),
                                  .warmup = warmup_fraction(t)});
  StateTensors state = optimizer->state();  // what a resumable checkpoint holds beside the model
  for (auto& s : model->run_state()) state.push_back(std::move(s));
  if (trained > 0) {
    load_safetensors(*checkpoint, *model, ctx.exec(), state);
    require_finite_checkpoint(ctx, *model, "--resume", t.resume_from);
    spdlog::info("resuming after epoch {} of {} from {}", trained, t.epochs, t.resume_from);
  }
  trainer.broadcast_from_rank0(/*parameters=*/true);  // the ranks start from the same weights, rank 0's
  RunClock::add(clock.planning, mark);                // the optimizer, the process group, the memory plan
  // Profiled epochs run eagerly unless --profile-graphs asks for the replayed graphs to be timed, by launch stamps or
  // CUPTI (docs/profiler.md).
  ProfileSession profiling(
      ctx, leader && (t.profile || !t.profile_out.empty() || t.profile_graphs || t.profile_every), t.profile_out,
      /*hold=*/true, parse_profile_timer(t.profile_timer), t.profile_graphs, t.profile_every.value_or(0));

  LastGoodWeights last_good(run, ctx, *model, trained);
  const CheckpointDir checkpoints(t, run);
  int last_epoch = t.epochs;         // the last one trained: --target-acc may stop before --epochs
  std::optional<EpochMetrics> best;  // with --target-acc: the epoch of the highest test accuracy
  for (int epoch = trained + 1; epoch <= t.epochs; ++epoch) {
    progress.begin_epoch(epoch);
    profiling.resume();
    if (epoch == trained + 1 && profiling.enabled() && ctx.on_cuda() && options.use_graphs &&
        !ctx.exec().observer->times_graph_replays())
      spdlog::info(
          "profiling: CUDA graphs off, eager launches{}",
          t.profile_graphs ? " (the events timer cannot time replayed graphs)" : " (--profile-graphs keeps them)");
    EpochMetrics m = trainer.run_epoch(epoch, &test_data);
    profiling.pause();  // reads this epoch's events after its time was taken
    progress.clear();
    if (leader) print_epoch(m);
    metrics.append(m);
    check_finite(m, t, trainer.steps_per_epoch(), ctx, *model, last_good);
    if (leader) checkpoints.after_epoch(epoch, ctx, *model, state);
    clock.add_epoch(m);
    if (!best || m.test_acc > best->test_acc) best = m;
    if (t.target_acc > 0 && m.test_acc >= t.target_acc) {  // every rank has the same summed accuracy: all stop here
      if (leader) print_target_reached(m, t.target_acc, clock);
      last_epoch = epoch;
      break;
    }
  }
  profiling.finish();
  if (!t.save_path.empty() && leader) {
    save_safetensors(t.save_path, *model, ctx.exec(), run.at_epoch(last_epoch));
    spdlog::info("saved the trained weights to {}", t.save_path);
  }
  if (t.target_acc > 0 && best && best->test_acc < t.target_acc) {  // a run that reached it stopped there
    if (leader)
      std::fprintf(stderr,
                   "nanotrain: --target-acc: %.2f%% test accuracy not reached in %d epoch%s (the best, %.2f%%, after "
                   "epoch %d); %.3f s from the process's start\n",
                   100 * t.target_acc, t.epochs, t.epochs == 1 ? "" : "s", 100 * best->test_acc, best->epoch,
                   seconds_since_process_start());
    return kTargetNotReached;
  }
  return 0;
}

}  // namespace

Command register_train(CLI::App& app) {
  auto train = std::make_shared<TrainCommand>();
  auto* train_cmd = app.add_subcommand("train", "Train a model and evaluate it after every epoch");
  add_common_options(*train_cmd, train->common);
  add_workload_options(*train_cmd, train->workload,
                       "mlp, cnn, or a layer spec such as conv:16:3,bn,relu,maxpool:2,flatten,linear:10");
  train_cmd->add_option("--epochs", train->epochs, "Training epochs")->capture_default_str();
  train_cmd->add_option("--batch", train->batch, "Mini-batch size (the last partial batch is dropped)")
      ->capture_default_str();
  OptimizerConfig& o = train->optimizer;
  train_cmd->add_option("--optimizer", o.name, "sgd, adam or adamw (PyTorch's semantics)")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->capture_default_str();
  train_cmd->add_option("--lr", o.lr, "Learning rate")->capture_default_str();
  train_cmd->add_option("--momentum", o.momentum, "SGD momentum")->capture_default_str();
  train_cmd->add_option("--weight-decay", o.weight_decay, "Weight decay (L2 for sgd and adam, decoupled for adamw)")
      ->capture_default_str();
  train_cmd
      ->add_option("--lr-schedule", train->lr_schedule,
                   "constant; cosine (annealed per epoch to ~0 at the end); per step: warmup-cosine (--warmup of the "
                   "steps rising linearly, then cosine to 0) or one-cycle (PyTorch's OneCycleLR, the rate only)")
      ->check(CLI::IsMember({"constant", "cosine", "warmup-cosine", "one-cycle"}))
      ->capture_default_str();
  train_cmd->add_option("--warmup", train->warmup,
                        "Fraction of the run's steps over which a per-step schedule rises, in [0, 1) (default: 0.3 "
                        "for one-cycle, as PyTorch's pct_start; 0.1 for warmup-cosine)");
  train_cmd->add_option("--beta1", o.beta1, "Adam's first-moment decay")->capture_default_str();
  train_cmd->add_option("--beta2", o.beta2, "Adam's second-moment decay")->capture_default_str();
  train_cmd->add_option("--eps", o.eps, "Adam's denominator epsilon")->capture_default_str();
  train_cmd->add_option("--seed", train->seed, "Seed of the initial weights and the data order")
      ->check(unsigned_64_validator())
      ->capture_default_str();
  train_cmd->add_option("--metrics", train->metrics_path, "Write one JSON object per epoch to this file")
      ->check(non_empty_path());
  train_cmd->add_option("--train-limit", train->train_limit, "Train on the first N examples only (0 = all)");
  train_cmd
      ->add_option("--shift", train->shift,
                   "Training augmentation: shift each image by up to K pixels in each direction, 0 = off")
      ->capture_default_str();
  train_cmd->add_flag("--flip", train->flip,
                      "Training augmentation: mirror each image left-right with probability 1/2 (as --shift: the same "
                      "draws on CPU and GPU)");
  train_cmd
      ->add_option("--progress", train->progress,
                   "auto: a line with the epoch's progress and the time left, on a terminal, for epochs longer "
                   "than 2 s; always: for every epoch, wherever the output goes; never")
      ->capture_default_str();
  train_cmd->add_option(
      "--gpus", train->gpus,
      "Data-parallel training on N GPUs of this machine: one process each, NCCL between them, a global "
      "batch of N x --batch (mpirun -np N starts ranks on several machines instead)");
  train_cmd
      ->add_option("--bucket-kib", train->bucket_kib,
                   "Data-parallel: all-reduce the gradients in buckets of at least this many KiB, each on a second "
                   "stream as soon as the backward pass has made it final (0: one per layer); the rest after the "
                   "backward pass (the default holds the named models whole: one all-reduce)")
      ->capture_default_str();
  train_cmd
      ->add_option("--target-acc", train->target_acc,
                   "Stop after the first epoch whose test accuracy reaches this fraction (e.g. 0.99), and print the "
                   "time from the process's start, split into start-up, data load, planning and capture, training "
                   "and evaluation; exit code 4 when --epochs end without it (0: train every epoch)")
      ->capture_default_str();
  train_cmd->add_flag("--sync-bn", train->sync_bn,
                      "Data-parallel: every BatchNorm takes its training statistics over all ranks' batches "
                      "together (PyTorch's SyncBatchNorm), as one process of the global batch would; by default "
                      "each rank's own batch (as DDP)");
  train_cmd->add_flag("--no-graphs", train->no_graphs,
                      "GPU: launch every kernel eagerly instead of replaying a CUDA graph");
  train_cmd->add_flag(
      "--allow-nonfinite", train->allow_nonfinite,
      "Go on when a loss is NaN or infinite (by default the run stops with exit code 3, saving nothing)");
  train_cmd->add_flag(
      "--save-on-divergence", train->save_on_divergence,
      "When the run diverges, write the last good weights (those of the epoch before) to "
      "PATH.diverged-at-epoch-N beside --save PATH; --save itself is never overwritten by a diverged run");
  train_cmd
      ->add_option("--checkpoint-every", train->checkpoint_every,
                   "Write a resumable checkpoint (weights, optimizer state, position) after every N epochs")
      ->capture_default_str();
  train_cmd->add_option("--checkpoint-dir", train->checkpoint_dir, "Where: DIR/epoch-NNNNNN.safetensors")
      ->check(non_empty_path());
  train_cmd->add_option("--keep", train->keep, "Keep the newest K resumable checkpoints (0: all)")
      ->capture_default_str();
  train_cmd
      ->add_option("--resume", train->resume_from,
                   "Go on from a resumable checkpoint: the same run, bit for bit, from the epoch after it; flags "
                   "left out are the checkpoint's, flags given must match")
      ->check(non_empty_path());
  train_cmd->add_option("--init-from", train->init_from, "Start from these weights (safetensors) instead of --seed's")
      ->check(non_empty_path());
  train_cmd->add_option("--init-out", train->init_out, "Save the initial weights (safetensors, PyTorch's names)")
      ->check(non_empty_path());
  train_cmd->add_option("--save", train->save_path, "Save the trained weights after the last epoch (safetensors)")
      ->check(non_empty_path());
  train_cmd
      ->add_option("--order-out", train->order_out,
                   "Write every epoch's data order as an (epochs, examples) int32 .npy")
      ->check(non_empty_path());
  train_cmd->add_flag("--profile", train->profile, "Time every kernel and print the table at the end");
  train_cmd->add_option("--profile-out", train->profile_out, "Also write PREFIX.csv, PREFIX.json and PREFIX.trace.json")
      ->check(non_empty_path());
  train_cmd->add_option("--profile-timer", train->profile_timer, kProfileTimerHelp)->capture_default_str();
  train_cmd->add_option("--profile-every", train->profile_every,
                        "Time one training step (and evaluation batch) in N: a sampled profile at a fraction of the "
                        "cost; eager, with --profile-timer auto the GPU timer is then CUDA events; with "
                        "--profile-graphs, launch stamps only (implies --profile) [default: 1; 8 for --profile-graphs "
                        "with launch stamps]");
  train_cmd->add_flag(
      "--profile-graphs", train->profile_graphs,
      "Profile the replayed CUDA graphs (CUPTI; launch stamps in a profiling build) instead of eager launches "
      "(implies --profile)");

  return {train_cmd, [train, train_cmd] { return run_train(*train, *train_cmd); }};
}

}  // namespace nt::app
