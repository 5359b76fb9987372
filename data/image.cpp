// Image files (data/image.h): the whole file is read into memory, its first bytes pick the decoder, and the decoder
// checks the declared size against the limits and against what the file can hold before allocating the pixels.
//
// PNG goes through libpng, fed from memory (png_set_read_fn). libpng reports errors by longjmp, so every call into
// it happens inside a small phase function (png_read_header, png_prepare_rows, png_read_rows, png_encode) that sets
// its own setjmp target and holds nothing with a destructor; the C++ objects (the file's bytes, the pixel buffers,
// the guard that frees libpng's structs) live in the caller, which a longjmp never crosses. libpng's callbacks
// (read, write, error) neither throw nor let an exception escape. An error becomes a message in a fixed buffer and
// `false` from the phase; the caller throws nt::Error with it.
//
// Netpbm is parsed by hand: a cursor over the bytes, with comments skipped between header fields.
#include "data/image.h"

#include <png.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <string_view>
#include <type_traits>

#include "core/atomic_file.h"
#include "core/error.h"

namespace nt::data {
namespace {

constexpr uint64_t kMaxFileBytes = uint64_t(4) << 30;  // more than the largest image this reader accepts needs
// Deflate's densest code is a 258-byte match in 2 bits, so n bytes of zlib data inflate to at most 1032 n bytes. A PNG
// whose rows need more than that cannot be whole: refusing it before allocating keeps a few-byte file from claiming
// gigabytes (the fuzz target's memory limit holds).
constexpr uint64_t kMaxInflateRatio = 1032;
constexpr size_t kMessageSize = 256;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error(cat("image '", path, "': ", what));
}

// Text from libpng (or a file) as part of a one-line message: control characters become spaces.
std::string one_line(std::string_view text) {
  std::string out(text);
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  return out;
}

void check_image_size(const std::string& path, uint64_t rows, uint64_t cols) {
  if (rows > uint64_t(kMaxImageSide) || cols > uint64_t(kMaxImageSide) || rows * cols > uint64_t(kMaxImagePixels))
    fail(path, cat("too large: ", rows, " rows x ", cols, " columns (the limit is ", kMaxImageSide, " per side and ",
                   kMaxImagePixels, " pixels in all)"));
}

std::vector<uint8_t> read_whole_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(path, "file not found");
  if (std::filesystem::is_directory(path, ec)) fail(path, "is a directory, not a file");
  FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) fail(path, cat("cannot open: ", std::strerror(errno)));
  std::vector<uint8_t> bytes;
  bool too_large = false, read_error = false;
  try {
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (!ec && size <= kMaxFileBytes) bytes.reserve(static_cast<size_t>(size));
    constexpr size_t kChunk = size_t(1) << 20;
    while (true) {
      const size_t before = bytes.size();
      if (before >= kMaxFileBytes) {
        too_large = true;
        break;
      }
      bytes.resize(before + kChunk);
      const size_t got = std::fread(bytes.data() + before, 1, kChunk, file);
      bytes.resize(before + got);
      if (got < kChunk) {
        read_error = std::ferror(file) != 0;
        break;
      }
    }
  } catch (const std::bad_alloc&) {
    std::fclose(file);
    throw OutOfMemory(cat("image '", path, "': out of memory reading the file"));
  }
  std::fclose(file);
  if (read_error) fail(path, "read error");
  if (too_large) fail(path, cat("larger than ", kMaxFileBytes >> 30, " GiB, more than any image this reader takes"));
  return bytes;
}

// ---- PNG
// -------------------------------------------------------------------------------------------------------------
constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

// libpng's error callback: keep the message (the error pointer is a char[kMessageSize]) and return to the phase's
// setjmp. Returning normally would make libpng print to stderr first.
void png_on_error(png_structp png, png_const_charp message) {
  auto* text = static_cast<char*>(png_get_error_ptr(png));
  std::snprintf(text, kMessageSize, "%s", message ? message : "unknown libpng error");
  png_longjmp(png, 1);
}
void png_on_warning(png_structp, png_const_charp) {}  // ancillary faults: the image is still read

// Reading: libpng pulls bytes from the file held in memory. Trivially destructible, as a longjmp crosses it.
struct PngRead {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0, pos = 0;
  bool truncated = false;
  char message[kMessageSize] = {};
};
static_assert(std::is_trivially_destructible_v<PngRead>);

