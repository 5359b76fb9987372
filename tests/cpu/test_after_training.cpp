// After training, through the CLI on the CPU: checkpoints that stand alone (the model card), eval's confusion matrix
// and its misclassified images, predict on one's own images against eval's predictions, and exact resume.
#include "test_support.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/dataset.h"
#include "data/image.h"
#include "engine/checkpoint.h"

using namespace nt;

namespace {

namespace fs = std::filesystem;

std::string cli(const std::string& args) { return cat(test::cli_path(), " ", args, " --device cpu --log-level warn"); }

// One small trained mlp per test process: 1280 examples, one epoch.
const std::string& trained_model() {
  static const test::TempDir dir;
  static const std::string path = [] {
    const std::string p = dir.file("mlp.safetensors");
    const auto r =
        test::run_command(cli(cat("train --data ", test::mnist_dir(), " --train-limit 1280 --epochs 1 --save ", p)));
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    return p;
  }();
  return path;
}

nlohmann::json eval_json(const std::string& checkpoint, const test::TempDir& dir) {
  const std::string json = dir.file("eval.json");
  const auto r =
      test::run_command(cli(cat("eval --data ", test::mnist_dir(), " --load ", checkpoint, " --json ", json)));
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(test::read_file(json));
}

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line.front() == '{') lines.push_back(nlohmann::json::parse(line));
  return lines;
}

}  // namespace

TEST_CASE("a checkpoint carries its model card: eval needs no --model, an older file needs one", "[cpu][after]") {
  const auto file = SafetensorsFile::read(trained_model());
  const auto& meta = file.metadata();
  CHECK(meta.at("model_spec") == "linear:320,relu,linear:160,relu,linear:10");
  CHECK(meta.at("input_shape") == "1,28,28");
  CHECK(meta.at("classes") == "10");
  CHECK(meta.at("normalization_mean") == "0.130700007");  // 0.1307f, written to read back exactly
  CHECK(meta.at("normalization_std") == "0.308099985");
  CHECK(meta.at("dataset") == "mnist");
  CHECK(meta.at("engine_version").size() > 0);
  CHECK(meta.at("epochs_trained") == "1");

  // A file without the card (as written before it): its tensors alone.
  const test::TempDir dir;
  const std::string old_file = dir.file("old.safetensors");
  std::vector<NamedTensor> tensors;
  for (const auto& t : file.tensors())
    tensors.push_back(
        {t.name, t.dtype, t.shape, std::vector<uint8_t>(file.bytes(t), file.bytes(t) + (t.end - t.begin))});
  write_safetensors(old_file, tensors, {});
  const auto refused = test::run_command(cli(cat("eval --data ", test::mnist_dir(), " --load ", old_file)));
  INFO(refused.out);
  CHECK(refused.exit_code == 2);
  CHECK(refused.out.find("--load: '" + old_file + "' has no model card") != std::string::npos);
  const auto with_model =
      test::run_command(cli(cat("eval --data ", test::mnist_dir(), " --load ", old_file, " --model mlp")));
  const auto with_card = test::run_command(cli(cat("eval --data ", test::mnist_dir(), " --load ", trained_model())));
  INFO(with_model.out << with_card.out);
  CHECK(with_model.exit_code == 0);
  CHECK(with_card.exit_code == 0);
  // "test loss L | test acc A (C/N) | T ms": the same but for the time.
  CHECK(with_model.out.substr(0, with_model.out.rfind(" | ")) == with_card.out.substr(0, with_card.out.rfind(" | ")));
}

