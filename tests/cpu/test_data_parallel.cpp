// Data-parallel training on the CPU backend over MPI (apps/ranks.h, kernels/collective.h): ranks started by mpirun
// train as one process with the global batch, rank 0 alone prints and writes, and a rank that dies ends the run.
#include "test_support.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <sstream>

#include "engine/checkpoint.h"
#include "kernels/collective.h"

using namespace nt;
using namespace nt::test;

namespace {

// Every test here needs mpirun and a build with MPI; scripts/setup installs Open MPI where it can.
bool have_mpi() {
  if (!kernels::mpi::built()) {
    WARN("this build has no MPI (libopenmpi-dev was not found when it was configured): not run");
    return false;
  }
  REQUIRE(run_command("command -v mpirun").exit_code == 0);  // the package that built it brings mpirun
  return true;
}

std::vector<nlohmann::json> metrics_lines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

int64_t count_of(const std::string& text, const std::string& what) {
  int64_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The mlp on 4096 examples: 64 global batches of 64 an epoch.
std::string train_command(int epochs = 2) {
  return cat(cli_path(), " train --device cpu --data ", mnist_dir(), " --model mlp --train-limit 4096 --epochs ",
             epochs);
}

}  // namespace

// Tolerances. The ranks compute what one process computes, with one regrouping: a parameter gradient, a sum over the
// 64 rows of a global batch (one fp32 chain in the CPU GEMM, rows in order), becomes two 32-row chains, one per rank,
// added in rank order, which rounds differently in the last bits (kernels/collective.h; docs/data-parallel.md). The
// weights then drift apart by about lr x ulp a step, 3e-7 of the largest weight after 128 SGD steps (measured), until
// a pre-activation near 0 takes the other sign in one run: that hidden unit's ReLU then passes (or stops) one
// example's gradient, and its 784 input weights move by ~1e-4 of the largest (measured with --shift 2, epoch 2: 774
// weights of 0.weight, 6.9e-6 of its L2 norm). Hence the L2 norm: 1e-4 of each tensor's. A wrong slice, a doubled
// example or a sum without the mean moves the weights by 1e-2 of their norm and more. Losses are sums over the same
// examples of nearly the same model: 1e-5 relative.
constexpr double kWeightsTolerance = 1e-4;
constexpr double kLossTolerance = 1e-5;

TEST_CASE("mpirun: 2 ranks of batch 32 train as 1 process of batch 64 (SGD, --shift, Adam)", "[cpu][parallel]") {
  if (!have_mpi()) return;
  const TempDir dir;
  const std::pair<const char*, const char*> recipes[] = {
      {"sgd", " --lr 0.05"}, {"sgd-shift", " --lr 0.05 --shift 2"}, {"adam", " --optimizer adam --lr 0.002"}};
  for (const auto& [name, flags] : recipes) {
    INFO(name);
    const std::string one = dir.file(cat(name, "-1.safetensors")), two = dir.file(cat(name, "-2.safetensors"));
    const auto single =
        run_command(cat(train_command(), flags, " --batch 64 --save ", one, " --metrics ", one, ".jsonl"));
    INFO(single.out);
    REQUIRE(single.exit_code == 0);
    const auto ranks =
        run_command(cat(mpirun(2), train_command(), flags, " --batch 32 --save ", two, " --metrics ", two, ".jsonl"));
    INFO(ranks.out);
    REQUIRE(ranks.exit_code == 0);
    CHECK(ranks.out.find("data-parallel: Open MPI") != std::string::npos);
    CHECK(ranks.out.find("global batch 64 (2 x 32)") != std::string::npos);
    CHECK(count_of(ranks.out, "epoch   1 |") == 1);  // rank 0 prints, the other rank does not
    CHECK(count_of(ranks.out, "saved the trained weights") == 1);

    const auto a = metrics_lines(one + ".jsonl"), b = metrics_lines(two + ".jsonl");
    REQUIRE(a.size() == 2);
    REQUIRE(b.size() == 2);
    for (size_t e = 0; e < a.size(); ++e) {
      INFO("epoch " << e + 1);
      for (const char* key : {"train_loss", "test_loss"}) {
        INFO(key);
        const double x = a[e][key], y = b[e][key];
        CHECK(std::abs(x - y) <= kLossTolerance * std::abs(x));
      }
      // The same examples, nearly the same model: at most a few near-ties may tip.
      CHECK(std::abs(double(a[e]["test_acc"]) - double(b[e]["test_acc"])) <= 3e-4);
    }
    const WeightsDifference d = compare_weights(one, two);
    INFO("largest relative difference " << d.max_relative << " in " << d.worst);
    CHECK(d.max_relative <= kWeightsTolerance);
    CHECK(SafetensorsFile::read(two).metadata().at("world_size") == "2");
    CHECK(SafetensorsFile::read(one).metadata().at("world_size") == "1");
  }
}

// --sync-bn: the BatchNorms' statistics span both ranks' rows, so 2 ranks of 32 compute what 1 process of 64 computes,
// up to the rounding of the statistics' exchange (fp32 moments per rank, combined by Chan's formula; the gradient
// sums averaged) and the regrouped parameter gradients (above). Without it each rank normalizes its own 32 rows,
// another model: its weights differ from the single process's by orders of magnitude more. A small cnn with the three
// BatchNorm paths: the one after the first convolution (which a single process fuses into the stem, and a
// synchronized run does not), one with a fused max-pool, and a BatchNorm1d. 16 steps: measured, the weights then
// differ by 9e-7 of a tensor's norm with --sync-bn and 0.36 without. Longer runs drift apart at a ReLU or max-pool
// choice that tips, as above; in a BatchNorm's beta, whose norm is small, that reached 3e-2 after 32 steps at lr 0.01.
TEST_CASE("mpirun --sync-bn: 2 ranks of batch 32 train as 1 process of batch 64 with BatchNorm", "[cpu][parallel]") {
  if (!have_mpi()) return;
  const TempDir dir;
  const std::string base = cat(cli_path(), " train --device cpu --data ", mnist_dir(),
                               " --model conv:8:3,bn,relu,maxpool:2,conv:8:3,bn,relu,conv:8:3,bn,relu,maxpool:2,"
                               "flatten,linear:32,bn,relu,linear:10 --train-limit 1024 --epochs 1 --lr 0.05 --shift 1");
  const std::string one = dir.file("one.safetensors"), synced = dir.file("synced.safetensors"),
                    local = dir.file("local.safetensors");
  const auto single = run_command(cat(base, " --batch 64 --save ", one, " --metrics ", one, ".jsonl"));
  INFO(single.out);
  REQUIRE(single.exit_code == 0);
  CHECK(single.out.find("stem: 0 conv") != std::string::npos);
  const auto ranks =
      run_command(cat(mpirun(2), base, " --batch 32 --sync-bn --save ", synced, " --metrics ", synced, ".jsonl"));
  INFO(ranks.out);
  REQUIRE(ranks.exit_code == 0);
  CHECK(ranks.out.find("BatchNorm statistics over all 2 ranks' batches (--sync-bn)") != std::string::npos);
  CHECK(ranks.out.find("stem:") == std::string::npos);  // the stem keeps its statistics on chip: not fused
  const auto per_rank = run_command(cat(mpirun(2), base, " --batch 32 --save ", local));
  INFO(per_rank.out);
  REQUIRE(per_rank.exit_code == 0);
  CHECK(per_rank.out.find("BatchNorm statistics per rank") != std::string::npos);

  const auto a = metrics_lines(one + ".jsonl"), b = metrics_lines(synced + ".jsonl");
  REQUIRE(a.size() == 1);
  REQUIRE(b.size() == 1);
  for (size_t e = 0; e < a.size(); ++e)
    for (const char* key : {"train_loss", "test_loss"}) {
      INFO("epoch " << e + 1 << " " << key);
      CHECK(std::abs(double(a[e][key]) - double(b[e][key])) <= kLossTolerance * std::abs(double(a[e][key])));
    }
  const WeightsDifference with_sync = compare_weights(one, synced), without = compare_weights(one, local);
  INFO("--sync-bn: " << with_sync.max_relative << " in " << with_sync.worst << "; per rank: " << without.max_relative
                     << " in " << without.worst);
  CHECK(with_sync.max_relative <= kWeightsTolerance);  // running statistics included
  CHECK(without.max_relative > 100 * kWeightsTolerance);
}

TEST_CASE("mpirun: one rank is the plain run bit for bit, and two ranks give the same bits every time, in any buckets",
          "[cpu][parallel]") {
  if (!have_mpi()) return;
  const TempDir dir;
  const std::string base = cat(train_command(), " --optimizer adam --lr 0.002 --shift 1");
  const std::string plain = dir.file("plain.safetensors"), one = dir.file("one.safetensors");
  REQUIRE(run_command(cat(base, " --batch 64 --save ", plain)).exit_code == 0);
  const auto one_rank = run_command(cat(mpirun(1), base, " --batch 64 --save ", one));
  INFO(one_rank.out);
  REQUIRE(one_rank.exit_code == 0);
  CHECK(compare_weights(plain, one).same_bits);

  const std::string first = dir.file("first.safetensors"), second = dir.file("second.safetensors");
  REQUIRE(run_command(cat(mpirun(2), base, " --batch 32 --save ", first)).exit_code == 0);
  REQUIRE(run_command(cat(mpirun(2), base, " --batch 32 --save ", second)).exit_code == 0);
  CHECK(compare_weights(first, second).same_bits);
  // One all-reduce a layer instead of one a step: each value is averaged on its own, so no bit changes.
  const std::string per_layer = dir.file("per-layer.safetensors");
  REQUIRE(run_command(cat(mpirun(2), base, " --batch 32 --bucket-kib 0 --save ", per_layer)).exit_code == 0);
  CHECK(compare_weights(first, per_layer).same_bits);
}

TEST_CASE("mpirun: ranks refuse what would not be the same run", "[cpu][parallel]") {
  if (!have_mpi()) return;
  const TempDir dir;
  // A resumable checkpoint of 2 ranks, resumed on 1: each global batch would be another.
  const auto two = run_command(
      cat(mpirun(2), train_command(1), " --batch 32 --checkpoint-every 1", " --checkpoint-dir ", dir.file("ck")));
  INFO(two.out);
  REQUIRE(two.exit_code == 0);
  const std::string checkpoint = dir.file("ck") + "/epoch-000001.safetensors";
  const auto resumed = run_command(cat(train_command(), " --resume ", checkpoint));
  INFO(resumed.out);
  CHECK(resumed.exit_code == 2);
  CHECK(resumed.out.find("nanotrain: --resume: '" + checkpoint + "' was trained on 2 rank(s), this run has 1") !=
        std::string::npos);
  // Resumed on 2 ranks with --sync-bn: the checkpoint records the BatchNorm statistics of the run (per rank here).
  const auto synced = run_command(cat(mpirun(2), train_command(2), " --batch 32 --sync-bn --resume ", checkpoint));
  INFO(synced.out);
  CHECK(synced.exit_code != 0);
  CHECK(synced.out.find("--resume: '" + checkpoint + "' was trained with no --sync-bn, this command gives --sync-bn") !=
        std::string::npos);
  // --gpus under mpirun: two launchers.
  const auto both = run_command(cat(mpirun(2), train_command(), " --gpus 2"));
  INFO(both.out);
  CHECK(both.exit_code != 0);
  CHECK(both.out.find("--gpus: mpirun has started the ranks already") != std::string::npos);
  const auto cpu_gpus = run_command(cat(train_command(), " --gpus 2"));
  INFO(cpu_gpus.out);
  CHECK(cpu_gpus.exit_code == 2);
  CHECK(cpu_gpus.out.find("nanotrain: --gpus: starts one rank per GPU, and --device cpu was given") !=
        std::string::npos);
  // More ranks than global batches: the error names --batch and the ranks.
  const auto big = run_command(cat(mpirun(2), train_command(), " --batch 4000"));
  INFO(big.out);
  CHECK(big.exit_code != 0);
  CHECK(big.out.find("--batch: 4000 on each of 2 ranks is larger than the training set (4096 examples)") !=
        std::string::npos);
}

TEST_CASE("mpirun: a rank killed mid-epoch ends every rank with an error", "[cpu][parallel]") {
  if (!have_mpi()) return;
  const TempDir dir;
  const std::string metrics = dir.file("metrics.jsonl");
  // All 60000 examples (about a second an epoch here): a rank is killed inside epoch 2.
  const std::string out = kill_a_rank_mid_run(cat(mpirun(2), cli_path(), " train --device cpu --data ", mnist_dir(),
                                                  " --model mlp --batch 32 --epochs 50 --metrics ", metrics),
                                              metrics, dir);
  INFO(out);
  check_killed_run(out);
  CHECK(metrics_lines(metrics).size() < 50);
}

TEST_CASE("mpirun: rank 0's profile shows the all-reduce as a row of its own", "[cpu][parallel][profile]") {
  if (!have_mpi()) return;
  const auto r = run_command(cat(mpirun(2), train_command(1), " --batch 32 --profile"));
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  REQUIRE(count_of(r.out, "mpi_all_reduce_mean | all-reduce |") == 1);  // one table, rank 0's
  const size_t row = r.out.find("mpi_all_reduce_mean | all-reduce |");
  const std::string line = r.out.substr(row, r.out.find('\n', row) - row);
  CHECK(line.find("|    64 |") != std::string::npos);  // 64 steps, one all-reduce each
}