void png_read_from_memory(png_structp png, png_bytep out, size_t length) {
  auto* s = static_cast<PngRead*>(png_get_io_ptr(png));
  if (length > s->size - s->pos) {
    s->truncated = true;
    png_error(png, "the file ends early");
  }
  std::memcpy(out, s->data + s->pos, length);
  s->pos += length;
}

struct PngHeader {
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, file_channels = 0;
};

// Each phase: a setjmp target of its own and no object with a destructor; false when libpng reported an error.
bool png_read_header(PngRead& s, PngHeader& h) {
  if (setjmp(png_jmpbuf(s.png))) return false;
  // Our own limits (checked by the caller) give the message; libpng's default ones (a million) would not.
  png_set_user_limits(s.png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);
  png_read_info(s.png, s.info);
  h.width = png_get_image_width(s.png, s.info);
  h.height = png_get_image_height(s.png, s.info);
  h.bit_depth = png_get_bit_depth(s.png, s.info);
  h.file_channels = png_get_channels(s.png, s.info);
  return true;
}

// Transforms to 8-bit gray or RGB; gives the channel count and bytes per row after them.
bool png_prepare_rows(PngRead& s, int& channels, size_t& row_bytes) {
  if (setjmp(png_jmpbuf(s.png))) return false;
  png_set_expand(s.png);  // palette -> RGB, gray of 1, 2, 4 bits -> 8 bits, tRNS -> alpha (dropped below)
#ifdef PNG_READ_SCALE_16_TO_8_SUPPORTED
  png_set_scale_16(s.png);  // 16 -> 8 bits rounded to nearest: (v * 255 + 32895) >> 16
#else
  png_set_strip_16(s.png);
#endif
  png_set_strip_alpha(s.png);  // gray+alpha -> gray, RGBA -> RGB: alpha dropped, not composited
  (void)png_set_interlace_handling(s.png);
  png_read_update_info(s.png, s.info);
  channels = png_get_channels(s.png, s.info);
  row_bytes = png_get_rowbytes(s.png, s.info);
  return true;
}

// Reads every row, then the chunks after the image through IEND, so that a file cut anywhere is an error.
bool png_read_rows(PngRead& s, png_bytepp rows) {
  if (setjmp(png_jmpbuf(s.png))) return false;
  png_read_image(s.png, rows);
  png_read_end(s.png, nullptr);
  return true;
}

struct PngReadGuard {
  PngRead& s;
  ~PngReadGuard() { png_destroy_read_struct(&s.png, s.info ? &s.info : nullptr, nullptr); }
};

Image read_png(const std::string& path, const std::vector<uint8_t>& bytes) {
  PngRead s;
  s.data = bytes.data();
  s.size = bytes.size();
  s.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, s.message, png_on_error, png_on_warning);
  if (!s.png) throw OutOfMemory(cat("image '", path, "': libpng could not start (out of memory)"));
  PngReadGuard guard{s};
  s.info = png_create_info_struct(s.png);
  if (!s.info) throw OutOfMemory(cat("image '", path, "': libpng could not start (out of memory)"));
  png_set_read_fn(s.png, &s, png_read_from_memory);
#ifdef PNG_HANDLE_AS_UNKNOWN_SUPPORTED
  // Ancillary chunks change nothing we keep (no gamma, no profile, no alpha): skip them rather than parse them.
  static constexpr png_byte kIgnored[] =
      "bKGD\0cHRM\0eXIf\0gAMA\0hIST\0iCCP\0iTXt\0oFFs\0pCAL\0pHYs\0sBIT\0"
      "sCAL\0sPLT\0sRGB\0sTER\0tEXt\0tIME\0zTXt";
  png_set_keep_unknown_chunks(s.png, PNG_HANDLE_CHUNK_NEVER, nullptr, 0);
  png_set_keep_unknown_chunks(s.png, PNG_HANDLE_CHUNK_NEVER, kIgnored, static_cast<int>(sizeof kIgnored / 5));
