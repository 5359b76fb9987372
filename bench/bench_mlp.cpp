// MLP epoch benchmark: ms per training epoch (evaluation excluded), median of epochs 2..N, and the
// GEMM arithmetic rate that implies.
//
//   bench_mlp [--device cpu|cuda] [--batch 64,256] [--epochs 5] [--threads T] [--no-graphs] [--data DIR]
//             [--no-fused-head] [--csv FILE]
//
// The first epoch pays one-time costs (graph capture, page faults, clocks ramping up), so it is
// reported but left out of the median, as for the PyTorch baseline.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/batcher.h"
#include "data/dataset.h"
#include "engine/trainer.h"
#include "layers/builder.h"
#include "layers/softmax_xent.h"

using namespace nt;

namespace {

struct Args {
  std::string device = "auto";
  std::vector<int> batches{64};
  int epochs = 5;
  int threads = 0;
  bool graphs = true;
  bool fuse_head = true;
  std::string data;
  std::string csv;
};

Args parse(int argc, char** argv) {
  Args a;
  if (const char* env = std::getenv("NT_DATA_DIR")) a.data = env;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(cat(k, ": missing value"));
      return argv[++i];
    };
    if (k == "--device")
      a.device = next();
    else if (k == "--epochs")
      a.epochs = std::stoi(next());
    else if (k == "--threads")
      a.threads = std::stoi(next());
    else if (k == "--no-graphs")
      a.graphs = false;
    else if (k == "--no-fused-head")
      a.fuse_head = false;
    else if (k == "--data")
      a.data = next();
    else if (k == "--csv")
      a.csv = next();
    else if (k == "--batch") {
      a.batches.clear();
      std::stringstream s(next());
      for (std::string b; std::getline(s, b, ',');) a.batches.push_back(std::stoi(b));
    } else
      throw Error(cat("unknown argument ", k));
  }
  if (a.data.empty()) a.data = ".data/mnist";
  if (a.epochs < 2) throw Error("--epochs: need at least 2 (the median skips epoch 1)");
  return a;
}

// FLOPs of one training step of a stack of Linear layers: forward and weight gradient for every
// layer, input gradient for all but the first (2 per multiply-add).
double step_flops(const Model& model, int batch) {
  double flops = 0;
  bool first = true;
  for (const auto& p : model.params().params()) {
    if (p.value.shape().rank() != 2) continue;
    const double weights = static_cast<double>(p.value.numel());
    flops += 2.0 * batch * weights * (first ? 2 : 3);
    first = false;
  }
  return flops;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) try {
  Args args = parse(argc, argv);
  auto split = data::load_dataset_dir(args.data, "mnist");
  Context ctx({args.device, args.threads, false});
  std::printf("device: %s%s, %s\n", ctx.describe().c_str(),
              ctx.on_cuda() ? (args.graphs ? ", CUDA graphs" : ", eager") : "",
              args.fuse_head ? "fused classifier head" : "separate head ops");
  std::printf("%-6s %-10s %-12s %-12s %-10s %-9s\n", "batch", "epoch1 ms", "median ms", "GFLOP/s", "test acc",
              "epochs");
  std::ofstream csv;
  if (!args.csv.empty()) {
    csv.open(args.csv);
    csv << "device,batch,epoch,epoch_ms,train_loss,test_acc\n";
  }
  for (int batch : args.batches) {
    auto model = layers::build_model("mlp", Shape{1, 28, 28}, 10);
    model->init_params(ctx, 1);
    data::DeviceBatcher train(ctx, split.train, true, 1);
    data::DeviceBatcher test(ctx, split.test, false, 1);
    layers::SoftmaxCrossEntropy loss;
    Sgd sgd(ctx.exec(), model->params(), {0.03f, 0.f, 0.f});
    TrainOptions options;
    options.batch = batch;
    options.use_graphs = args.graphs;
    options.fuse_head = args.fuse_head;
    Trainer trainer(ctx, *model, loss, sgd, train, options);
    std::vector<double> ms;
    EpochMetrics m;
    for (int e = 1; e <= args.epochs; ++e) {
      m = trainer.train_epoch(e);
      ms.push_back(m.epoch_ms);
      if (csv)
        csv << (ctx.on_cuda() ? "cuda" : "cpu") << "," << batch << "," << e << "," << m.epoch_ms << "," << m.train_loss
            << ",\n";
    }
    const double acc = trainer.evaluate(test).accuracy;
    const double med = median(std::vector<double>(ms.begin() + 1, ms.end()));
    const double gflops = step_flops(*model, batch) * static_cast<double>(trainer.steps_per_epoch()) / (med * 1e6);
    std::printf("%-6d %-10.1f %-12.2f %-12.1f %-10.2f %d\n", batch, ms.front(), med, gflops, 100 * acc, args.epochs);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_mlp: %s\n", e.what());
  return 1;
}
