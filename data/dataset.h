// A labelled image data set held in host memory as bytes, plus the normalization it trains with.
//
// Images stay uint8 until the batcher gathers a batch: x = (pixel/255 - mean) / std. `mean` and `std`
// are in [0,1] pixel units and come from the TRAIN split (MNIST uses the field's standard constants),
// so train and test are normalized alike.
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
  std::vector<uint8_t> images;   // (count, channels, rows, cols) row-major
  std::vector<uint8_t> labels;   // (count), each < classes
  float mean = 0.f, std = 1.f;

  int64_t image_size() const { return int64_t(channels) * rows * cols; }
};

struct DatasetSplit {
  Dataset train, test;
};

// One images file and one labels file of the same length; every label must be < classes.
// Normalization fields are left at 0/1: load_dataset_dir sets them from the train split.
Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path, int classes,
                      std::string name);

// The four standard files in `dir` (train-images-idx3-ubyte, train-labels-idx1-ubyte,
// t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte), each raw or with a .gz suffix (raw preferred).
// Sets mean/std of both splits: the MNIST constants for name "mnist", else computed on the train images.
DatasetSplit load_dataset_dir(const std::string& dir, std::string name);

// Mean and population standard deviation of pixels in [0,1] units (pixel/255), computed exactly from a
// byte histogram in double precision.
struct PixelStats {
  double mean = 0, std = 0;
};
PixelStats pixel_stats(std::span<const uint8_t> pixels);

// The examples [first, first + count) of `d`, with its normalization (for tests and quick runs).
Dataset subset(const Dataset& d, int64_t first, int64_t count);

}  // namespace nt::data
