// Data sets from IDX files (or CIFAR-10 batches, data/cifar.h): pair images with labels, make the images
// planar, find the standard files in a folder, settle the class count, and fix the normalization statistics
// from the train split.
#include "data/dataset.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <new>
#include <utility>

#include "core/error.h"
#include "data/cifar.h"
#include "data/idx.h"
#include "kernels/batch.h"

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
    if (fs::is_regular_file(raw, ec))
      paths[i] = raw.string();
    else if (fs::is_regular_file(gz, ec))
      paths[i] = gz.string();
    else if (fs::is_directory(raw, ec) || fs::is_directory(gz, ec))  // there, but not a file: "missing" would mislead
      throw Error(cat("dataset '", name, "': ", fs::is_directory(raw, ec) ? raw.string() : gz.string(),
                      " is a folder, not an IDX file"));
    else
      missing += cat(missing.empty() ? "" : ", ", kStandardFiles[i]);
  }
  if (!missing.empty())
    throw Error(cat("dataset '", name, "': missing ", missing, " (raw or .gz) in ", dir.string(),
                    "; scripts/fetch-data fetches the standard data sets"));
  return paths;
}

// (count, P, C) channels last -> (count, C, P) planar, P = rows * cols.
std::vector<uint8_t> to_planar(const std::vector<uint8_t>& interleaved, int64_t count, int64_t P, int C) {
  std::vector<uint8_t> planar(interleaved.size());
  const int64_t D = P * C;
  for (int64_t n = 0; n < count; ++n) {
    const uint8_t* in = interleaved.data() + n * D;  // (P, C)
    uint8_t* out = planar.data() + n * D;            // (C, P)
    for (int64_t p = 0; p < P; ++p)
      for (int c = 0; c < C; ++c) out[c * P + p] = in[p * C + c];
  }
  return planar;
}

void check_class_count(int classes, const std::string& name) {
  if (classes < 0 || classes > 256)
    throw Error(cat("dataset '", name, "': ", classes, " classes; byte labels allow 1 to 256 (0: from the data)"));
}

// The images and labels of one pair, counts matched and images planar; classes and labels not yet checked.
Dataset read_pair(const std::string& images_path, const std::string& labels_path, std::string name) {
  IdxImages images = read_idx_images(images_path);
  if (images.channels > kernels::kMaxBatchChannels)
    throw Error(cat("IDX images file '", images_path, "': ", images.channels, " channels; the batch kernels take 1 to ",
                    kernels::kMaxBatchChannels));
  IdxLabels labels = read_idx_labels(labels_path);
  if (images.count != labels.count)
    throw Error(cat("dataset '", name, "': count mismatch: '", images_path, "' has ", images.count, " images but '",
                    labels_path, "' has ", labels.count, " labels"));
  Dataset d;
  d.name = std::move(name);
  d.count = images.count;
  d.channels = images.channels;
  d.rows = images.rows;
  d.cols = images.cols;
  d.mean.assign(size_t(d.channels), 0.f);
  d.std.assign(size_t(d.channels), 1.f);
  if (d.channels == 1) {
    d.images = std::move(images.pixels);
  } else {
    try {
      d.images = to_planar(images.pixels, d.count, int64_t(d.rows) * d.cols, d.channels);
    } catch (const std::bad_alloc&) {
      throw OutOfMemory(
          cat("IDX images file '", images_path, "': out of memory making its ", images.pixels.size(), " bytes planar"));
    }
  }
  d.labels = std::move(labels.labels);
  return d;
}

// The class count of a train split: `classes` when given (every label below it), else the largest label + 1.
int settle_classes(const std::vector<uint8_t>& labels, int classes, const std::string& labels_path) {
  if (classes == 0) return labels.empty() ? 1 : *std::max_element(labels.begin(), labels.end()) + 1;
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= classes)
      throw Error(cat("IDX labels file '", labels_path, "': label out of range at index ", i, ": value ",
                      int(labels[i]), ", expected 0..", classes - 1, " (", classes, " classes)"));
  return classes;
}

// A test split's labels must lie in the range the model was trained for.
void check_test_labels(const std::vector<uint8_t>& labels, int classes, const std::string& labels_path) {
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= classes)
      throw Error(cat("IDX labels file '", labels_path, "': test label ", int(labels[i]), " at index ", i,
                      " is outside the trained range 0..", classes - 1, " (", classes, " classes)"));
}

// "28x28", or "32x32x3" for several channels (HxWxC, as a rank-4 IDX file states it).
std::string shape_text(const Dataset& d) {
  return d.channels == 1 ? cat(d.rows, "x", d.cols) : cat(d.rows, "x", d.cols, "x", d.channels);
}

