#include "rig.h"

#include "test_support.h"

namespace nt::test {

const data::DatasetSplit& mnist() {
  static const data::DatasetSplit split = data::load_dataset_dir(mnist_dir(), "mnist");
  return split;
}

namespace {
Model& initialized(Model& model, const Context& ctx, uint64_t seed) {
  model.init_params(ctx, seed);
  return model;
}

OptimizerConfig optimizer_config(const RigOptions& o) {
  if (o.optimizer.name != "sgd") return o.optimizer;
  OptimizerConfig c;
  c.lr = o.sgd.lr, c.momentum = o.sgd.momentum, c.weight_decay = o.sgd.weight_decay;
  return c;
}

TrainOptions train_options(const RigOptions& o) {
  TrainOptions t;
  t.batch = o.batch;
  t.use_graphs = o.use_graphs;
  t.fuse_head = o.fuse_head;
  t.gather_ahead = o.gather_ahead;
  t.on_progress = o.on_progress;
  return t;
}
}  // namespace

Rig::Rig(const data::Dataset& train, const RigOptions& o)
    : ctx({o.device, o.threads, false, true, o.math}),
      model(layers::build_model(o.model, Shape{train.channels, train.rows, train.cols}, train.classes,
                                {.staged_operands = o.staged_operands})),
      train_data(ctx, train, true, o.seed),
      optimizer(make_optimizer(ctx.exec(), initialized(*model, ctx, o.seed).params(), optimizer_config(o))),
      trainer(ctx, *model, loss, *optimizer, train_data, train_options(o)) {
  train_data.begin_epoch(ctx.exec(), 1);
}

void Rig::load_state(const Rig& from) {
  auto& to = model->params();
  const auto& src = from.model->params();
  REQUIRE(to.total() == src.total());
  REQUIRE(to.buffers().size() == src.buffers().size());
  const auto w = from.weights();
  to.values().copy_from_host(ctx.exec(), w.data(), w.size() * sizeof(float));
  for (size_t i = 0; i < src.buffers().size(); ++i) {
    const Tensor& s = src.buffers()[i].value;
    const Tensor& d = to.buffers()[i].value;
    REQUIRE((s.dtype() == d.dtype() && s.shape() == d.shape()));
    if (s.dtype() == DType::i64) {
      const auto v = s.to_host<int64_t>(from.ctx.exec());
      d.copy_from_host(ctx.exec(), v.data(), d.bytes());
    } else {
      const auto v = s.to_host<float>(from.ctx.exec());
      d.copy_from_host(ctx.exec(), v.data(), d.bytes());
    }
  }
}

double Rig::step(int64_t index) {
  auto before = trainer.read_train_totals(1).first;
  trainer.enqueue_train_step(index);
  auto after = trainer.read_train_totals(1).first;
  return (after - before);  // read_train_totals(1) divides by one batch: the step's mean loss
}

void check_progress_is_told(const std::string& device, bool use_graphs) {
  // 100 steps spread 50 marks over 2-step strides; 20 steps have a mark each.
  for (const int64_t steps : {100, 20}) {
    const auto train = data::subset(mnist().train, 0, steps * 64);
    RigOptions o;
    o.device = device;
    o.use_graphs = use_graphs;
    o.sgd = {0.05f, 0.9f, 1e-4f};
    std::vector<int64_t> told;
    std::vector<double> paces;
    auto run = [&](bool progress) {
      RigOptions r = o;
      if (progress)
        r.on_progress = [&](const EpochProgress& p) {
          CHECK(p.steps == steps);
          told.push_back(p.steps_done);
          paces.push_back(p.ms_per_step);
        };
      Rig rig(train, r);
      for (int epoch = 1; epoch <= 2; ++epoch) rig.trainer.train_epoch(epoch);
      return rig.weights();
    };
    const auto plain = run(false);
    const auto watched = run(true);
    INFO(device << (use_graphs ? ", graphs" : ", eager") << ", " << steps << " steps an epoch");
    CHECK(same_bits(plain, watched));
    const int64_t marks = std::min<int64_t>(steps, Trainer::kProgressMarks);
    std::vector<int64_t> want;
    for (int epoch = 1; epoch <= 2; ++epoch)
      for (int64_t m = 0; m < marks; ++m) want.push_back(steps * (m + 1) / marks);
    CHECK(told == want);
    for (size_t i = 0; i < paces.size(); ++i) {  // none at an epoch's first mark, then the device's pace
      INFO("report " << i);
      CHECK((i % static_cast<size_t>(marks) == 0 ? paces[i] == 0 : paces[i] > 0));
    }
  }
}

}  // namespace nt::test
