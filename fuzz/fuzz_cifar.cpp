// The CIFAR-10 batch reader (data/cifar.h) on any bytes. A bad file must end in nt::Error; anything else (a crash, a
// sanitizer report, a leak, a timeout, memory beyond libFuzzer's -rss_limit_mb) is a finding. The reader sizes its
// buffers from the file's own length, so inputs of a few KiB stay small.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "data/cifar.h"
#include "memory_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static nt::fuzz::MemoryFile file;
  const std::string& path = file.hold(data, size);
  try {
    const auto batch = nt::data::read_cifar10_batch(path);
    if (size % nt::data::kCifarRecordBytes != 0 ||
        batch.count != static_cast<int64_t>(size / nt::data::kCifarRecordBytes) ||
        batch.images.size() != static_cast<size_t>(batch.count * nt::data::kCifarImageBytes) ||
        batch.labels.size() != static_cast<size_t>(batch.count))
      __builtin_trap();
    for (uint8_t label : batch.labels)
      if (label >= nt::data::kCifarClasses) __builtin_trap();
  } catch (const nt::Error&) {
  }
  try {
    const auto names = nt::data::read_cifar10_class_names(path);
    if (names.size() != static_cast<size_t>(nt::data::kCifarClasses)) __builtin_trap();
  } catch (const nt::Error&) {
  }
  return 0;
}