#endif

  auto corrupt = [&] {
    if (s.truncated) fail(path, cat("truncated PNG (the file ends after ", s.size, " bytes, inside the image)"));
    fail(path, cat("corrupt PNG (", one_line(s.message), ")"));
  };
  PngHeader h;
  if (!png_read_header(s, h)) corrupt();
  check_image_size(path, h.height, h.width);
  const uint64_t raw_row_bytes = 1 + (uint64_t(h.width) * uint64_t(h.file_channels) * uint64_t(h.bit_depth) + 7) / 8;
  const uint64_t raw_bytes = uint64_t(h.height) * raw_row_bytes;
  if (raw_bytes > kMaxInflateRatio * s.size + 1024)
    fail(path, cat("corrupt PNG (its header promises ", h.height, " rows x ", h.width, " columns, ", raw_bytes,
                   " bytes of rows, more than its ", s.size, " bytes can hold compressed)"));

  int channels = 0;
  size_t row_bytes = 0;
  if (!png_prepare_rows(s, channels, row_bytes)) corrupt();
  const size_t rows = h.height, cols = h.width;
  if ((channels != 1 && channels != 3) || row_bytes != cols * size_t(channels))
    throw InternalError(cat("image '", path, "': libpng gave ", channels, " channels and ", row_bytes,
                            " bytes per row for ", cols, " columns after its transforms"));

  Image image;
  std::vector<uint8_t> interleaved;  // (rows, cols, channels) as libpng writes them
  std::vector<png_bytep> row_pointers(rows);
  try {
    interleaved.resize(rows * row_bytes);
    image.pixels.resize(rows * row_bytes);
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(cat("image '", path, "': out of memory for ", rows, " rows x ", cols, " columns"));
  }
  for (size_t r = 0; r < rows; ++r) row_pointers[r] = interleaved.data() + r * row_bytes;
  if (!png_read_rows(s, row_pointers.data())) corrupt();

  image.channels = channels;
  image.rows = static_cast<int>(rows);
  image.cols = static_cast<int>(cols);
  const size_t plane = rows * cols;
  for (size_t i = 0; i < plane; ++i)
    for (size_t c = 0; c < size_t(channels); ++c) image.pixels[c * plane + i] = interleaved[i * size_t(channels) + c];
  return image;
}

// Writing: libpng pushes the encoded bytes into a string that the caller owns.
struct PngWrite {
  png_structp png = nullptr;
  png_infop info = nullptr;
  std::string* out = nullptr;
  char message[kMessageSize] = {};
};
static_assert(std::is_trivially_destructible_v<PngWrite>);

void png_write_to_memory(png_structp png, png_bytep data, size_t length) {
  auto* s = static_cast<PngWrite*>(png_get_io_ptr(png));
  bool out_of_memory = false;
  try {
    s->out->append(reinterpret_cast<const char*>(data), length);
  } catch (...) {
    out_of_memory = true;
  }
  if (out_of_memory) png_error(png, "out of memory");  // outside the handler: no exception is in flight
}
void png_flush_nothing(png_structp) {}

