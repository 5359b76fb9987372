// CIFAR-10 binary batches: records written here in the real format (1 label byte, then the R, G and B planes of
// 32x32), read back exactly and planar; the folder loader joins the five train batches in order, reads the class
// names, normalizes per channel from the train images; each bad input gets a one-line error naming its file.
#include "test_support.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/cifar.h"
#include "data/dataset.h"
#include "engine/checkpoint.h"

namespace nt::test {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

constexpr int kPlane = 32 * 32;

// One record: the label, then pixel(c, k) for k = row * 32 + column of plane c (R, G, B).
template <class F>
void add_record(Bytes& out, uint8_t label, F pixel) {
  out.push_back(label);
  for (int c = 0; c < 3; ++c)
    for (int k = 0; k < kPlane; ++k) out.push_back(pixel(c, k));
}

// Varied bytes, different in every record, plane and position.
uint8_t varied(int record, int c, int k) { return static_cast<uint8_t>(13 * record + 101 * c + 7 * k + k / 32); }

// Bytes whose per-channel statistics are exact in double, whatever the records' number: in every image the red
// plane is half 0 and half 255 (mean 0.5, std 0.5), green a quarter 255 (mean 0.25, std sqrt(0.1875)), blue three
// quarters 255 (mean 0.75, std sqrt(0.1875)); the record index moves the pattern so records differ.
uint8_t exact(int record, int c, int k) {
  const int m = (k + record) % 4;
  if (c == 0) return m % 2 ? 255 : 0;
  if (c == 1) return m == 0 ? 255 : 0;
  return m != 0 ? 255 : 0;
}

void write_bytes(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  REQUIRE(f.good());
}

// A batch of records labelled `labels`, records numbered from `first` for the pixel pattern.
template <class F>
Bytes batch(const std::vector<uint8_t>& labels, int first, F pattern) {
  Bytes b;
  for (size_t i = 0; i < labels.size(); ++i)
    add_record(b, labels[i], [&](int c, int k) { return pattern(first + int(i), c, k); });
  return b;
}

const char* const kNames[10] = {"airplane", "automobile", "bird",  "cat",  "deer",
                                "dog",      "frog",       "horse", "ship", "truck"};

// A whole folder: train batches of 1, 2, 1, 3 and 1 records (labels 0..7 in order), a test batch of 2, the meta
// file with the names one per line, CRLF endings and blank lines (as the real one ends with one).
void write_folder(const TempDir& dir) {
  const std::vector<std::vector<uint8_t>> train = {{0}, {1, 2}, {3}, {4, 5, 6}, {7}};
  int first = 0;
  for (size_t i = 0; i < train.size(); ++i) {
    write_bytes(dir.file("data_batch_" + std::to_string(i + 1) + ".bin"), batch(train[i], first, exact));
    first += int(train[i].size());
  }
  write_bytes(dir.file("test_batch.bin"), batch({9, 8}, 100, exact));
  std::string meta;
  for (const char* n : kNames) meta += std::string(n) + "\r\n";
  write_text(dir.file("batches.meta.txt"), "\n" + meta + "\n\n");
}

}  // namespace

TEST_CASE("A CIFAR-10 batch reads its labels and its planar images exactly", "[cpu][data]") {
  const TempDir dir;
  const std::string path = dir.file("data_batch_1.bin");
  write_bytes(path, batch({3, 9, 0}, 0, varied));
  const auto b = data::read_cifar10_batch(path);
  REQUIRE(b.count == 3);
  REQUIRE(b.labels == Bytes{3, 9, 0});
  REQUIRE(b.images.size() == size_t(3 * 3 * kPlane));
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c)
      for (int k = 0; k < kPlane; ++k) {
        INFO("record " << r << " channel " << c << " pixel " << k);
        REQUIRE(b.images[size_t((r * 3 + c) * kPlane + k)] == varied(r, c, k));
      }
}

