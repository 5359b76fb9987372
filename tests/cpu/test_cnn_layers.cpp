// The CNN layers as a model sees them: the builder's specs and PyTorch names, the Flatten view, running
// statistics (eval mode, checkpoints with F32 and I64 buffers), Dropout's modes, and training on the CPU.
#include "test_support.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "engine/checkpoint.h"
#include "kernels/conv_batchnorm_pool.h"
#include "kernels/operand.h"
#include "layers/builder.h"
#include "layers/conv_batchnorm_pool.h"
#include "rig.h"

using namespace nt;

namespace {

struct CnnOnCpu {
  explicit CnnOnCpu(const std::string& spec = "cnn", uint64_t seed = 3)
      : ctx({"cpu", 1, false}), model(layers::build_model(spec, Shape{1, 28, 28}, 10)) {
    model->init_params(ctx, seed);
  }
  Context ctx;
  std::unique_ptr<Model> model;
};

std::vector<std::string> names(const Model& m) {
  std::vector<std::string> n;
  for (const auto& p : m.params().params()) n.push_back(p.name + " " + p.value.shape().str());
  for (const auto& b : m.params().buffers()) n.push_back(b.name + " " + b.value.shape().str());
  return n;
}

}  // namespace

TEST_CASE("the cnn has PyTorch's nn.Sequential names and shapes, buffers included", "[cpu][cnn]") {
  CnnOnCpu cnn;
  // nn.Sequential(Conv2d(1,32,3,padding=1,bias=False), BatchNorm2d(32), ReLU(), MaxPool2d(2),
  //               Conv2d(32,64,3,padding=1,bias=False), BatchNorm2d(64), ReLU(), MaxPool2d(2), Flatten(),
  //               Linear(3136,128), ReLU(), Linear(128,10))
  const std::vector<std::string> want{"0.weight (32, 1, 3, 3)",
                                      "1.weight (32)",
                                      "1.bias (32)",
                                      "4.weight (64, 32, 3, 3)",
                                      "5.weight (64)",
                                      "5.bias (64)",
                                      "9.weight (128, 3136)",
                                      "9.bias (128)",
                                      "11.weight (10, 128)",
                                      "11.bias (10)",
                                      "1.running_mean (32)",
                                      "1.running_var (32)",
                                      "1.num_batches_tracked ()",
                                      "5.running_mean (64)",
                                      "5.running_var (64)",
                                      "5.num_batches_tracked ()"};
  CHECK(names(*cnn.model) == want);
  CHECK(cnn.model->output_shape() == Shape{10});
  CHECK(cnn.model->params().count() == 32 * 9 + 64 + 64 * 32 * 9 + 128 + 3136 * 128 + 128 + 1280 + 10);
}

TEST_CASE("a leading conv with few taps, bn and max-pool fuse into one layer, and others stay apart", "[cpu][cnn]") {
  auto first_is_stem = [](const char* spec, Shape input) {
    const auto model = layers::build_model(spec, std::move(input), 10);
    return dynamic_cast<const layers::ConvBatchNormPool*>(model->layers()[0].get()) != nullptr;
  };
  CHECK(first_is_stem("cnn", Shape{1, 28, 28}));
  CHECK(first_is_stem("conv:8:3,bn,maxpool:2,flatten,linear:10", Shape{3, 8, 8}));        // 27 taps
  CHECK_FALSE(first_is_stem("conv:8:3,bn,maxpool:2,flatten,linear:10", Shape{4, 8, 8}));  // 36 taps
  CHECK_FALSE(first_is_stem("conv:8:3,bn,relu,flatten,linear:10", Shape{1, 8, 8}));       // no max-pool
  CHECK_FALSE(first_is_stem("conv:8:3,relu,bn,maxpool:2,flatten,linear:10", Shape{1, 8, 8}));
  CHECK_FALSE(first_is_stem("conv:8:3,maxpool:2,bn,flatten,linear:10", Shape{1, 8, 8}));
  CHECK_FALSE(first_is_stem("conv:8:3,bn,maxpool:3:2,flatten,linear:10", Shape{1, 8, 8}));  // stride != window
  const auto cnn = layers::build_model("cnn", Shape{1, 28, 28}, 10);
  CHECK(cnn->layers()[0]->describe() == "conv 1->32 3x3 stride 1 pad 1 (no bias) + batchnorm2d 32 +relu +maxpool 2");
  CHECK(cnn->layers()[1]->describe() == "conv 32->64 3x3 stride 1 pad 1 (no bias)");
}