// Four histograms interleaved: runs of equal pixels (MNIST is mostly 0) would otherwise serialize on one counter's
// store-to-load latency. Counts are exact integers, so the statistics do not depend on the order of adding.
class Histogram {
 public:
  void add(std::span<const uint8_t> pixels) {
    size_t i = 0;
    for (; i + 4 <= pixels.size(); i += 4)
      for (size_t k = 0; k < 4; ++k) ++partial_[k][pixels[i + k]];
    for (; i < pixels.size(); ++i) ++partial_[0][pixels[i]];
    n_ += pixels.size();
  }
  PixelStats stats() const {
    std::array<int64_t, 256> histogram{};
    for (const auto& h : partial_)
      for (int v = 0; v < 256; ++v) histogram[v] += h[v];
    PixelStats s;
    if (n_ == 0) return s;
    double n = static_cast<double>(n_);
    for (int v = 0; v < 256; ++v) s.mean += static_cast<double>(histogram[v]) * (v / 255.0);
    s.mean /= n;
    double var = 0;  // two-pass: deviations from the mean, no cancellation
    for (int v = 0; v < 256; ++v) {
      double dev = v / 255.0 - s.mean;
      var += static_cast<double>(histogram[v]) * dev * dev;
    }
    s.std = std::sqrt(var / n);  // population std, as the MNIST constants are
    return s;
  }

 private:
  std::array<std::array<int64_t, 256>, 4> partial_{};
  size_t n_ = 0;
};

}  // namespace

Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path, int classes, std::string name) {
  check_class_count(classes, name);
  Dataset d = read_pair(images_path, labels_path, std::move(name));
  d.classes = settle_classes(d.labels, classes, labels_path);
  return d;
}

DatasetSplit load_dataset_dir(const std::string& dir, std::string name, int classes) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(cat("dataset '", name, "': folder ", dir, " does not exist",
                    "; scripts/fetch-data fetches the standard data sets"));
  check_class_count(classes, name);
  if (name == "cifar10") return load_cifar10_dir(dir, classes);
  auto files = find_standard_files(dir, name);
  DatasetSplit split;
  split.train = load_idx_pair(files[0], files[1], classes, name);
  split.test = read_pair(files[2], files[3], name);
  if (split.train.channels != split.test.channels || split.train.rows != split.test.rows ||
      split.train.cols != split.test.cols)
    throw Error(cat("dataset '", name, "': train images are ", shape_text(split.train), " but test images are ",
                    shape_text(split.test), " (in ", dir, ")"));
  split.test.classes = split.train.classes;
  check_test_labels(split.test.labels, split.test.classes, files[3]);
  set_normalization(split, dir);
  return split;
}

void set_normalization(DatasetSplit& split, const std::string& dir) {
  const Dataset& train = split.train;
  const size_t C = size_t(train.channels);
  std::vector<float> norm_mean(C, kMnistMean), norm_std(C, kMnistStd);
  if (train.name != "mnist" || C != 1) {
    const std::vector<PixelStats> stats = channel_stats(train);
    for (size_t c = 0; c < C; ++c) {
      norm_mean[c] = static_cast<float>(stats[c].mean);
      norm_std[c] = static_cast<float>(stats[c].std);
      if (!(norm_std[c] > 0))
        throw Error(C == 1 ? cat("dataset '", train.name, "': every train pixel in ", dir, " has the same value; ",
                                 "cannot normalize")
                           : cat("dataset '", train.name, "': every train pixel of channel ", c, " in ", dir,
                                 " has the same value; cannot normalize"));
    }
  }
  for (Dataset* part : {&split.train, &split.test}) {
    part->mean = norm_mean;
    part->std = norm_std;
  }
}

PixelStats pixel_stats(std::span<const uint8_t> pixels) {
  Histogram h;
  h.add(pixels);
  return h.stats();
}

std::vector<PixelStats> channel_stats(const Dataset& d) {
  const int C = std::max(1, d.channels);
  if (C == 1) return {pixel_stats(d.images)};
  const int64_t P = int64_t(d.rows) * d.cols;
  std::vector<Histogram> per_channel(static_cast<size_t>(C));
  const std::span<const uint8_t> all(d.images);
  for (int64_t n = 0; n < d.count; ++n)
    for (int c = 0; c < C; ++c) per_channel[size_t(c)].add(all.subspan(size_t((n * C + c) * P), size_t(P)));
  std::vector<PixelStats> stats;
  for (const Histogram& h : per_channel) stats.push_back(h.stats());
  return stats;
}

Dataset subset(const Dataset& d, int64_t first, int64_t count) {
  if (first < 0 || count < 0 || first + count > d.count)
    throw Error(
        cat("dataset '", d.name, "': subset [", first, ", ", first + count, ") is outside its ", d.count, " examples"));
  Dataset s;
  s.name = d.name;
  s.count = count;
  s.channels = d.channels;
  s.rows = d.rows;
  s.cols = d.cols;
  s.classes = d.classes;
  s.mean = d.mean;
  s.std = d.std;
  s.class_names = d.class_names;
  int64_t size = d.image_size();
  s.images.assign(d.images.begin() + first * size, d.images.begin() + (first + count) * size);
  s.labels.assign(d.labels.begin() + first, d.labels.begin() + first + count);
  return s;
}

}  // namespace nt::data