bool png_encode(PngWrite& s, png_uint_32 width, png_uint_32 height, int color_type, png_bytepp rows) {
  if (setjmp(png_jmpbuf(s.png))) return false;
  png_set_IHDR(s.png, s.info, width, height, 8, color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(s.png, s.info);
  png_write_image(s.png, rows);
  png_write_end(s.png, nullptr);
  return true;
}

struct PngWriteGuard {
  PngWrite& s;
  ~PngWriteGuard() { png_destroy_write_struct(&s.png, s.info ? &s.info : nullptr); }
};

// ---- Netpbm
// ----------------------------------------------------------------------------------------------------------
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

class PnmReader {
 public:
  PnmReader(const std::string& path, const std::vector<uint8_t>& bytes)
      : path_(path),
        d_(bytes),
        magic_(bytes[1]),
        channels_(magic_ == '3' || magic_ == '6' ? 3 : 1),
        binary_(magic_ == '5' || magic_ == '6') {
    kind_ = cat(channels_ == 3 ? "PPM" : "PGM", " (P", static_cast<char>(magic_), ")");
  }

  Image read() {
    pos_ = 2;
    if (pos_ < d_.size() && !is_space(d_[pos_]) && d_[pos_] != '#')
      header_fault(cat("expected whitespace after the magic P", static_cast<char>(magic_), ", found ", found()));
    const uint64_t cols = header_number("width"), rows = header_number("height");
    const uint64_t maxval = header_number("maxval");
    if (cols == 0 || rows == 0) header_fault(cat("an empty image (", rows, " rows x ", cols, " columns)"));
    if (maxval == 0 || maxval > 65535) header_fault(cat("maxval ", maxval, " is outside 1..65535"));
    check_image_size(path_, rows, cols);
    maxval_ = static_cast<uint32_t>(maxval);

    const uint64_t samples = uint64_t(channels_) * rows * cols;
    Image image;
    image.channels = channels_;
    image.rows = static_cast<int>(rows);
    image.cols = static_cast<int>(cols);
    if (binary_) {
      // Exactly one whitespace byte ends the header; the samples follow it.
      if (pos_ >= d_.size())
        truncated(cat("the header ends without the byte after maxval; expected ", samples, " samples"));
      if (!is_space(d_[pos_])) header_fault(cat("expected one whitespace byte after maxval, found ", found()));
      ++pos_;
      const uint64_t bytes_per_sample = maxval_ < 256 ? 1 : 2;
      const uint64_t need = samples * bytes_per_sample, left = d_.size() - pos_;
      if (left < need)
        truncated(cat("the header promises ", rows, " rows x ", cols, " columns x ", channels_, " channels, ", need,
                      " bytes of samples, found ", left));
      allocate(image, samples);
      for (uint64_t i = 0; i < samples; ++i) {
        const uint8_t* p = d_.data() + pos_ + i * bytes_per_sample;
        const uint32_t v = bytes_per_sample == 1 ? p[0] : (uint32_t(p[0]) << 8) | p[1];
        store(image, i, v);
      }
    } else {
      // Each sample takes a digit and a separator at least: a file too short for that fails before allocating.
      const uint64_t left = d_.size() - pos_;
      if (left < 2 * samples - 1)
        truncated(cat("the header promises ", samples, " samples, and only ", left, " bytes follow it"));
      allocate(image, samples);
      for (uint64_t i = 0; i < samples; ++i) {
        skip_space_and_comments();
        if (pos_ >= d_.size()) truncated(cat("found ", i, " of the ", samples, " samples the header promises"));
        if (!is_digit(d_[pos_])) fail(path_, cat("bad ", kind_, " sample ", i, ": expected a number, found ", found()));
        store(image, i, static_cast<uint32_t>(number(65535, cat("sample ", i))));
      }
    }
    return image;
  }

 private:
  // '#' starts a comment that runs to the end of the line.
  void skip_space_and_comments() {
    while (pos_ < d_.size()) {
      if (is_space(d_[pos_])) {
        ++pos_;
      } else if (d_[pos_] == '#') {
        while (pos_ < d_.size() && d_[pos_] != '\n' && d_[pos_] != '\r') ++pos_;
      } else {
        break;
      }
    }
  }

  uint64_t header_number(const char* what) {
    skip_space_and_comments();
    if (pos_ >= d_.size()) header_fault(cat("missing ", what, " (the file ends)"));
    if (!is_digit(d_[pos_])) header_fault(cat("missing ", what, ": expected a number, found ", found()));
    const uint64_t v = number(1000000000, what);
    if (pos_ < d_.size() && !is_space(d_[pos_]) && d_[pos_] != '#')
      header_fault(cat(what, " is not a number: found ", found(), " after its digits"));
    return v;
  }

  // Decimal digits at pos_ (there is one at least); more than `limit` is a fault naming `what`.
  uint64_t number(uint64_t limit, const std::string& what) {
    uint64_t v = 0;
    while (pos_ < d_.size() && is_digit(d_[pos_])) {
      v = v * 10 + uint64_t(d_[pos_] - '0');
      if (v > limit) fail(path_, cat("bad ", kind_, ": ", what, " is over ", limit));
      ++pos_;
    }
    return v;
  }

  void allocate(Image& image, uint64_t samples) {
    try {
      image.pixels.resize(static_cast<size_t>(samples));
    } catch (const std::bad_alloc&) {
      throw OutOfMemory(cat("image '", path_, "': out of memory for ", samples, " samples"));
    }
  }

  // Sample i of the file (interleaved (rows, cols, channels)) into the planar image, scaled to 0..255.
  void store(Image& image, uint64_t i, uint32_t v) {
    if (v > maxval_) fail(path_, cat("bad ", kind_, ": sample ", i, " is ", v, ", over maxval ", maxval_));
    const uint64_t plane = uint64_t(image.rows) * uint64_t(image.cols);
    const uint64_t c = i % uint64_t(channels_), pixel = i / uint64_t(channels_);
    image.pixels[static_cast<size_t>(c * plane + pixel)] = static_cast<uint8_t>((v * 255 + maxval_ / 2) / maxval_);
  }

  std::string found() const {
    if (pos_ >= d_.size()) return "the end of the file";
    const uint8_t c = d_[pos_];
    if (c >= 0x21 && c < 0x7f) return cat("'", static_cast<char>(c), "'");
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", c);
    return cat("byte ", hex);
  }

  [[noreturn]] void header_fault(const std::string& what) const { fail(path_, cat("bad ", kind_, " header: ", what)); }
  [[noreturn]] void truncated(const std::string& what) const { fail(path_, cat("truncated ", kind_, ": ", what)); }

  const std::string& path_;
  const std::vector<uint8_t>& d_;
  const uint8_t magic_;
  const int channels_;
  const bool binary_;
  std::string kind_;
  size_t pos_ = 0;
  uint32_t maxval_ = 255;
};

std::string describe_start(const std::vector<uint8_t>& bytes) {
  std::string hex;
  for (size_t i = 0; i < std::min<size_t>(bytes.size(), 4); ++i) {
    char b[4];
    std::snprintf(b, sizeof b, "%02x", bytes[i]);
    if (i) hex += ' ';
    hex += b;
  }
  return hex;
}

void check_consistent(const Image& image, const char* op) {
  if (image.channels < 1 || image.rows < 1 || image.cols < 1 ||
      image.pixels.size() != size_t(image.channels) * size_t(image.rows) * size_t(image.cols))
    throw Error(cat(op, ": the image is ", image.channels, " channels x ", image.rows, " rows x ", image.cols,
                    " columns but holds ", image.pixels.size(), " samples"));
}

}  // namespace