TEST_CASE("eval --confusion: the matrix holds every test example, its diagonal is eval's correct count",
          "[cpu][after]") {
  const test::TempDir dir;
  const nlohmann::json json = eval_json(trained_model(), dir);
  const auto& matrix = json.at("confusion");
  REQUIRE(matrix.size() == 10);
  int64_t total = 0, diagonal = 0;
  for (size_t label = 0; label < 10; ++label) {
    REQUIRE(matrix[label].size() == 10);
    for (size_t p = 0; p < 10; ++p) total += matrix[label][p].get<int64_t>();
    diagonal += matrix[label][label].get<int64_t>();
  }
  CHECK(total == 10000);
  CHECK(json.at("predictions").size() == 10000);
  CHECK(static_cast<double>(diagonal) / 10000 == test::Approx(json.at("accuracy").get<double>()).epsilon(1e-12));
  // Per class: recall is the diagonal over the row, precision over the column.
  const auto& per_class = json.at("classes");
  int64_t column3 = 0;
  for (size_t label = 0; label < 10; ++label) column3 += matrix[label][3].get<int64_t>();
  CHECK(per_class[3].at("precision").get<double>() ==
        test::Approx(double(matrix[3][3].get<int64_t>()) / double(column3)));
  CHECK(per_class[3].at("examples").get<int64_t>() == 1010);  // MNIST's test set has 1010 threes

  const auto table =
      test::run_command(cli(cat("eval --data ", test::mnist_dir(), " --load ", trained_model(), " --confusion")));
  INFO(table.out);
  CHECK(table.exit_code == 0);
  CHECK(table.out.find("rows: label, columns: prediction (10 classes)") != std::string::npos);
  CHECK(table.out.find("| examples  recall precision") != std::string::npos);
  CHECK(table.out.find("\n3 ") != std::string::npos);

  // --misclassified: PNGs named by index, label and prediction, holding the test images themselves.
  const std::string wrong = dir.file("wrong");
  const auto r = test::run_command(cli(cat("eval --data ", test::mnist_dir(), " --load ", trained_model(),
                                           " --misclassified ", wrong, " --misclassified-max 5")));
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(wrong)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  REQUIRE(names.size() == 5);
  const auto split = data::load_dataset_dir(test::mnist_dir(), "mnist");
  const auto& predictions = json.at("predictions");
  for (const auto& name : names) {
    INFO(name);
    const int64_t index = std::stoll(name.substr(0, 5));
    const int label = split.test.labels[static_cast<size_t>(index)];
    CHECK(name == cat(name.substr(0, 5), "-label-", label, "-pred-", predictions[static_cast<size_t>(index)].get<int>(),
                      ".png"));
    CHECK(label != predictions[static_cast<size_t>(index)].get<int>());
    const data::Image image = data::read_image((fs::path(wrong) / name).string());
    REQUIRE((image.channels == 1 && image.rows == 28 && image.cols == 28));
    CHECK(std::equal(image.pixels.begin(), image.pixels.end(), split.test.images.begin() + index * 784));
  }
}

TEST_CASE("predict on MNIST test images gives eval's predictions, from PNG files and from the IDX file",
          "[cpu][after]") {
  const test::TempDir dir;
  const nlohmann::json eval = eval_json(trained_model(), dir);
  const auto& predictions = eval.at("predictions");
  const auto split = data::load_dataset_dir(test::mnist_dir(), "mnist");
  std::string images;
  constexpr int kImages = 40;
  for (int i = 0; i < kImages; ++i) {
    const std::string path = dir.file(cat("test-", i, ".png"));
    data::write_png(
        path, {1, 28, 28,
               std::vector<uint8_t>(split.test.images.begin() + i * 784, split.test.images.begin() + (i + 1) * 784)});
    images += " " + path;
  }
  const auto r = test::run_command(cli(cat("predict --load ", trained_model(), " --json --top 3", images)));
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const auto lines = json_lines(r.out);
  REQUIRE(lines.size() == kImages);
  for (int i = 0; i < kImages; ++i) {
    const auto& top = lines[static_cast<size_t>(i)].at("top");
    REQUIRE(top.size() == 3);
    CHECK(top[0].at("class").get<int>() == predictions[static_cast<size_t>(i)].get<int>());
    CHECK(top[0].at("probability").get<double>() >= top[1].at("probability").get<double>());
    CHECK(top[1].at("probability").get<double>() >= top[2].at("probability").get<double>());
    CHECK(top[0].at("probability").get<double>() + top[1].at("probability").get<double>() <= 1.0 + 1e-12);
  }
  // The whole test file at once: every one of eval's 10000 predictions.
  std::string idx = test::mnist_dir() + "/t10k-images-idx3-ubyte";
  if (!fs::exists(idx)) idx += ".gz";
  const auto all = test::run_command(cli(cat("predict --load ", trained_model(), " --json --top 1 ", idx)));
  const auto all_lines = json_lines(all.out);
  REQUIRE(all_lines.size() == 10000);
  int64_t differing = 0;
  for (size_t i = 0; i < all_lines.size(); ++i)
    differing += all_lines[i].at("top")[0].at("class").get<int>() != predictions[i].get<int>();
  CHECK(differing == 0);
  // Text: "NAME: CLASS (P), ...".
  const auto text =
      test::run_command(cli(cat("predict --load ", trained_model(), " --top 2 ", dir.file("test-0.png"))));
  CHECK(text.out.rfind(dir.file("test-0.png") + ": " + std::to_string(predictions[0].get<int>()) + " (", 0) == 0);
}

