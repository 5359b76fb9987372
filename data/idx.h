// IDX files (the MNIST format, http://yann.lecun.com/exdb/mnist/), raw or gzip-compressed.
//
// Layout: a 4-byte big-endian magic 0x0000TTRR (TT = element type, 0x08 = unsigned byte; RR = rank),
// then RR big-endian uint32 dimensions, then the elements in row-major order. We read three kinds:
//   images: magic 2051 (0x00000803), dims (count, rows, cols),           one byte per pixel
//           magic 2052 (0x00000804), dims (count, rows, cols, channels), one byte per pixel and channel,
//                                     channels last (interleaved, as the format stores them)
//   labels: magic 2049 (0x00000801), dims (count),                       one byte per label
// A file whose first two bytes are the gzip magic 1f 8b is decompressed on the fly (the name does not
// matter). Anything wrong with a file is an nt::Error whose one-line message names the file and the fault.
// No buffer is sized from a declared dimension before the bytes are there: a raw file's size is checked
// against the header first, a gzip's payload grows by chunks as it decompresses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nt::data {

struct IdxImages {
  int64_t count = 0;
  int rows = 0, cols = 0;
  int channels = 1;             // 1 for a rank-3 file; the fourth dimension of a rank-4 one
  std::vector<uint8_t> pixels;  // (count, rows, cols, channels) row-major, as stored: channels last
};

struct IdxLabels {
  int64_t count = 0;
  std::vector<uint8_t> labels;  // (count)
};

IdxImages read_idx_images(const std::string& path);
IdxLabels read_idx_labels(const std::string& path);

}  // namespace nt::data