TEST_CASE(
    "the CPU stem stages its output as the GPU's does (y rounded to TF32 or BF16, channels-last), and its backward's "
    "ReLU reads it there",
    "[cpu][cnn][bf16]") {
  // The CPU twin of ConvBatchNormPoolArgs::y_staged (kernels/conv_batchnorm_pool.h), alone or with y beside it,
  // against the same op with y alone, in both formats (the math also rounds the stem's operands, the same in every
  // run). Written beside the staged copy, y has the bits it has alone.
  const kernels::Math math = GENERATE(kernels::Math::tf32, kernels::Math::bf16);
  kernels::Exec exec;
  exec.math = math;
  const kernels::ConvBatchNormPoolShape stem{kernels::Conv2dShape{3, 1, 9, 7, 8, 3, 3, 1, 1}, 2};
  const int64_t planes = int64_t(stem.pool().p()) * stem.pool().q();
  const size_t pooled = size_t(3 * 8 * planes), C = 8;
  const auto x = test::random_floats(stem.conv.x_size()), w = test::random_floats(stem.conv.w_size());
  const auto dy = test::random_floats(pooled);
  std::vector<std::vector<float>> y_bits;
  auto run = [&](bool staged, bool with_y) {
    std::vector<float> y(pooled, test::kPoison), mean(C), invstd(C), dw(stem.conv.w_size()), dgamma(C), dbeta(C);
    std::vector<uint32_t> y_staged(staged ? test::staged_words(math, pooled) : 0);
    std::vector<int32_t> argmax(pooled);
    std::vector<float> ws(kernels::conv_batchnorm_pool_workspace_floats(Backend::cpu, stem));
    kernels::BatchNormHyper h;
    h.relu = true;
    const kernels::ConvBatchNormPoolArgs<float> a{.shape = stem,
                                                  .hyper = h,
                                                  .x = x.data(),
                                                  .w = w.data(),
                                                  .y = with_y ? y.data() : nullptr,
                                                  .argmax = argmax.data(),
                                                  .save_mean = mean.data(),
                                                  .save_invstd = invstd.data(),
                                                  .dy = dy.data(),
                                                  .dw = dw.data(),
                                                  .dgamma = dgamma.data(),
                                                  .dbeta = dbeta.data(),
                                                  .workspace = ws.data(),
                                                  .y_staged = staged ? y_staged.data() : nullptr};
    kernels::conv_batchnorm_pool_forward_train(exec, a);
    kernels::conv_batchnorm_pool_backward(exec, a);
    std::vector<float> out =
        staged ? test::unstaged_copy(math, y_staged, 3, 8, planes) : kernels::rounded_operands(y, math);
    for (const auto& v : {mean, invstd, dw, dgamma, dbeta}) out.insert(out.end(), v.begin(), v.end());
    out.insert(out.end(), argmax.begin(), argmax.end());
    if (with_y) y_bits.push_back(y);
    return out;
  };
  const auto alone = run(false, true);
  CHECK(test::same_bits(run(true, false), alone));
  CHECK(test::same_bits(run(true, true), alone));
  REQUIRE(y_bits.size() == 2);
  CHECK(test::same_bits(y_bits[1], y_bits[0]));
}

TEST_CASE("bad cnn specs fail with one message naming --model and the item", "[cpu][cnn]") {
  auto build = [](const std::string& spec) { layers::build_model(spec, Shape{1, 28, 28}, 10); };
  using test::Contains;
  REQUIRE_THROWS_WITH(build("conv:8:3,linear:10"), Contains("flatten"));
  REQUIRE_THROWS_WITH(build("conv:8,flatten,linear:10"), Contains("unknown model or layer 'conv:8'"));
  REQUIRE_THROWS_WITH(build("conv:0:3,flatten,linear:10"), Contains("'conv:0:3' needs a positive integer"));
  REQUIRE_THROWS_WITH(build("conv:8:3,dropout:1.5,flatten,linear:10"), Contains("probability in [0, 1)"));
  REQUIRE_THROWS_WITH(build("maxpool:40,flatten,linear:10"), Contains("maxpool 40"));
  REQUIRE_THROWS_WITH(build("conv:8:31:1:0,flatten,linear:10"), Contains("smaller than the kernel"));
  REQUIRE_THROWS_WITH(build("conv:8:3,flatten,linear:10,bn,relu,linear:12"), Contains("12"));
}

