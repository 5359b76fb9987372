// What the commands that train share: where the data is, and the model built for it.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "apps/model_card.h"
#include "data/dataset.h"
#include "engine/model.h"
#include "layers/builder.h"

namespace nt::app {

// The flags of every command that builds a model for a data set: --model, --dataset, --data.
struct WorkloadOptions {
  std::string model = "mlp";
  std::string dataset = "mnist";
  std::string data_dir;
  int classes = 0;                                  // 0: the largest training label + 1
  bool model_given = false, dataset_given = false;  // on the command line (else a checkpoint's card may choose)

  // The options with a checkpoint's card filling in what the command line left out (--model, --dataset, --classes).
  WorkloadOptions with_card(const ModelCard* card) const;
};

// model_help: what --model means for this command (e.g. "the saved model's architecture").
void add_workload_options(CLI::App& cmd, WorkloadOptions& o, const std::string& model_help);
void validate_workload(const WorkloadOptions& o);  // throws UsageError naming --dataset

// --data, then $NT_DATA_DIR, then ./.data/<dataset>, then the Debian package's folder (fashion-mnist);
// throws nt::Error naming --data when none exists.
std::string resolve_data_dir(const std::string& data_dir, const std::string& dataset);

struct Workload {
  std::string data_dir;
  std::string model_given_as;  // --model (or the card's spec): a preset's name or a spec
  data::DatasetSplit split;
  std::unique_ptr<Model> model;  // built for the data's sample shape and classes; parameters not yet initialized
};

// Loads the data set (only the first `train_limit` training examples when > 0) and builds the model;
// throws UsageError naming --batch when a batch is larger than the training set.
Workload load_workload(const WorkloadOptions& o, int batch, int64_t train_limit = 0,
                       const layers::BuildOptions& build = {});

}  // namespace nt::app