TEST_CASE("predict refuses an image of another size naming both, unless --resize, and bad files are one line",
          "[cpu][after]") {
  const test::TempDir dir;
  const std::string big = dir.file("big.png"), rgb = dir.file("rgb.png"), broken = dir.file("broken.png");
  data::write_png(big, {1, 56, 40, std::vector<uint8_t>(56 * 40, 200)});
  data::write_png(rgb, {3, 28, 28, std::vector<uint8_t>(3 * 28 * 28, 90)});
  { std::ofstream(broken, std::ios::binary) << "\x89PNG\r\n\x1a\n not really"; }
  const auto refused = test::run_command(cli(cat("predict --load ", trained_model(), " ", big)));
  INFO(refused.out);
  CHECK(refused.exit_code == 1);
  CHECK(refused.out.find("image '" + big + "' is 40x56 (width x height) but the model takes 28x28; --resize") !=
        std::string::npos);
  const auto resized = test::run_command(cli(cat("predict --load ", trained_model(), " --resize ", big, " ", rgb)));
  INFO(resized.out);
  CHECK(resized.exit_code == 0);
  CHECK(resized.out.find(big + ": ") != std::string::npos);
  CHECK(resized.out.find(rgb + ": ") != std::string::npos);  // RGB to gray
  const auto bad = test::run_command(cli(cat("predict --load ", trained_model(), " ", broken)));
  INFO(bad.out);
  CHECK(bad.exit_code == 1);
  CHECK(bad.out.find(broken) != std::string::npos);
  CHECK(std::count(bad.out.begin(), bad.out.end(), '\n') == 1);
}

TEST_CASE("a resumed CPU run ends in the same bits and metrics as one never stopped", "[cpu][after][resume]") {
  test::check_resume_is_exact("cpu");
}

TEST_CASE("a run killed while writing a checkpoint keeps the one before, and goes on from it", "[cpu][after][resume]") {
  const test::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  // Checkpoints of about 10 MB (a 1024-wide layer and Adam's two moments) after every short epoch. Once the first is
  // there, the run is killed (-9) the moment the temporary of the next one appears: in the middle of its write.
  const std::string train =
      cli(cat("train --data ", test::mnist_dir(), " --train-limit 320 --epochs 100 ",
              "--model linear:1024,relu,linear:10 --optimizer adam --checkpoint-every 1 ", "--checkpoint-dir ", ckpt));
  const auto killed = test::run_command(
      cat(train, " >/dev/null 2>&1 & pid=$!; until [ -e ", ckpt, "/epoch-000001.safetensors ]; do sleep 0.005; done; ",
          "until ls ", ckpt, "/*.tmp.* >/dev/null 2>&1; do :; done; kill -9 $pid; wait $pid; echo killed $?"));
  INFO(killed.out);
  REQUIRE(killed.out.find("killed 137") != std::string::npos);  // 128 + SIGKILL: it did not finish on its own
  std::vector<std::string> whole, temporaries;
  for (const auto& e : fs::directory_iterator(ckpt))
    (e.path().filename().string().find(".tmp.") != std::string::npos ? temporaries : whole)
        .push_back(e.path().string());
  std::sort(whole.begin(), whole.end());
  INFO("whole: " << whole.size() << ", temporaries: " << temporaries.size());
  CHECK(temporaries.size() == 1);  // the write it was killed in
  REQUIRE_FALSE(whole.empty());
  for (const auto& path : whole) CHECK_NOTHROW(SafetensorsFile::read(path));  // every checkpoint there is whole
  const auto resumed =
      test::run_command(cli(cat("train --data ", test::mnist_dir(), " --resume ", whole.back(), " --epochs ",
                                whole.size() + 1, " --checkpoint-every 1 --checkpoint-dir ", ckpt)));
  INFO(resumed.out);
  CHECK(resumed.exit_code == 0);
  for (const auto& e : fs::directory_iterator(ckpt))  // its save cleared the dead writer's temporary
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("a checkpoint folder that cannot be written is refused before any work", "[cpu][after][cli]") {
  const test::TempDir dir;
  const std::string file = dir.file("a-file");
  std::ofstream(file) << "x";
  for (const std::string& target : {file, std::string("/proc/nanotrain-checkpoints")}) {
    const auto r = test::run_command(
        cli(cat("train --data ", test::mnist_dir(), " --epochs 1 --checkpoint-every 1 --checkpoint-dir ", target)));
    INFO(r.out);
    CHECK(r.exit_code == 2);
    CHECK(r.out.rfind("nanotrain: --checkpoint-dir: ", 0) == 0);
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  }
}
