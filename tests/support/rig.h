// A complete training set-up (context, mlp, data, loss, SGD, trainer) for end-to-end tests.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "data/batcher.h"
#include "data/dataset.h"
#include "engine/trainer.h"
#include "layers/builder.h"
#include "layers/softmax_xent.h"

namespace nt::test {

const data::DatasetSplit& mnist();  // loaded once per test process

struct RigOptions {
  std::string device = "cpu";
  std::string model = "mlp";
  uint64_t seed = 1;
  int batch = 64;
  kernels::SgdHyper sgd{0.03f, 0.f, 0.f};  // unless `optimizer` names another
  OptimizerConfig optimizer{};             // used when its name is not "sgd"
  int threads = 0;
  bool use_graphs = true;
  bool fuse_head = true;                     // TrainOptions::fuse_head
  bool staged_operands = true;               // layers::BuildOptions::staged_operands
  bool gather_ahead = true;                  // TrainOptions::gather_ahead
  kernels::Math math = kernels::Math::fp32;  // ContextOptions::math: TF32 or BF16 operands (kernels/operand.h)
  std::function<void(const EpochProgress&)> on_progress;  // TrainOptions::on_progress
};

struct Rig {
  Rig(const data::Dataset& train, const RigOptions& options);

  std::vector<float> weights() const { return model->params().values().to_host<float>(ctx.exec()); }
  // Copies `from`'s parameters and buffers (BatchNorm's running statistics and counters) into this rig,
  // whatever the two backends: the whole training state under a stateless optimizer (plain SGD). The
  // optimizer's own state (velocity, Adam's moments and step) stays this rig's. Synchronizes.
  void load_state(const Rig& from);
  // Runs one step of epoch 1 and returns its mean loss (reads back: for tests only).
  double step(int64_t index);

  Context ctx;
  std::unique_ptr<Model> model;
  data::DeviceBatcher train_data;
  layers::SoftmaxCrossEntropy loss;
  std::unique_ptr<Optimizer> optimizer;
  Trainer trainer;
};

// On `device` (eagerly, or replaying the epoch's graph): two epochs tell on_progress of every mark, in order, at
// the steps Trainer::kProgressMarks spreads them over (one per step when an epoch has fewer), the last at the
// epoch's end; and the weights are the same bits as those of the same run without progress.
void check_progress_is_told(const std::string& device, bool use_graphs);

}  // namespace nt::test