Image read_image(const std::string& path) {
  const std::vector<uint8_t> bytes = read_whole_file(path);
  if (bytes.empty()) fail(path, "empty file");
  const size_t sig = std::min(bytes.size(), sizeof kPngSignature);
  if (std::memcmp(bytes.data(), kPngSignature, sig) == 0) {
    if (sig < sizeof kPngSignature)
      fail(path, cat("truncated PNG (", bytes.size(), " bytes: the signature alone is 8)"));
    return read_png(path, bytes);
  }
  if (bytes.size() >= 2 && bytes[0] == 'P' &&
      (bytes[1] == '2' || bytes[1] == '3' || bytes[1] == '5' || bytes[1] == '6'))
    return PnmReader(path, bytes).read();
  fail(path, cat("not a PNG, PGM (P2, P5) or PPM (P3, P6) file: it starts with bytes ", describe_start(bytes)));
}

void write_png(const std::string& path, const Image& image) {
  if (image.channels != 1 && image.channels != 3)
    fail(path, cat("cannot write a ", image.channels, "-channel image as PNG (1 or 3 channels)"));
  if (image.rows < 1 || image.cols < 1 ||
      image.pixels.size() != size_t(image.channels) * size_t(image.rows) * size_t(image.cols))
    fail(path, cat("cannot write an image of ", image.channels, " channels x ", image.rows, " rows x ", image.cols,
                   " columns holding ", image.pixels.size(), " samples"));
  check_image_size(path, uint64_t(image.rows), uint64_t(image.cols));

  const size_t rows = size_t(image.rows), cols = size_t(image.cols), channels = size_t(image.channels);
  const size_t plane = rows * cols;
  std::vector<uint8_t> interleaved(plane * channels);  // (rows, cols, channels) for libpng
  for (size_t i = 0; i < plane; ++i)
    for (size_t c = 0; c < channels; ++c) interleaved[i * channels + c] = image.pixels[c * plane + i];
  std::vector<png_bytep> row_pointers(rows);
  for (size_t r = 0; r < rows; ++r) row_pointers[r] = interleaved.data() + r * cols * channels;

  std::string encoded;
  PngWrite s;
  s.out = &encoded;
  s.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, s.message, png_on_error, png_on_warning);
  if (!s.png) throw OutOfMemory(cat("image '", path, "': libpng could not start (out of memory)"));
  {
    PngWriteGuard guard{s};
    s.info = png_create_info_struct(s.png);
    if (!s.info) throw OutOfMemory(cat("image '", path, "': libpng could not start (out of memory)"));
    png_set_write_fn(s.png, &s, png_write_to_memory, png_flush_nothing);
    const int color_type = channels == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_GRAY;
    if (!png_encode(s, static_cast<png_uint_32>(cols), static_cast<png_uint_32>(rows), color_type, row_pointers.data()))
      fail(path, cat("cannot encode PNG (", one_line(s.message), ")"));
  }
  write_file_atomically(path, encoded);
}

