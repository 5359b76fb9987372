#include "apps/workload.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "apps/command.h"
#include "layers/builder.h"

namespace nt::app {

namespace fs = std::filesystem;

void add_workload_options(CLI::App& cmd, WorkloadOptions& o, const std::string& model_help) {
  cmd.add_option("--model", o.model, model_help)->capture_default_str()->each([&o](const std::string&) {
    o.model_given = true;
  });
  cmd.add_option("--dataset", o.dataset, "mnist, fashion-mnist, cifar10, or any name for a --data folder of IDX files")
      ->capture_default_str()
      ->each([&o](const std::string&) { o.dataset_given = true; });
  cmd.add_option("--data", o.data_dir, "Folder of IDX files, raw or .gz (default: $NT_DATA_DIR, ./.data/<dataset>)")
      ->check(non_empty_path());
  cmd.add_option("--classes", o.classes, "Number of classes (0: the largest training label + 1)")
      ->capture_default_str();
}

WorkloadOptions WorkloadOptions::with_card(const ModelCard* card) const {
  WorkloadOptions o = *this;
  if (card && !model_given) o.model = card->preset.empty() ? card->model_spec : card->preset;
  if (card && !dataset_given && !card->dataset.empty()) o.dataset = card->dataset;
  if (card && o.classes == 0) o.classes = card->classes;
  return o;
}

void validate_workload(const WorkloadOptions& o) {
  // Any name: mnist, fashion-mnist and cifar10 have folders of their own (scripts/fetch-data), any other names a
  // folder of IDX files given with --data. It becomes a folder name, so a path is refused.
  const bool plain =
      !o.dataset.empty() && o.dataset.size() <= 64 &&
      std::all_of(
          o.dataset.begin(), o.dataset.end(),
          [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'; }) &&
      o.dataset.find("..") == std::string::npos;
  if (!plain)
    throw UsageError(cat("--dataset: '", o.dataset, "' is no data set name (letters, digits, '-', '_', '.'; ",
                         "e.g. mnist, fashion-mnist, cifar10, or any name with --data DIR)"));
  if (o.classes < 0 || o.classes > 256) throw UsageError(cat("--classes: must be in [0, 256], got ", o.classes));
}

std::string resolve_data_dir(const std::string& data_dir, const std::string& dataset) {
  if (!data_dir.empty()) return data_dir;
  // $NT_DATA_DIR is MNIST's folder (scripts/fetch-data mnist, the tests): it serves no other data set.
  if (const char* env = std::getenv("NT_DATA_DIR"); env && *env && dataset == "mnist") return env;
  std::vector<std::string> candidates{".data/" + dataset};
  if (dataset == "fashion-mnist") candidates.push_back("/usr/share/datasets/fashion-mnist");
  for (const auto& c : candidates)
    if (fs::is_directory(c)) return c;
  throw Error(cat("--data: no ", dataset, " folder found (looked in ./", candidates.front(),
                  dataset == "fashion-mnist" ? " and /usr/share/datasets/fashion-mnist" : "",
                  "); run scripts/fetch-data ", dataset, " or pass --data DIR"));
}

Workload load_workload(const WorkloadOptions& o, int batch, int64_t train_limit, const layers::BuildOptions& build) {
  Workload w;
  w.data_dir = resolve_data_dir(o.data_dir, o.dataset);
  w.model_given_as = o.model;
  w.split = data::load_dataset_dir(w.data_dir, o.dataset, o.classes);
  auto& train = w.split.train;
  if (train_limit > 0 && train_limit < train.count) train = data::subset(train, 0, train_limit);
  try {
    w.model = layers::build_model(o.model, Shape{train.channels, train.rows, train.cols}, train.classes, build);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {  // a spec the data cannot take is the flag's fault as much as a malformed one
    const std::string what = e.what();
    throw UsageError(what.starts_with("--model") ? what : "--model: " + what);
  }
  if (batch > train.count)
    throw UsageError(cat("--batch: ", batch, " is larger than the training set (", train.count, " examples)"));
  return w;
}

}  // namespace nt::app