TEST_CASE("A CIFAR-10 folder: five train batches in order, the test batch, names, per-channel statistics",
          "[cpu][data]") {
  const TempDir dir;
  write_folder(dir);
  for (const bool through_dispatch : {false, true}) {
    INFO((through_dispatch ? "load_dataset_dir(dir, \"cifar10\")" : "load_cifar10_dir(dir)"));
    const auto split =
        through_dispatch ? data::load_dataset_dir(dir.path, "cifar10") : data::load_cifar10_dir(dir.path);
    const std::vector<std::string> names(std::begin(kNames), std::end(kNames));
    const std::vector<float> want_mean{0.5f, 0.25f, 0.75f};
    const std::vector<float> want_std{0.5f, static_cast<float>(std::sqrt(0.1875)),
                                      static_cast<float>(std::sqrt(0.1875))};
    for (const auto* d : {&split.train, &split.test}) {
      REQUIRE(d->name == "cifar10");
      REQUIRE(d->channels == 3);
      REQUIRE(d->rows == 32);
      REQUIRE(d->cols == 32);
      REQUIRE(d->classes == 10);
      REQUIRE(d->class_names == names);
      REQUIRE(d->mean == want_mean);  // from the train split, for both
      REQUIRE(d->std == want_std);
    }
    REQUIRE(split.train.count == 8);
    REQUIRE(split.train.labels == Bytes{0, 1, 2, 3, 4, 5, 6, 7});
    REQUIRE(split.test.count == 2);
    REQUIRE(split.test.labels == Bytes{9, 8});
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 3; ++c)
        for (int k : {0, 1, 2, 3, 1023})
          REQUIRE(split.train.images[size_t((r * 3 + c) * kPlane + k)] == exact(r, c, k));
    REQUIRE(split.test.images[size_t(1 * 3 * kPlane + 2)] == exact(101, 0, 2));
    // The statistics are channel_stats' own, which for each channel is pixel_stats of its planes.
    const auto stats = data::channel_stats(split.train);
    for (int c = 0; c < 3; ++c) REQUIRE(static_cast<float>(stats[size_t(c)].mean) == want_mean[size_t(c)]);
  }
  // Under another name the folder is an IDX folder, whose files are not there.
  REQUIRE_THROWS_WITH(data::load_dataset_dir(dir.path, "cifar"), Contains("missing train-images-idx3-ubyte"));
}

TEST_CASE("CIFAR-10 classes: the format's 10, or N with labels checked, and names only when one per class", "[cpu][data]") {
  const TempDir dir;
  write_folder(dir);
  SECTION("a given count at least the labels keeps them; the names go when they do not number it") {
    const auto split = data::load_dataset_dir(dir.path, "cifar10", 12);
    REQUIRE(split.train.classes == 12);
    REQUIRE(split.test.classes == 12);
    REQUIRE(split.train.class_names.empty());
  }
  SECTION("a train label >= N names the file, the record and N") {
    REQUIRE_THROWS_WITH(
        data::load_dataset_dir(dir.path, "cifar10", 5),
        names(dir.file("data_batch_4.bin"), "label out of range at record 1: value 5") && Contains("(5 classes)"));
  }
  SECTION("a test label outside the trained range names the test file and the label") {
    write_bytes(dir.file("test_batch.bin"), batch({1, 8}, 0, exact));
    REQUIRE_THROWS_WITH(
        data::load_dataset_dir(dir.path, "cifar10", 8),
        names(dir.file("test_batch.bin"), "test label 8 at record 1") && Contains("outside the trained range 0..7"));
  }
  SECTION("without batches.meta.txt the names are unknown") {
    fs::remove(dir.file("batches.meta.txt"));
    const auto split = data::load_cifar10_dir(dir.path);
    REQUIRE(split.train.class_names.empty());
    REQUIRE(split.train.classes == 10);
  }
}

