// Data-parallel training on GPUs over NCCL (nanotrain train --gpus N; apps/ranks.h, kernels/collective.h): one
// rank is the plain path bit for bit, two ranks train as one GPU with the global batch, and a rank killed mid-run
// ends the run. The two-GPU cases need two GPUs and say so where there is one.
#include "test_support.h"

#include <nlohmann/json.hpp>

#include <sstream>

#include "engine/checkpoint.h"
#include "kernels/collective.h"
#include "kernels/runtime.h"

using namespace nt;
using namespace nt::test;

namespace {

bool have_nccl() {
  std::string why;
  if (kernels::nccl::available(&why)) return true;
  WARN("NCCL cannot be used here, not run: " << why);
  return false;
}

bool have_gpus(int n) {
  if (kernels::cuda_device_count() >= n) return true;
  WARN("needs " << n << " GPUs, this machine has " << kernels::cuda_device_count() << ": not run");
  return false;
}

std::string train_command(const std::string& flags) {
  return cat(cli_path(), " train --device cuda --data ", mnist_dir(), " --train-limit 8192 --epochs 2", flags);
}

std::vector<double> losses(const std::string& metrics) {
  std::vector<double> out;
  std::istringstream in(read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    out.push_back(j["train_loss"]);
    out.push_back(j["test_loss"]);
  }
  return out;
}

}  // namespace

TEST_CASE("train --gpus 1: the NCCL path of one rank trains bit for bit as the plain path", "[cuda][parallel]") {
  if (!have_nccl()) return;
  const TempDir dir;
  // The mlp (the all-reduce in the epoch's graph) and a small cnn (BatchNorm buffers broadcast before evaluation).
  for (const char* model : {"mlp", "conv:8:3,bn,relu,maxpool:2,flatten,linear:10"}) {
    INFO(model);
    const std::string flags = cat(" --model ", model, " --optimizer adam --lr 0.002 --shift 1");
    const std::string plain = dir.file("plain.safetensors"), nccl = dir.file("nccl.safetensors");
    const auto a = run_command(train_command(flags) + " --save " + plain);
    INFO(a.out);
    REQUIRE(a.exit_code == 0);
    const auto b = run_command(train_command(flags) + " --gpus 1 --save " + nccl);
    INFO(b.out);
    REQUIRE(b.exit_code == 0);
    CHECK(b.out.find("data-parallel: NCCL ") != std::string::npos);
    CHECK(compare_weights(plain, nccl).same_bits);
  }
}

TEST_CASE("mpirun -np 1 on the GPU: the NCCL id goes through MPI, and the run is the plain path bit for bit",
          "[cuda][parallel]") {
  if (!have_nccl()) return;
  if (!kernels::mpi::built() || run_command("command -v mpirun").exit_code != 0) {
    WARN("no MPI in this build or no mpirun here: not run");
    return;
  }
  const TempDir dir;
  const std::string flags = " --model mlp --optimizer adam --lr 0.002";
  const std::string plain = dir.file("plain.safetensors"), ranked = dir.file("mpirun.safetensors");
  REQUIRE(run_command(train_command(flags) + " --save " + plain).exit_code == 0);
  const auto r = run_command(mpirun(1) + train_command(flags) + " --save " + ranked);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("data-parallel: NCCL ") != std::string::npos);
  CHECK(compare_weights(plain, ranked).same_bits);
}

