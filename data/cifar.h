// CIFAR-10, binary version (https://www.cs.toronto.edu/~kriz/cifar.html, cifar-10-binary.tar.gz).
//
// A batch file is records of 3073 bytes and nothing else: 1 label byte (0..9), then the 32x32 image as 3072 bytes,
// the red plane, then green, then blue, each row-major; that is already the engine's planar (C, H, W) layout.
// The folder (cifar-10-batches-bin/ of the archive) holds data_batch_1.bin .. data_batch_5.bin (10,000 records
// each: the train split), test_batch.bin (the test split) and batches.meta.txt (the class names, one per line,
// in label order; blank lines ignored). Anything wrong with a file is an nt::Error whose one-line message names
// the file and the fault: missing, a length that is not a whole number of records, a label above 9.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace nt::data {

inline constexpr int kCifarSide = 32, kCifarChannels = 3, kCifarClasses = 10;
inline constexpr int64_t kCifarImageBytes = int64_t(kCifarChannels) * kCifarSide * kCifarSide;  // 3072
inline constexpr int64_t kCifarRecordBytes = 1 + kCifarImageBytes;                              // 3073

struct CifarBatch {
  int64_t count = 0;
  std::vector<uint8_t> images;  // (count, 3, 32, 32) row-major
  std::vector<uint8_t> labels;  // (count), each <= 9
};

// One batch file, read whole; its size is checked before anything is allocated.
CifarBatch read_cifar10_batch(const std::string& path);

// The class names of batches.meta.txt: its non-blank lines, trailing white space (a CR included) removed. There
// must be exactly 10.
std::vector<std::string> read_cifar10_class_names(const std::string& path);

// The train split (the five data batches, in order) and the test split of folder `dir`, named "cifar10", with
// per-channel normalization from the train images (set_normalization) and, when batches.meta.txt is there, the
// class names. Every missing batch is named in one line. classes: 0 takes the format's 10; N requires every train
// label < N (an error names the file, the record and N); a test label >= the class count is an error naming the
// test file and the label. The class names are kept when there is one per class.
DatasetSplit load_cifar10_dir(const std::string& dir, int classes = 0);

}  // namespace nt::data
