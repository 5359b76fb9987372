// The engine's side of the op-by-op parity study (bench/parity_ops.py): runs the parity test's training run
// (tests/cuda/test_parity_cuda.cpp: plain SGD from an --init-out file, epoch 1's data order) and writes, for chosen
// steps, every tensor of the step: the weights before it, the batch, each layer's input, the logits, the loss
// gradient, every activation gradient and parameter gradient, and the weights after the update. It writes the loss
// of every step too. PyTorch then recomputes each op from the engine's own inputs, so that each op's difference is
// seen alone, not mixed with the drift of the steps before.
//
//   parity_trace --init init.safetensors --out trace.safetensors [--device cuda] [--steps 200] [--trace 1,2,100]
//
// Tensor names: loss (steps) F64; s<N>.x, s<N>.labels, s<N>.in<i> (input of layer i), s<N>.logits,
// s<N>.dlogits, s<N>.din<i>, s<N>.w.<param>, s<N>.g.<param>, s<N>.w_after.<param>, for each traced step N (from 1).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>

#include "data/batcher.h"
#include "data/dataset.h"
#include "engine/checkpoint.h"
#include "engine/trainer.h"
#include "layers/builder.h"
#include "layers/softmax_xent.h"

using namespace nt;

namespace {

NamedTensor host(const std::string& name, const Tensor& t, int rows, const kernels::Exec& exec) {
  std::vector<int64_t> shape = t.shape().dims();
  const Tensor part = rows > 0 ? t.rows(rows) : t;
  if (rows > 0) shape[0] = rows;
  NamedTensor out{name, t.dtype() == DType::i64 ? "I64" : "F32", shape, std::vector<uint8_t>(part.bytes())};
  kernels::copy_device_to_host(exec, out.bytes.data(), part.raw(), out.bytes.size());
  return out;
}

void add_params(std::vector<NamedTensor>& out, const std::string& prefix, const ParamStore& params, bool grads,
                const kernels::Exec& exec) {
  for (const auto& p : params.params()) out.push_back(host(prefix + p.name, grads ? p.grad : p.value, 0, exec));
}

}  // namespace

int main(int argc, char** argv) {
  std::string init, out, device = "cuda", data_dir, model_name = "mlp", trace = "1,2,3,50,100,150,151,200";
  int steps = 200, batch = 64;
  float lr = 0.03f;
  uint64_t seed = 1;
  CLI::App app{"The engine's tensors of the parity run, step by step, for bench/parity_ops.py"};
  app.add_option("--init", init, "Initial weights (nanotrain train --init-out)")->required();
  app.add_option("--out", out, "The trace to write (safetensors)")->required();
  app.add_option("--device", device, "cpu or cuda")->capture_default_str();
  app.add_option("--data", data_dir, "MNIST folder")->required();
  app.add_option("--model", model_name)->capture_default_str();
  app.add_option("--steps", steps, "Steps to run (losses of all of them)")->capture_default_str();
  app.add_option("--trace", trace, "Steps whose every tensor is written (from 1)")->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--lr", lr)->capture_default_str();
  app.add_option("--seed", seed, "Seed of the data order")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::set<int> traced;
  std::stringstream list(trace);
  for (std::string item; std::getline(list, item, ',');) traced.insert(std::stoi(item));

  try {
    const auto split = data::load_dataset_dir(data_dir, "mnist");
    const auto& train = split.train;
    Context ctx({device, 0, false, true, kernels::Math::fp32});  // fp32: the trajectory PyTorch recomputes
    const auto& exec = ctx.exec();
    auto model = layers::build_model(model_name, Shape{train.channels, train.rows, train.cols}, train.classes);
    model->init_params(ctx, seed);
    load_safetensors(init, *model, exec);
    data::DeviceBatcher source(ctx, train, /*shuffle=*/true, seed);
    layers::SoftmaxCrossEntropy loss;
    Sgd sgd(exec, model->params(), {lr, 0.f, 0.f});
    TrainOptions options;
    options.batch = batch;
    options.use_graphs = false;
    options.fuse_head = true;  // as the parity test's rig
    Trainer trainer(ctx, *model, loss, sgd, source, options);
    source.begin_epoch(exec, 1);
    const std::vector<int32_t> order = source.order(1);

    std::vector<double> losses;
    std::vector<NamedTensor> tensors;
    for (int s = 0; s < steps; ++s) {
      const bool dump = traced.count(s + 1) > 0;
      const std::string p = cat("s", s + 1, ".");
      if (dump) add_params(tensors, p + "w.", model->params(), false, exec);
      const double before = trainer.read_train_totals(1).first;
      trainer.enqueue_train_step(s);
      losses.push_back(trainer.read_train_totals(1).first - before);
      if (!dump) continue;
      NamedTensor labels{p + "labels", "I64", {batch}, std::vector<uint8_t>(size_t(batch) * 8)};
      for (int r = 0; r < batch; ++r) {
        const int64_t label = train.labels[static_cast<size_t>(order[static_cast<size_t>(s) * batch + r])];
        std::memcpy(labels.bytes.data() + 8 * r, &label, 8);
      }
      tensors.push_back(std::move(labels));
      tensors.push_back(host(p + "x", model->input(), batch, exec));
      const size_t layers = model->layers().size();
      for (size_t i = 1; i < layers; ++i) tensors.push_back(host(cat(p, "in", i), model->activation(i), batch, exec));
      tensors.push_back(host(p + "logits", model->output(), batch, exec));
      tensors.push_back(host(p + "dlogits", model->output_grad(), batch, exec));
      for (size_t i = 1; i < layers; ++i)
        if (model->activation_grad(i).defined())
          tensors.push_back(host(cat(p, "din", i), model->activation_grad(i), batch, exec));
      add_params(tensors, p + "g.", model->params(), true, exec);
      add_params(tensors, p + "w_after.", model->params(), false, exec);
    }
    kernels::synchronize(exec);
    NamedTensor loss_tensor{"loss", "F64", {steps}, std::vector<uint8_t>(losses.size() * 8)};
    std::memcpy(loss_tensor.bytes.data(), losses.data(), loss_tensor.bytes.size());
    tensors.push_back(std::move(loss_tensor));
    write_safetensors(out, tensors,
                      {{"model", model_name},
                       {"device", ctx.describe()},
                       {"steps", std::to_string(steps)},
                       {"batch", std::to_string(batch)},
                       {"lr", cat(lr)},
                       {"seed", std::to_string(seed)}});
    std::printf("%s: %d losses (%.6f ... %.6f), %zu steps traced, on %s\n", out.c_str(), steps, losses.front(),
                losses.back(), traced.size(), ctx.describe().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parity_trace: %s\n", e.what());
    return 1;
  }
  return 0;
}
