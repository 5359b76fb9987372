#include "apps/workload.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "apps/command.h"
#include "layers/builder.h"

namespace nt::app {

namespace fs = std::filesystem;

void add_workload_options(CLI::App& cmd, WorkloadOptions& o, const std::string& model_help) {
  cmd.add_option("--model", o.model, model_help)->capture_default_str();
  cmd.add_option("--dataset", o.dataset, "mnist or fashion-mnist")->capture_default_str();
  cmd.add_option("--data", o.data_dir, "Folder of IDX files, raw or .gz (default: $NT_DATA_DIR, ./.data/<dataset>)")
      ->check(non_empty_path());
}

void validate_workload(const WorkloadOptions& o) {
  if (o.dataset != "mnist" && o.dataset != "fashion-mnist")
    throw UsageError(cat("--dataset: unknown dataset '", o.dataset, "' (expected mnist or fashion-mnist)"));
}

std::string resolve_data_dir(const std::string& data_dir, const std::string& dataset) {
  if (!data_dir.empty()) return data_dir;
  if (const char* env = std::getenv("NT_DATA_DIR"); env && *env) return env;
  std::vector<std::string> candidates{".data/" + dataset};
  if (dataset == "fashion-mnist") candidates.push_back("/usr/share/datasets/fashion-mnist");
  for (const auto& c : candidates)
    if (fs::is_directory(c)) return c;
  throw Error(cat("--data: no ", dataset, " folder found (looked in ./", candidates.front(),
                  dataset == "fashion-mnist" ? " and /usr/share/datasets/fashion-mnist" : "",
                  "); run scripts/fetch-data ", dataset, " or pass --data DIR"));
}

Workload load_workload(const WorkloadOptions& o, int batch, int64_t train_limit) {
  Workload w;
  w.data_dir = resolve_data_dir(o.data_dir, o.dataset);
  w.split = data::load_dataset_dir(w.data_dir, o.dataset);
  auto& train = w.split.train;
  if (train_limit > 0 && train_limit < train.count) train = data::subset(train, 0, train_limit);
  try {
    w.model = layers::build_model(o.model, Shape{train.channels, train.rows, train.cols}, train.classes);
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
