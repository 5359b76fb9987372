// The IDX reader (data/idx.h) on any bytes, raw or gzip: images and labels alike. A bad file must end in nt::Error;
// anything else (a crash, a sanitizer report, a leak, a timeout, memory beyond libFuzzer's -rss_limit_mb) is a
// finding. A declared count never allocates beyond what the file holds, so inputs of a few KiB stay small.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "data/idx.h"
#include "memory_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static nt::fuzz::MemoryFile file;
  const std::string& path = file.hold(data, size);
  try {
    const auto images = nt::data::read_idx_images(path);
    if (images.pixels.size() != static_cast<size_t>(images.count) * images.rows * images.cols) __builtin_trap();
  } catch (const nt::Error&) {
  }
  try {
    const auto labels = nt::data::read_idx_labels(path);
    if (labels.labels.size() != static_cast<size_t>(labels.count)) __builtin_trap();
  } catch (const nt::Error&) {
  }
  return 0;
}