TEST_CASE(
    "train --gpus 2: two ranks of batch 32 train as one GPU of batch 64, the same bits every time, in any buckets",
    "[cuda][parallel]") {
  if (!have_nccl() || !have_gpus(2)) return;
  const TempDir dir;
  const std::string flags = " --model mlp --lr 0.05";
  const std::string one = dir.file("one.safetensors"), two = dir.file("two.safetensors"),
                    again = dir.file("again.safetensors");
  REQUIRE(run_command(train_command(flags) + " --batch 64 --save " + one + " --metrics " + one + ".jsonl").exit_code ==
          0);
  const auto r =
      run_command(train_command(flags) + " --gpus 2 --batch 32 --save " + two + " --metrics " + two + ".jsonl");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("global batch 64 (2 x 32)") != std::string::npos);
  REQUIRE(run_command(train_command(flags) + " --gpus 2 --batch 32 --save " + again).exit_code == 0);
  CHECK(compare_weights(two, again).same_bits);
  // The all-reduce a layer at a time on the second stream, beside the backward pass: between two ranks a + b = b + a,
  // so the same bits.
  const std::string per_layer = dir.file("per-layer.safetensors");
  REQUIRE(run_command(train_command(flags) + " --gpus 2 --batch 32 --bucket-kib 0 --save " + per_layer).exit_code == 0);
  CHECK(compare_weights(two, per_layer).same_bits);
  // As on the CPU (tests/cpu/test_data_parallel.cpp says why): the batch sums regroup, the weights drift by
  // rounding, and a ReLU that flips for one example moves one unit's weights.
  const WeightsDifference d = compare_weights(one, two);
  INFO("largest relative difference " << d.max_relative << " in " << d.worst);
  CHECK(d.max_relative <= 1e-4);
  const auto a = losses(one + ".jsonl"), b = losses(two + ".jsonl");
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(std::abs(a[i] - b[i]) <= 1e-5 * std::abs(a[i]));
}

// --sync-bn on the cnn: every BatchNorm path of the GPU (the convolution epilogue's statistics given to the
// BatchNorm after it, the fused max-pool, the plain one; the stem is not fused) exchanges its statistics over NCCL
// inside the epoch's graph. 16 steps, as on the CPU (tests/cpu/test_data_parallel.cpp says why so few).
TEST_CASE("train --gpus 2 --sync-bn: the cnn of 2 x 32 trains as one GPU of batch 64, the same bits every time",
          "[cuda][parallel]") {
  if (!have_nccl() || !have_gpus(2)) return;
  const TempDir dir;
  const std::string base = cat(cli_path(), " train --device cuda --data ", mnist_dir(),
                               " --model cnn --train-limit 1024 --epochs 1 --lr 0.05 --shift 1");
  const std::string one = dir.file("one.safetensors"), synced = dir.file("synced.safetensors"),
                    again = dir.file("again.safetensors"), local = dir.file("local.safetensors");
  REQUIRE(run_command(base + " --batch 64 --save " + one + " --metrics " + one + ".jsonl").exit_code == 0);
  const auto r = run_command(base + " --gpus 2 --batch 32 --sync-bn --save " + synced + " --metrics " + synced +
                             ".jsonl --profile");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("BatchNorm statistics over all 2 ranks' batches (--sync-bn)") != std::string::npos);
  CHECK(r.out.find("nccl_all_gather") != std::string::npos);  // the exchange has its profiler row
  // Every NCCL kernel is told to the profiler (the broadcasts and the totals' sums too), so CUPTI's records of the
  // stream match its launches one to one.
  CHECK(r.out.find("without a CUPTI record") == std::string::npos);
  REQUIRE(run_command(base + " --gpus 2 --batch 32 --sync-bn --save " + again).exit_code == 0);
  CHECK(compare_weights(synced, again).same_bits);
  REQUIRE(run_command(base + " --gpus 2 --batch 32 --save " + local).exit_code == 0);
  const WeightsDifference with_sync = compare_weights(one, synced), without = compare_weights(one, local);
  INFO("--sync-bn: " << with_sync.max_relative << " in " << with_sync.worst << "; per rank: " << without.max_relative
                     << " in " << without.worst);
  CHECK(with_sync.max_relative <= 1e-4);
  CHECK(without.max_relative > 1e-2);
  const auto a = losses(one + ".jsonl"), b = losses(synced + ".jsonl");
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(std::abs(a[i] - b[i]) <= 1e-5 * std::abs(a[i]));
}

TEST_CASE("train --gpus 2: a rank killed mid-epoch stops the other, and the launcher says which", "[cuda][parallel]") {
  if (!have_nccl() || !have_gpus(2)) return;
  const TempDir dir;
  const std::string metrics = dir.file("metrics.jsonl");
  // Eager steps of 16 on the whole set: epochs of a few tenths of a second.
  const std::string out =
      kill_a_rank_mid_run(cat(cli_path(), " train --data ", mnist_dir(),
                              " --model mlp --batch 16 --epochs 200 --no-graphs --gpus 2", " --metrics ", metrics),
                          metrics, dir);
  INFO(out);
  check_killed_run(out);
  CHECK(out.find("was killed by signal 9 (SIGKILL); the other ranks were stopped") != std::string::npos);
}
