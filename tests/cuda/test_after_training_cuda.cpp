// After training, on the GPU through the CLI: exact resume, and predict's answers against eval's.
#include "test_support.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <sstream>

using namespace nt;

TEST_CASE("a resumed GPU run ends in the same bits and metrics as one never stopped", "[cuda][after][resume]") {
  test::check_resume_is_exact("cuda");
}

TEST_CASE("predict on the GPU gives eval's prediction for every MNIST test image", "[cuda][after]") {
  const test::TempDir dir;
  const std::string model = dir.file("cnn.safetensors"), json = dir.file("eval.json");
  const std::string common = cat(" --device cuda --log-level warn --data ", test::mnist_dir());
  const auto trained = test::run_command(
      cat(test::cli_path(), " train --model cnn --epochs 1 --train-limit 6400 --save ", model, common));
  INFO(trained.out);
  REQUIRE(trained.exit_code == 0);
  REQUIRE(test::run_command(cat(test::cli_path(), " eval --load ", model, " --json ", json, common)).exit_code == 0);
  const auto eval = nlohmann::json::parse(test::read_file(json));
  std::string idx = test::mnist_dir() + "/t10k-images-idx3-ubyte";
  if (!std::filesystem::exists(idx)) idx += ".gz";
  const auto predicted =
      test::run_command(cat(test::cli_path(), " predict --device cuda --json --top 1 --load ", model, " ", idx));
  REQUIRE(predicted.exit_code == 0);
  std::istringstream lines(predicted.out);
  size_t i = 0, differing = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line.front() != '{') continue;
    differing +=
        nlohmann::json::parse(line).at("top")[0].at("class").get<int>() != eval.at("predictions")[i].get<int>();
    ++i;
  }
  CHECK(i == 10000);
  CHECK(differing == 0);
}