Image to_channels(const Image& image, int channels) {
  check_consistent(image, "to_channels");
  if (channels == image.channels) return image;
  const size_t plane = size_t(image.rows) * size_t(image.cols);
  Image out;
  out.channels = channels;
  out.rows = image.rows;
  out.cols = image.cols;
  if (image.channels == 1 && channels == 3) {
    out.pixels.resize(3 * plane);
    for (size_t c = 0; c < 3; ++c) std::copy_n(image.pixels.begin(), plane, out.pixels.begin() + ptrdiff_t(c * plane));
    return out;
  }
  if (image.channels == 3 && channels == 1) {
    out.pixels.resize(plane);
    const uint8_t *r = image.pixels.data(), *g = r + plane, *b = g + plane;
    for (size_t i = 0; i < plane; ++i)
      out.pixels[i] = static_cast<uint8_t>((299u * r[i] + 587u * g[i] + 114u * b[i] + 500u) / 1000u);
    return out;
  }
  throw Error(cat("to_channels: cannot convert a ", image.channels, "-channel image to ", channels,
                  " channels (1 -> 3 and 3 -> 1 only)"));
}

Image resize_bilinear(const Image& image, int rows, int cols) {
  check_consistent(image, "resize_bilinear");
  if (rows < 1 || cols < 1 || rows > kMaxImageSide || cols > kMaxImageSide ||
      int64_t(rows) * int64_t(cols) > kMaxImagePixels)
    throw Error(cat("resize_bilinear: cannot resize to ", rows, " rows x ", cols, " columns (1 to ", kMaxImageSide,
                    " per side, ", kMaxImagePixels, " pixels in all)"));
  const size_t H = size_t(image.rows), W = size_t(image.cols), h = size_t(rows), w = size_t(cols);
  const double scale_y = double(H) / double(h), scale_x = double(W) / double(w);

  // The horizontal taps depend only on x: compute them once.
  std::vector<size_t> x0(w), x1(w);
  std::vector<double> fx(w);
  for (size_t x = 0; x < w; ++x) {
    const double sx = std::max(0.0, (double(x) + 0.5) * scale_x - 0.5);
    x0[x] = std::min(size_t(sx), W - 1);  // sx >= 0: truncation is floor
    x1[x] = std::min(x0[x] + 1, W - 1);
    fx[x] = sx - double(x0[x]);
  }
  Image out;
  out.channels = image.channels;
  out.rows = rows;
  out.cols = cols;
  out.pixels.resize(size_t(image.channels) * h * w);
  for (size_t c = 0; c < size_t(image.channels); ++c) {
    const uint8_t* in = image.pixels.data() + c * H * W;  // (H, W)
    uint8_t* o = out.pixels.data() + c * h * w;           // (h, w)
    for (size_t y = 0; y < h; ++y) {
      const double sy = std::max(0.0, (double(y) + 0.5) * scale_y - 0.5);
      const size_t y0 = std::min(size_t(sy), H - 1), y1 = std::min(y0 + 1, H - 1);
      const double fy = sy - double(y0);
      const uint8_t *top = in + y0 * W, *bottom = in + y1 * W;
      for (size_t x = 0; x < w; ++x) {
        const double upper = (1 - fx[x]) * top[x0[x]] + fx[x] * top[x1[x]];
        const double lower = (1 - fx[x]) * bottom[x0[x]] + fx[x] * bottom[x1[x]];
        const double v = (1 - fy) * upper + fy * lower;
        o[y * w + x] = static_cast<uint8_t>(std::floor(v + 0.5));
      }
    }
  }
  return out;
}

void invert(Image& image) {
  for (uint8_t& v : image.pixels) v = static_cast<uint8_t>(255 - v);
}

}  // namespace nt::data