TEST_CASE("Flatten is a view: its output aliases its input", "[cpu][cnn]") {
  CnnOnCpu cnn;
  cnn.model->compile(cnn.ctx, 4);
  // Layers: 0 conv+bn+relu+maxpool (the fused stem), 1 conv, 2 bn+relu+maxpool, 3 flatten, 4 linear+relu,
  // 5 linear.
  REQUIRE(cnn.model->layers()[3]->is_view());
  CHECK(cnn.model->activation(4).raw() == cnn.model->activation(3).raw());
  CHECK(cnn.model->activation(4).shape() == Shape{4, 3136});
}

TEST_CASE("BatchNorm in eval mode uses the running statistics that training moved", "[cpu][cnn][batchnorm]") {
  CnnOnCpu net("linear:6,bn,linear:10", 5);
  net.model->compile(net.ctx, 8);
  auto x = test::random_floats(8 * 784);
  std::memcpy(net.model->input().f32(), x.data(), x.size() * sizeof(float));
  auto eval_out = [&] {
    net.model->forward(net.ctx.exec(), 8, Mode::eval);
    return net.model->output().to_host<float>(net.ctx.exec());
  };
  const auto before = eval_out();
  net.model->forward(net.ctx.exec(), 8, Mode::train);
  const auto& buffers = net.model->params().buffers();
  REQUIRE(buffers.size() == 3);
  CHECK(buffers[2].value.to_host<int64_t>(net.ctx.exec())[0] == 1);  // num_batches_tracked
  // running_mean = 0.9*0 + 0.1*batch mean of the linear's outputs: no longer all zero.
  const auto mean = buffers[0].value.to_host<float>(net.ctx.exec());
  CHECK(std::any_of(mean.begin(), mean.end(), [](float v) { return v != 0.f; }));
  const auto after = eval_out();
  CHECK(before != after);      // eval reads the moved statistics
  CHECK(eval_out() == after);  // and does not move them
}

