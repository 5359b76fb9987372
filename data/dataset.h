// A labelled image data set held in host memory as bytes, plus the normalization it trains with.
//
// Images stay uint8 until the batcher gathers a batch: x = (pixel/255 - mean[c]) / std[c] for channel c.
// `mean` and `std` hold one value per channel, in [0,1] pixel units, and come from the TRAIN split (MNIST uses
// the field's standard constants), so train and test are normalized alike. Images are planar, (C, H, W) each,
// whatever the file's layout; at most kernels::kMaxBatchChannels channels (a file with more is refused here,
// naming it).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace nt::data {

struct Dataset {
  std::string name;
  int64_t count = 0;
  int channels = 1, rows = 0, cols = 0;
  int classes = 10;
  std::vector<uint8_t> images;             // (count, channels, rows, cols) row-major
  std::vector<uint8_t> labels;             // (count), each < classes
  std::vector<float> mean{0.f}, std{1.f};  // (channels)
  std::vector<std::string> class_names;    // (classes) when the data names its classes; empty when unknown

  int64_t image_size() const { return int64_t(channels) * rows * cols; }
};

struct DatasetSplit {
  Dataset train, test;
};

// One images file (rank 3, or rank 4 with channels last, which becomes planar here) and one labels file of the
// same length. classes: 0 takes the largest label + 1; N (1 to 256) requires every label < N (an error names
// the labels file, the index and N). Normalization fields are left at 0/1 per channel: load_dataset_dir sets
// them from the train split.
Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path, int classes, std::string name);

// A data set from folder `dir`:
//   name "cifar10": the CIFAR-10 binary batches (data/cifar.h, load_cifar10_dir);
//   any other name: the four standard IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte,
//   t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte), each raw or with a .gz suffix (raw preferred); the
//   images files may be rank 4 (channels last) under the same names.
// classes: 0 takes the largest TRAIN label + 1 (CIFAR-10: 10, the format's); N requires every train label < N.
// A test label outside the trained range (>= classes) is an error naming the test file and the label.
// Sets mean/std of both splits (set_normalization).
DatasetSplit load_dataset_dir(const std::string& dir, std::string name, int classes = 0);

// Sets mean/std of both splits from the train split: the MNIST constants 0.1307/0.3081 for a one-channel set
// named "mnist", else each channel's exact mean and population std over the train images (channel_stats). A
// channel whose train pixels all have one value cannot be normalized: an error naming `dir`.
void set_normalization(DatasetSplit& split, const std::string& dir);

// Mean and population standard deviation of pixels in [0,1] units (pixel/255), computed exactly from a
// byte histogram in double precision.
struct PixelStats {
  double mean = 0, std = 0;
};
PixelStats pixel_stats(std::span<const uint8_t> pixels);
// The same for each channel of `d`'s planar images: element c covers plane c of every image (one histogram per
// channel; for one channel exactly pixel_stats(d.images)).
std::vector<PixelStats> channel_stats(const Dataset& d);

// The examples [first, first + count) of `d`, with its normalization and class names (for tests and quick runs).
Dataset subset(const Dataset& d, int64_t first, int64_t count);

}  // namespace nt::data
