// train --target-acc (apps/train_command.cpp): the run stops after the first epoch whose test accuracy reaches the
// target, says how long it took from the process's start and where that time went, and exits 4 when --epochs end
// without it.
#include "test_support.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "engine/checkpoint.h"

using namespace nt;
using namespace nt::test;

namespace {

std::vector<double> test_accuracies(const std::string& metrics) {
  std::vector<double> acc;
  std::istringstream in(read_file(metrics));
  for (std::string line; std::getline(in, line);) acc.push_back(nlohmann::json::parse(line)["test_acc"]);
  return acc;
}

std::string train_command() {
  return cat(cli_path(), " train --device cpu --data ", mnist_dir(), " --model mlp --train-limit 2048 --lr 0.05");
}

}  // namespace

TEST_CASE("train --target-acc stops after the first epoch that reaches it and splits the time it took",
          "[cpu][cli][target]") {
  const TempDir dir;
  const std::string all = dir.file("all.jsonl");
  REQUIRE(run_command(cat(train_command(), " --epochs 3 --metrics ", all)).exit_code == 0);
  const std::vector<double> acc = test_accuracies(all);
  REQUIRE(acc.size() == 3);
  REQUIRE(acc[1] > acc[0]);  // a target between epochs 1 and 2 then stops the run after epoch 2
  const double target = (acc[0] + acc[1]) / 2;

  const std::string stopped = dir.file("stopped.jsonl"), weights = dir.file("stopped.safetensors");
  const auto r = run_command(
      cat(train_command(), " --epochs 3 --target-acc ", target, " --metrics ", stopped, " --save ", weights));
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("epoch   3 |") == std::string::npos);
  const std::vector<double> stopped_acc = test_accuracies(stopped);
  REQUIRE(stopped_acc.size() == 2);
  CHECK(stopped_acc[0] == acc[0]);  // the same run up to there, bit for bit
  CHECK(stopped_acc[1] == acc[1]);
  CHECK(SafetensorsFile::read(weights).metadata().at("epochs_trained") == "2");

  // The parts add up to the total (each printed to the millisecond).
  const std::regex line(
      "reached ([0-9.]+)% test accuracy \\(target ([0-9.]+)%\\) after epoch 2: ([0-9.]+) s from the process's start: "
      "start-up ([0-9.]+), data load ([0-9.]+), planning and capture ([0-9.]+), training ([0-9.]+), evaluation "
      "([0-9.]+), other (-?[0-9.]+)");
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, line));
  CHECK(std::abs(std::stod(m[1]) - 100 * acc[1]) <= 0.005);
  double parts = 0;
  for (int i = 4; i <= 9; ++i) {
    CHECK(std::stod(m[i]) >= -0.001);
    parts += std::stod(m[i]);
  }
  CHECK(std::abs(parts - std::stod(m[3])) <= 0.004);
  CHECK(std::stod(m[7]) > 0);  // training
  CHECK(std::stod(m[8]) > 0);  // evaluation
}

TEST_CASE("train --target-acc that --epochs do not reach exits 4 with one line, and a bad target is a usage error",
          "[cpu][cli][target]") {
  const TempDir dir;
  const std::string weights = dir.file("w.safetensors");
  const auto missed = run_command(cat(train_command(), " --epochs 1 --target-acc 0.999 --save ", weights));
  INFO(missed.out);
  CHECK(missed.exit_code == 4);
  CHECK(std::regex_search(missed.out, std::regex("nanotrain: --target-acc: 99.90% test accuracy not reached in 1 "
                                                 "epoch \\(the best, [0-9.]+%, after epoch 1\\); [0-9.]+ s from")));
  CHECK(SafetensorsFile::read(weights).metadata().at("epochs_trained") == "1");  // --save still writes the weights
  for (const char* bad : {"1.5", "-0.1", "nan"}) {
    const auto r = run_command(cat(train_command(), " --epochs 1 --target-acc ", bad));
    INFO(bad << ": " << r.out);
    CHECK(r.exit_code == 2);
    CHECK(r.out.find("nanotrain: --target-acc: a test accuracy in (0, 1], got") != std::string::npos);
  }
}

// bench/time_to_accuracy.py: a fresh process per seed, timed from outside; the median and the worst.
TEST_CASE("bench/time_to_accuracy runs one process per seed and reports the median and the worst",
          "[cpu][cli][target]") {
  if (run_command("python3 --version").exit_code != 0) {
    WARN("python3 not found: bench/time_to_accuracy.py not run");
    return;
  }
  const TempDir dir;
  const std::string root = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().string();
  const std::string recipe = dir.file("recipe.txt"), json = dir.file("runs.json");
  std::ofstream(recipe) << "# a quick one\n--model mlp --epochs 3 --train-limit 2048 --lr 0.05\n";
  const auto r =
      run_command(cat("python3 ", root, "/bench/time_to_accuracy.py --nanotrain ", cli_path(), " --recipe ", recipe,
                      " --seeds 1,2 --target 0.8 --device cpu --data ", mnist_dir(), " --json ", json));
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(std::regex_search(r.out, std::regex("seed 1: [0-9.]+% after [0-9] epoch\\(s\\), [0-9.]+ s \\(inside")));
  CHECK(std::regex_search(r.out, std::regex("time to 80.0% from process start: median [0-9.]+ s, worst [0-9.]+ s "
                                            "when the run reports it; whole processes \\(exit included\\) median "
                                            "[0-9.]+ s, worst [0-9.]+ s; over 2 of 2 runs")));
  const auto summary = nlohmann::json::parse(read_file(json))["summary"];
  CHECK(summary["reached"] == 2);
  CHECK(double(summary["worst_s"]) >= double(summary["median_s"]));
  CHECK(double(summary["worst_reached_s"]) >= double(summary["median_reached_s"]));
  CHECK(double(summary["median_reached_s"]) <= double(summary["median_s"]));  // reported before the process ends
  // A target no run reaches: each is a miss, and the script exits 4.
  const auto missed =
      run_command(cat("python3 ", root, "/bench/time_to_accuracy.py --nanotrain ", cli_path(), " --recipe ", recipe,
                      " --seeds 1 --target 0.999 --device cpu --data ", mnist_dir()));
  INFO(missed.out);
  CHECK(missed.exit_code == 4);
  CHECK(missed.out.find("seed 1: target missed (exit 4)") != std::string::npos);
}
