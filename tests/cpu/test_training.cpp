// Training behaviour on the CPU backend: the mlp learns MNIST, and a seed fixes the result exactly.
#include "test_support.h"

#include <cstring>
#include <tuple>

#include "layers/softmax_xent.h"
#include "rig.h"

using namespace nt;

TEST_CASE("the mlp reaches 90% test accuracy after one epoch on 5,000 MNIST images", "[cpu][training]") {
  auto train = data::subset(test::mnist().train, 0, 5000);
  // Plain SGD at lr 0.03 needs most of an MNIST epoch to pass 90%; on 5,000 images one epoch is 312
  // steps at batch 16 and lr 0.1 (measured: 91.6% with seed 1).
  test::RigOptions o;
  o.batch = 16;
  o.sgd = {0.1f, 0.f, 0.f};
  test::Rig rig(train, o);
  data::DeviceBatcher test_data(rig.ctx, test::mnist().test, false, 1);
  EpochMetrics m = rig.trainer.run_epoch(1, &test_data);
  INFO("train loss " << m.train_loss << ", test accuracy " << m.test_acc);
  CHECK(std::isfinite(m.train_loss));
  CHECK(m.test_acc >= 0.90);
}

TEST_CASE("the same seed gives bit-identical weights, whatever the thread count", "[cpu][training][determinism]") {
  auto train = data::subset(test::mnist().train, 0, 1000);
  auto run = [&](uint64_t seed, int threads) {
    test::RigOptions o;
    o.seed = seed;
    o.threads = threads;
    o.sgd = {0.03f, 0.9f, 1e-4f};
    test::Rig rig(train, o);
    rig.trainer.train_epoch(1);
    return rig.weights();
  };
  auto a = run(7, 1), b = run(7, 2), c = run(8, 2);
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)) != 0);
}

TEST_CASE("with the classifier head fused, CPU training gives the same bits as with the separate ops",
          "[cpu][training][head]") {
  // The CPU twin of the fused head is the unfused ops in the same order: fusion changes what the trainer
  // calls (the last layer runs through the loss, forward and backward), never the numbers.
  auto train = data::subset(test::mnist().train, 0, 640);
  auto test_set = data::subset(test::mnist().test, 0, 500);
  for (const char* model : {"mlp", "cnn"}) {
    auto run = [&](bool fuse) {
      test::RigOptions o;
      o.model = model;
      o.sgd = {0.05f, 0.9f, 1e-4f};
      o.fuse_head = fuse;
      test::Rig rig(train, o);
      data::DeviceBatcher test_data(rig.ctx, test_set, false, 1);
      EpochMetrics m = rig.trainer.run_epoch(1, &test_data);
      return std::make_tuple(rig.weights(), m.train_loss, m.test_loss, m.test_acc);
    };
    INFO("model " << model);
    const auto [fused_w, fused_train, fused_test, fused_acc] = run(true);
    const auto [plain_w, plain_train, plain_test, plain_acc] = run(false);
    CHECK(test::same_bits(fused_w, plain_w));
    CHECK(fused_train == plain_train);
    CHECK(fused_test == plain_test);
    CHECK(fused_acc == plain_acc);
  }
}

TEST_CASE("softmax cross-entropy absorbs the last layer only where the fused head serves it", "[cpu][training][head]") {
  Context ctx({"cpu", 1, false});
  layers::SoftmaxCrossEntropy loss;
  auto absorbs = [&](const std::string& spec, int classes, DType dtype = DType::f32) {
    auto model = layers::build_model(spec, Shape{1, 8, 8}, classes);
    model->init_params(ctx, 1, dtype);
    return loss.fuses(*model->layers().back());
  };
  CHECK(absorbs("mlp", 10));
  CHECK(absorbs("cnn", 10));
  CHECK(absorbs("linear:10", 10));                            // a single layer: the head is the whole model
  CHECK(absorbs("linear:16,relu,linear:32", 32));             // kernels::kHeadMaxClasses
  CHECK_FALSE(absorbs("linear:16,relu,linear:33", 33));       // more classes than a warp's lanes
  CHECK_FALSE(absorbs("linear:16,relu,linear:10,relu", 10));  // a ReLU after the logits
  CHECK_FALSE(absorbs("linear:16,relu,linear:10,dropout:0.1", 10));
  CHECK_FALSE(absorbs("mlp", 10, DType::f64));  // gradient checks keep the separate ops
}

TEST_CASE("progress is told at every mark of an epoch, and changes no bit", "[cpu][training][progress]") {
  test::check_progress_is_told("cpu", /*use_graphs=*/false);
}

TEST_CASE("a model's two input slots: the passes read the slot in use, views follow it, and a CPU trainer keeps one",
          "[cpu][training]") {
  // Model::compile with 2 slots (a GPU trainer's gather_ahead): each slot its own buffer; use_input switches what
  // input() and a first-layer view (flatten) alias, and a forward from either slot of the same batch gives the same
  // output. A CPU trainer never gathers ahead (no side stream to hide it on), so it compiles one slot.
  Context ctx(ContextOptions{"cpu"});
  auto model = layers::build_model("flatten,linear:16,relu,linear:10", Shape{1, 28, 28}, 10);
  model->init_params(ctx, 3);
  REQUIRE_THROWS(model->compile(ctx, 4, nullptr, 3));  // a caller's bug: an internal error
  model->compile(ctx, 4, nullptr, 2);
  REQUIRE(model->input_slots() == 2);
  CHECK_FALSE(model->prepares_input());  // a Linear has no input-only work
  CHECK(model->input(0).raw() != model->input(1).raw());
  CHECK(model->input().raw() == model->input(0).raw());
  const auto x = test::random_floats(4 * 784);
  std::vector<std::vector<float>> outputs;
  for (int slot : {0, 1}) {
    model->input(slot).copy_from_host(ctx.exec(), x.data(), x.size() * sizeof(float));
    model->use_input(slot, false);
    CHECK(model->input_slot() == slot);
    CHECK(model->input().raw() == model->input(slot).raw());
    CHECK(model->activation(1).raw() == model->input(slot).raw());  // the flatten's output aliases the slot
    model->forward(ctx.exec(), 4, Mode::eval);
    outputs.push_back(model->output().to_host<float>(ctx.exec()));
  }
  CHECK(outputs[0] == outputs[1]);
  REQUIRE_THROWS(model->use_input(2, false));

  auto train = data::subset(test::mnist().train, 0, 256);
  test::RigOptions o;  // gather_ahead on, as by default
  test::Rig rig(train, o);
  CHECK(rig.model->input_slots() == 1);
}
