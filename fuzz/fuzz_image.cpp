// The image reader (data/image.h) on any bytes: PNG through libpng, PGM and PPM by hand. A bad file must end in
// nt::Error; anything else (a crash, a sanitizer report, a leak, a longjmp gone wrong, a timeout, memory beyond
// libFuzzer's -rss_limit_mb) is a finding. An image that reads is also taken through the conversions `predict` applies
// (to gray, resize to 28x28, invert, back to RGB), which must keep their shapes.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "data/image.h"
#include "memory_file.h"

namespace {

bool consistent(const nt::data::Image& image, int channels, int rows, int cols) {
  return image.channels == channels && image.rows == rows && image.cols == cols &&
         image.pixels.size() == static_cast<size_t>(channels) * static_cast<size_t>(rows) * static_cast<size_t>(cols);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static nt::fuzz::MemoryFile file;
  const std::string& path = file.hold(data, size);
  try {
    const nt::data::Image image = nt::data::read_image(path);
    if (image.channels != 1 && image.channels != 3) __builtin_trap();
    if (image.rows < 1 || image.cols < 1 || image.rows > nt::data::kMaxImageSide ||
        image.cols > nt::data::kMaxImageSide || !consistent(image, image.channels, image.rows, image.cols))
      __builtin_trap();
    const nt::data::Image gray = nt::data::to_channels(image, 1);
    if (!consistent(gray, 1, image.rows, image.cols)) __builtin_trap();
    nt::data::Image small = nt::data::resize_bilinear(gray, 28, 28);
    if (!consistent(small, 1, 28, 28)) __builtin_trap();
    nt::data::invert(small);
    if (!consistent(nt::data::to_channels(small, 3), 3, 28, 28)) __builtin_trap();
  } catch (const nt::Error&) {
  }
  return 0;
}