TEST_CASE("CIFAR-10 faults: one line naming the file", "[cpu][data]") {
  const TempDir dir;
  write_folder(dir);
  const std::string batch3 = dir.file("data_batch_3.bin");

  SECTION("a length that is not a whole number of records") {
    Bytes b = batch({1, 2}, 0, varied);
    for (size_t cut : {size_t(1), size_t(3073), size_t(3074)}) {
      INFO("cut " << cut);
      write_bytes(batch3, Bytes(b.begin(), b.end() - static_cast<long>(cut)));
      if (cut == 3073) {
        REQUIRE(data::read_cifar10_batch(batch3).count == 1);  // one whole record is fine
        continue;
      }
      REQUIRE_THROWS_WITH(data::load_cifar10_dir(dir.path), names(batch3, "is not a multiple of the 3073-byte record"));
    }
    b.push_back(0);
    write_bytes(batch3, b);
    REQUIRE_THROWS_WITH(data::read_cifar10_batch(batch3),
                        names(batch3, "length 6147 is not a multiple") && Contains("2 records and 1 bytes over"));
  }
  SECTION("an empty file") {
    write_bytes(batch3, {});
    REQUIRE_THROWS_WITH(data::load_cifar10_dir(dir.path), names(batch3, "empty file"));
  }
  SECTION("a label above 9") {
    write_bytes(batch3, batch({4, 10}, 0, varied));
    REQUIRE_THROWS_WITH(data::load_cifar10_dir(dir.path),
                        names(batch3, "label out of range at record 1: value 10, expected 0..9"));
    write_bytes(dir.file("test_batch.bin"), batch({255}, 0, varied));
    REQUIRE_THROWS_WITH(data::read_cifar10_batch(dir.file("test_batch.bin")),
                        names(dir.file("test_batch.bin"), "value 255"));
  }
  SECTION("missing files are named, all of them, with the folder") {
    fs::remove(batch3);
    fs::remove(dir.file("test_batch.bin"));
    REQUIRE_THROWS_WITH(
        data::load_dataset_dir(dir.path, "cifar10"),
        Contains("missing data_batch_3.bin, test_batch.bin in " + dir.path) && Contains("scripts/fetch-data cifar10"));
    REQUIRE_THROWS_WITH(data::read_cifar10_batch(batch3), names(batch3, "file not found"));
  }
  SECTION("a folder where a batch should be") {
    fs::remove(batch3);
    fs::create_directory(batch3);
    REQUIRE_THROWS_WITH(data::read_cifar10_batch(batch3), names(batch3, "is a directory"));
    REQUIRE_THROWS_WITH(data::load_cifar10_dir(dir.path), Contains("missing data_batch_3.bin"));
  }
  SECTION("a meta file with the wrong number of names") {
    write_text(dir.file("batches.meta.txt"), "cat\ndog\n\nbird\n");
    REQUIRE_THROWS_WITH(data::load_cifar10_dir(dir.path),
                        names(dir.file("batches.meta.txt"), "3 class names, expected 10"));
    std::string eleven;
    for (int i = 0; i < 11; ++i) eleven += cat("c", i, "\n");
    write_text(dir.file("batches.meta.txt"), eleven);
    REQUIRE_THROWS_WITH(data::read_cifar10_class_names(dir.file("batches.meta.txt")),
                        names(dir.file("batches.meta.txt"), "more than 10 class names"));
  }
  SECTION("a folder that is not there") {
    REQUIRE_THROWS_WITH(data::load_dataset_dir(dir.file("absent"), "cifar10"),
                        Contains(dir.file("absent")) && Contains("does not exist"));
  }
}

TEST_CASE("the cnn preset trains on CIFAR-10's 3x32x32 and its checkpoint names the classes for predict",
          "[cpu][data][cli]") {
  const TempDir dir;
  write_folder(dir);
  const std::string model = dir.file("cnn.safetensors"), image = dir.file("red.ppm");
  const auto trained = run_command(cat(cli_path(), " train --device cpu --log-level warn --dataset cifar10 --data ",
                                       dir.path, " --model cnn --epochs 2 --batch 4 --flip --shift 1 --save ", model));
  INFO(trained.out);
  REQUIRE(trained.exit_code == 0);
  const auto meta = SafetensorsFile::read(model).metadata();
  CHECK(meta.at("input_shape") == "3,32,32");
  CHECK(meta.at("dataset") == "cifar10");
  CHECK(meta.at("class_names").find("\"airplane\",\"automobile\"") != std::string::npos);
  CHECK(std::count(meta.at("normalization_mean").begin(), meta.at("normalization_mean").end(), ',') == 2);
  // A 32x32 red PPM: predict answers with the data's class names.
  std::string ppm = "P6\n32 32\n255\n";
  for (int i = 0; i < 32 * 32; ++i) ppm += std::string("\xff\x00\x00", 3);
  write_text(image, ppm);
  const auto predicted =
      run_command(cat(cli_path(), " predict --device cpu --log-level warn --top 10 --load ", model, " ", image));
  INFO(predicted.out);
  REQUIRE(predicted.exit_code == 0);
  for (const char* name : kNames) CHECK(predicted.out.find(std::string(" ") + name + " (") != std::string::npos);
}

}  // namespace nt::test
