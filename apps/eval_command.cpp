// nanotrain eval: load a saved model (safetensors) and print its test loss and accuracy; with --confusion, where it
// fails: the confusion matrix and each class's recall and precision; --json writes the same, --misclassified the
// images it got wrong, as PNG files for a person to look at.
//
// The evaluation is Trainer::evaluate, the very code `train` runs after each epoch, so a model saved by
// `train --save` evaluates here to exactly the last epoch's test accuracy (same batch size, same device).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "apps/command.h"
#include "apps/confusion.h"
#include "apps/inference.h"
#include "apps/model_card.h"
#include "apps/workload.h"
#include "core/atomic_file.h"
#include "data/image.h"
#include "engine/checkpoint.h"

namespace nt::app {

namespace {

namespace fs = std::filesystem;

struct EvalCommand {
  CommonOptions common;
  WorkloadOptions workload;
  std::string load_path;
  int batch = 64;
  bool confusion = false;
  std::string json_path;
  std::string misclassified_dir;
  int misclassified_max = 100;
};

void validate_eval(const EvalCommand& e) {
  validate_common(e.common);
  if (e.batch < 1 || e.batch > 1 << 20) throw UsageError(cat("--batch: must be in [1, 1048576], got ", e.batch));
  validate_workload(e.workload);
  std::error_code ec;
  if (!fs::is_regular_file(e.load_path, ec)) throw UsageError(cat("--load: no file '", e.load_path, "'"));
  if (e.misclassified_max < 1 || e.misclassified_max > 1'000'000)
    throw UsageError(cat("--misclassified-max: must be in [1, 1000000], got ", e.misclassified_max));
  check_outputs({{"--json", e.json_path}});
  if (!e.misclassified_dir.empty()) check_output_folder("--misclassified", e.misclassified_dir);
}

// A class name as part of a file name: letters, digits, '-' and '_' kept, anything else '_'.
std::string file_safe(std::string name) {
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  return name;
}

// Up to `max` misclassified test images, as PNG: INDEX-label-NAME-pred-NAME.png, in test-set order.
int write_misclassified(const EvalCommand& e, const data::Dataset& test, const Confusion& confusion,
                        const ModelCard& card) {
  int written = 0;
  const auto size = static_cast<size_t>(test.image_size());
  for (int64_t i = 0; i < test.count && written < e.misclassified_max; ++i) {
    const int label = test.labels[static_cast<size_t>(i)], predicted = confusion.predictions()[static_cast<size_t>(i)];
    if (label == predicted) continue;
    data::Image image{test.channels, test.rows, test.cols,
                      std::vector<uint8_t>(test.images.begin() + static_cast<std::ptrdiff_t>(i * size),
                                           test.images.begin() + static_cast<std::ptrdiff_t>((i + 1) * size))};
    char index[32];
    std::snprintf(index, sizeof index, "%05lld", static_cast<long long>(i));
    data::write_png((fs::path(e.misclassified_dir) / cat(index, "-label-", file_safe(card.class_name(label)), "-pred-",
                                                         file_safe(card.class_name(predicted)), ".png"))
                        .string(),
                    image);
    ++written;
  }
  return written;
}

int run_eval(const EvalCommand& e) {
  validate_eval(e);
  setup_logging(e.common);

  Context ctx(e.common.context());
  // The checkpoint's card names the model and data set unless --model or --dataset say otherwise.
  const std::optional<ModelCard> saved_card = read_model_card(e.load_path);
  if (!saved_card && !e.workload.model_given)
    throw UsageError(cat("--load: '", e.load_path, "' has no model card in its metadata (written before cards): ",
                         "give --model with the spec it was trained with"));
  Workload w = load_workload(e.workload.with_card(saved_card ? &*saved_card : nullptr), 1);
  auto& test = w.split.test;
  const ModelCard card = ModelCard::of(w.model_given_as, w.split.train);
  if (saved_card) {
    if (saved_card->input_shape != card.input_shape || saved_card->classes != card.classes)
      throw Error(cat("--load: '", e.load_path, "' takes ", saved_card->input_shape.str(), " inputs in ",
                      saved_card->classes, " classes, but the ", test.name, " data in ", w.data_dir, " has ",
                      card.input_shape.str(), " in ", card.classes));
    test.mean = saved_card->mean;  // the model's normalization, as it was trained
    test.std = saved_card->std;
  }
  auto& model = w.model;
  model->init_params(ctx, 0);  // lays out the parameters; every value is replaced by the file's
  load_safetensors(e.load_path, *model, ctx.exec());
  require_finite_checkpoint(ctx, *model, "--load", e.load_path);

  log_device(ctx);
  spdlog::info("{}", model->summary());
  const bool per_example = e.confusion || !e.json_path.empty() || !e.misclassified_dir.empty();
  const Inference run = run_inference(ctx, *model, test, e.batch, e.common, per_example);
  const EvalResult& r = run.result;
  const auto examples = test.count;
  const auto correct = static_cast<long long>(r.accuracy * static_cast<double>(examples) + 0.5);
  std::printf("test loss %.6f | test acc %.2f%% (%lld/%lld) | %.1f ms\n", r.loss, 100 * r.accuracy, correct,
              static_cast<long long>(examples), r.ms);
  if (!per_example) return 0;

  const Confusion confusion(run.logits, test.labels, card.classes);
  NT_CHECK(confusion.correct() == correct, "the confusion matrix counts ", confusion.correct(), " correct, the loss ",
           correct);
  if (e.confusion) std::printf("%s", confusion.table(saved_card ? *saved_card : card).c_str());
  if (!e.json_path.empty()) {
    nlohmann::json json = confusion.json(saved_card ? *saved_card : card);
    json["checkpoint"] = e.load_path;
    json["examples"] = examples;
    json["loss"] = r.loss;
    json["accuracy"] = r.accuracy;
    write_file_atomically(e.json_path, json.dump() + "\n", "--json");
  }
  if (!e.misclassified_dir.empty()) {
    const int written = write_misclassified(e, test, confusion, saved_card ? *saved_card : card);
    spdlog::info("wrote {} of {} misclassified images to {}", written, examples - correct, e.misclassified_dir);
  }
  return 0;
}

}  // namespace

Command register_eval(CLI::App& app) {
  auto eval = std::make_shared<EvalCommand>();
  auto* cmd = app.add_subcommand("eval", "Evaluate a saved model (safetensors) on the test set");
  add_common_options(*cmd, eval->common);
  add_workload_options(*cmd, eval->workload, "The model's spec (default: the checkpoint's own)");
  cmd->add_option("--load", eval->load_path, "The model to evaluate (from train --save)")
      ->required()
      ->check(non_empty_path());
  cmd->add_option("--batch", eval->batch, "Evaluation batch size")->capture_default_str();
  cmd->add_flag("--confusion", eval->confusion, "Print the confusion matrix and each class's recall and precision");
  cmd->add_option("--json", eval->json_path, "Write loss, accuracy, the confusion matrix and every prediction as JSON")
      ->check(non_empty_path());
  cmd->add_option("--misclassified", eval->misclassified_dir,
                  "Write misclassified test images to this folder as INDEX-label-L-pred-P.png")
      ->check(non_empty_path());
  cmd->add_option("--misclassified-max", eval->misclassified_max, "At most this many of them")->capture_default_str();
  return {cmd, [eval] { return run_eval(*eval); }};
}

}  // namespace nt::app