TEST_CASE("checkpoints carry running statistics (F32) and num_batches_tracked (I64) and restore them",
          "[cpu][cnn][checkpoint]") {
  const auto dir = std::filesystem::temp_directory_path() / cat("nt_cnn_ckpt_", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "cnn.safetensors").string();
  auto train = data::subset(test::mnist().train, 0, 256);
  test::RigOptions o;
  o.model = "conv:4:3,bn,relu,maxpool:2,flatten,linear:10";
  o.optimizer = OptimizerConfig{"adam", 1e-3};
  test::Rig rig(train, o);
  rig.trainer.train_epoch(1);  // 4 steps
  save_safetensors(path, *rig.model, rig.ctx.exec());

  const auto file = SafetensorsFile::read(path);
  const auto* counter = file.find("1.num_batches_tracked");
  REQUIRE(counter);
  CHECK(counter->dtype == "I64");
  CHECK(counter->shape.empty());
  int64_t batches = 0;
  std::memcpy(&batches, file.bytes(*counter), sizeof batches);
  CHECK(batches == 4);
  REQUIRE(file.find("1.running_var"));
  CHECK(file.find("1.running_var")->dtype == "F32");

  CnnOnCpu fresh(o.model, 99);
  load_safetensors(path, *fresh.model, fresh.ctx.exec());
  const auto& want = rig.model->params().buffers();
  const auto& got = fresh.model->params().buffers();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(got[i].name);
    if (got[i].value.dtype() == DType::i64)
      CHECK(got[i].value.to_host<int64_t>(fresh.ctx.exec()) == want[i].value.to_host<int64_t>(rig.ctx.exec()));
    else
      CHECK(got[i].value.to_host<float>(fresh.ctx.exec()) == want[i].value.to_host<float>(rig.ctx.exec()));
  }
  CHECK(fresh.model->params().values().to_host<float>(fresh.ctx.exec()) == rig.weights());

  // A model without the buffers refuses the file, naming them.
  CnnOnCpu other("conv:4:3,relu,maxpool:2,flatten,linear:10");
  REQUIRE_THROWS_WITH(load_safetensors(path, *other.model, other.ctx.exec()), test::Contains("1.running_mean"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("Dropout is the identity in eval and drops about p in training", "[cpu][cnn][dropout]") {
  CnnOnCpu net("flatten,dropout:0.25,linear:10", 1);
  net.model->compile(net.ctx, 32);
  auto x = test::random_floats(32 * 784, 0.5f, 1.f);  // no zeros of its own
  std::memcpy(net.model->input().f32(), x.data(), x.size() * sizeof(float));
  net.model->forward(net.ctx.exec(), 32, Mode::eval);
  // Layers: 0 flatten (view), 1 dropout, 2 linear. Activation 2 is dropout's output.
  CHECK(net.model->activation(2).to_host<float>(net.ctx.exec()) == x);
  net.model->forward(net.ctx.exec(), 32, Mode::train);
  const auto first = net.model->activation(2).to_host<float>(net.ctx.exec());
  const auto dropped = std::count(first.begin(), first.end(), 0.f);
  const double fraction = double(dropped) / double(first.size());
  CHECK(std::abs(fraction - 0.25) < 0.01);  // 25,088 draws: 4 sigma is 0.011
  for (size_t i = 0; i < first.size(); ++i)
    if (first[i] != 0.f) REQUIRE(first[i] == x[i] / 0.75f);
  net.model->forward(net.ctx.exec(), 32, Mode::train);
  CHECK(net.model->activation(2).to_host<float>(net.ctx.exec()) != first);  // a fresh mask every step
}

TEST_CASE("the cnn learns on the CPU: Adam, 40 steps of 32 lower the loss", "[cpu][cnn][training]") {
  auto train = data::subset(test::mnist().train, 0, 40 * 32);
  test::RigOptions o;
  o.model = "cnn";
  o.batch = 32;
  o.optimizer = OptimizerConfig{"adam", 1e-3};
  test::Rig rig(train, o);
  double first = 0, last = 0;
  for (int64_t s = 0; s < 40; ++s) {
    const double loss = rig.step(s);
    if (s < 5) first += loss / 5;
    if (s >= 35) last += loss / 5;
  }
  INFO("mean loss of steps 0-4: " << first << ", of steps 35-39: " << last);
  CHECK(last < 0.5 * first);
}

TEST_CASE("the cnn gives bit-identical weights with 1 and 2 threads", "[cpu][cnn][determinism]") {
  auto train = data::subset(test::mnist().train, 0, 8 * 32);
  auto run = [&](int threads) {
    test::RigOptions o;
    o.model = "conv:8:3,bn,relu,maxpool:2,conv:8:3,bn,relu,maxpool:2,flatten,dropout:0.3,linear:16,relu,linear:10";
    o.batch = 32;
    o.threads = threads;
    o.optimizer = OptimizerConfig{"adamw", 1e-3, 0, 0.01};
    test::Rig rig(train, o);
    rig.trainer.train_epoch(1);
    return rig.weights();
  };
  CHECK(run(1) == run(2));
}

TEST_CASE("the learning-rate factor reaches the update: 0 freezes the weights, 1 restores training",
          "[cpu][cnn][optim]") {
  auto train = data::subset(test::mnist().train, 0, 4 * 32);
  for (const char* name : {"sgd", "adam", "adamw"}) {
    INFO(name);
    test::RigOptions o;
    o.model = "conv:4:3,bn,relu,maxpool:2,flatten,linear:10";
    o.batch = 32;
    o.optimizer = OptimizerConfig{name, 1e-2, 0, 0.01};
    if (std::string(name) == "sgd") o.optimizer.weight_decay = 0;  // make_optimizer builds sgd from it as well
    test::Rig rig(train, o);
    const auto before = rig.weights();
    rig.optimizer->set_lr_factor(rig.ctx.exec(), 0.f);
    rig.trainer.train_epoch(1);
    CHECK(rig.weights() == before);
    rig.optimizer->set_lr_factor(rig.ctx.exec(), 1.f);
    rig.trainer.train_epoch(2);
    CHECK(rig.weights() != before);
  }
}
