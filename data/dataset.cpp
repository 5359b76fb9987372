// Data sets from IDX files: pair images with labels, find the standard files in a folder, and fix the
// normalization statistics from the train split.
#include "data/dataset.h"

#include <array>
#include <cmath>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "data/idx.h"

namespace nt::data {
namespace {

namespace fs = std::filesystem;

// The standard constants for MNIST (mean and std of the train pixels in [0,1], as everyone uses them).
constexpr float kMnistMean = 0.1307f;
constexpr float kMnistStd = 0.3081f;

constexpr const char* kStandardFiles[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

// The paths of the four standard files in `dir`: `dir/base`, or `dir/base.gz` when only that exists.
// Reports every missing file in one line.
std::array<std::string, 4> find_standard_files(const fs::path& dir, const std::string& name) {
  std::array<std::string, 4> paths;
  std::string missing;
  for (size_t i = 0; i < paths.size(); ++i) {
    std::error_code ec;
    fs::path raw = dir / kStandardFiles[i], gz = dir / (std::string(kStandardFiles[i]) + ".gz");
    if (fs::is_regular_file(raw, ec)) paths[i] = raw.string();
    else if (fs::is_regular_file(gz, ec)) paths[i] = gz.string();
    else if (fs::is_directory(raw, ec) || fs::is_directory(gz, ec))  // there, but not a file: "missing" would mislead
      throw Error(cat("dataset '", name, "': ", fs::is_directory(raw, ec) ? raw.string() : gz.string(),
                      " is a folder, not an IDX file"));
    else missing += cat(missing.empty() ? "" : ", ", kStandardFiles[i]);
  }
  if (!missing.empty())
    throw Error(cat("dataset '", name, "': missing ", missing, " (raw or .gz) in ", dir.string(),
                    "; scripts/fetch-data fetches the standard data sets"));
  return paths;
}

}  // namespace

Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path, int classes,
                      std::string name) {
  if (classes < 1 || classes > 256)
    throw Error(cat("dataset '", name, "': ", classes, " classes; byte labels allow 1 to 256"));
  IdxImages images = read_idx_images(images_path);
  IdxLabels labels = read_idx_labels(labels_path);
  if (images.count != labels.count)
    throw Error(cat("dataset '", name, "': count mismatch: '", images_path, "' has ", images.count,
                    " images but '", labels_path, "' has ", labels.count, " labels"));
  for (int64_t i = 0; i < labels.count; ++i) {
    if (labels.labels[i] >= classes)
      throw Error(cat("IDX labels file '", labels_path, "': label out of range at index ", i, ": value ",
                      int(labels.labels[i]), ", expected 0..", classes - 1));
  }
  Dataset d;
  d.name = std::move(name);
  d.count = images.count;
  d.channels = 1;
  d.rows = images.rows;
  d.cols = images.cols;
  d.classes = classes;
  d.images = std::move(images.pixels);
  d.labels = std::move(labels.labels);
  return d;
}

DatasetSplit load_dataset_dir(const std::string& dir, std::string name) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(cat("dataset '", name, "': folder ", dir, " does not exist",
                    "; scripts/fetch-data fetches the standard data sets"));
  auto files = find_standard_files(dir, name);
  DatasetSplit split;
  split.train = load_idx_pair(files[0], files[1], 10, name);
  split.test = load_idx_pair(files[2], files[3], 10, name);
  if (split.train.image_size() != split.test.image_size())
    throw Error(cat("dataset '", name, "': train images are ", split.train.rows, "x", split.train.cols,
                    " but test images are ", split.test.rows, "x", split.test.cols, " (in ", dir, ")"));

  float norm_mean = kMnistMean, norm_std = kMnistStd;
  if (name != "mnist") {
    PixelStats s = pixel_stats(split.train.images);
    norm_mean = static_cast<float>(s.mean);
    norm_std = static_cast<float>(s.std);
    if (!(norm_std > 0))
      throw Error(cat("dataset '", name, "': every train pixel in ", dir, " has the same value; ",
                      "cannot normalize"));
  }
  for (Dataset* part : {&split.train, &split.test}) {
    part->mean = norm_mean;
    part->std = norm_std;
  }
  return split;
}

PixelStats pixel_stats(std::span<const uint8_t> pixels) {
  // A histogram makes the sums exact integers, so the result does not depend on summation order.
  // Four interleaved histograms: runs of equal pixels (MNIST is mostly 0) would otherwise serialize
  // on one counter's store-to-load latency.
  std::array<std::array<int64_t, 256>, 4> partial{};
  size_t i = 0;
  for (; i + 4 <= pixels.size(); i += 4)
    for (size_t k = 0; k < 4; ++k) ++partial[k][pixels[i + k]];
  for (; i < pixels.size(); ++i) ++partial[0][pixels[i]];
  std::array<int64_t, 256> histogram{};
  for (const auto& h : partial)
    for (int v = 0; v < 256; ++v) histogram[v] += h[v];
  PixelStats s;
  if (pixels.empty()) return s;
  double n = static_cast<double>(pixels.size());
  for (int v = 0; v < 256; ++v) s.mean += static_cast<double>(histogram[v]) * (v / 255.0);
  s.mean /= n;
  double var = 0;   // two-pass: deviations from the mean, no cancellation
  for (int v = 0; v < 256; ++v) {
    double dev = v / 255.0 - s.mean;
    var += static_cast<double>(histogram[v]) * dev * dev;
  }
  s.std = std::sqrt(var / n);   // population std, as the MNIST constants are
  return s;
}

Dataset subset(const Dataset& d, int64_t first, int64_t count) {
  if (first < 0 || count < 0 || first + count > d.count)
    throw Error(cat("dataset '", d.name, "': subset [", first, ", ", first + count, ") is outside its ",
                    d.count, " examples"));
  Dataset s;
  s.name = d.name;
  s.count = count;
  s.channels = d.channels;
  s.rows = d.rows;
  s.cols = d.cols;
  s.classes = d.classes;
  s.mean = d.mean;
  s.std = d.std;
  int64_t size = d.image_size();
  s.images.assign(d.images.begin() + first * size, d.images.begin() + (first + count) * size);
  s.labels.assign(d.labels.begin() + first, d.labels.begin() + first + count);
  return s;
}

}  // namespace nt::data
