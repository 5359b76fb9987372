// Image files and conversions (data/image.h): PNGs written by write_png and by libpng directly (palettes, depths 1 to
// 16, alpha, interlacing) read back to the expected planar samples; Netpbm files in all four kinds, with comments and
// maxvals 15, 255 and 65535, scale as documented; the conversions give hand-computed values; and every kind of bad
// file is a one-line nt::Error naming the file.
#include "tests/support/catch2.h"

#include <png.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/image.h"
#include "tests/support/test_support.h"

namespace {

using nt::cat;
using nt::data::Image;
using nt::data::read_image;
using nt::test::Contains;
using nt::test::TempDir;

// Sample (c, y, x) = (37 c + 11 y + 3 x + 5) mod 256: any misplaced sample, channel or row shows.
Image pattern(int channels, int rows, int cols) {
  Image image{channels, rows, cols, {}};
  for (int c = 0; c < channels; ++c)
    for (int y = 0; y < rows; ++y)
      for (int x = 0; x < cols; ++x) image.pixels.push_back(static_cast<uint8_t>(37 * c + 11 * y + 3 * x + 5));
  return image;
}

// Planar from samples interleaved as files hold them: (rows, cols, channels).
Image planar(int channels, int rows, int cols, const std::vector<int>& interleaved) {
  REQUIRE(interleaved.size() == size_t(channels * rows * cols));
  Image image{channels, rows, cols, std::vector<uint8_t>(interleaved.size())};
  for (int i = 0; i < rows * cols; ++i)
    for (int c = 0; c < channels; ++c)
      image.pixels[size_t(c * rows * cols + i)] = static_cast<uint8_t>(interleaved[size_t(i * channels + c)]);
  return image;
}

void require_equal(const Image& got, const Image& want) {
  REQUIRE(got.channels == want.channels);
  REQUIRE(got.rows == want.rows);
  REQUIRE(got.cols == want.cols);
  REQUIRE(got.pixels.size() == want.pixels.size());
  for (size_t i = 0; i < got.pixels.size(); ++i) {
    INFO("sample " << i << " of " << got.pixels.size());
    REQUIRE(int(got.pixels[i]) == int(want.pixels[i]));
  }
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

// The nt::Error that reading `path` ends in; checks that it is one line naming the file.
std::string read_error(const std::string& path) {
  try {
    const Image image = read_image(path);
    FAIL("read_image gave a " << image.channels << "x" << image.rows << "x" << image.cols << " image for " << path
                              << ", expected an error");
  } catch (const nt::Error& e) {
    const std::string message = e.what();
    CHECK_THAT(message, Contains("image '" + path + "': "));
    CHECK(message.find('\n') == std::string::npos);
    return message;
  }
  return {};
}

// ---- PNGs written by libpng directly -------------------------------------------------------------------------------
struct PngSpec {
  uint32_t width = 0, height = 0;
  int color_type = PNG_COLOR_TYPE_GRAY, bit_depth = 8;
  bool interlaced = false;
  std::vector<png_color> palette = {};
  std::vector<png_byte> trans = {};  // tRNS of a palette image
};

// What the setjmp frame below touches: trivially destructible.
struct DirectPng {
  png_structp png = nullptr;
  png_infop info = nullptr;
  FILE* file = nullptr;
};

bool encode_direct(DirectPng& w, const PngSpec& spec, png_bytepp rows) {
  if (setjmp(png_jmpbuf(w.png))) return false;
  png_init_io(w.png, w.file);
  png_set_IHDR(w.png, w.info, spec.width, spec.height, spec.bit_depth, spec.color_type,
               spec.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!spec.palette.empty()) png_set_PLTE(w.png, w.info, spec.palette.data(), static_cast<int>(spec.palette.size()));
  if (!spec.trans.empty()) png_set_tRNS(w.png, w.info, spec.trans.data(), static_cast<int>(spec.trans.size()), nullptr);
  png_write_info(w.png, w.info);
  png_write_image(w.png, rows);  // Adam7 passes are made by libpng
  png_write_end(w.png, nullptr);
  return true;
}

// `values`: (rows, cols, file channels) samples, packed here as PNG stores them (MSB first below 8 bits, big-endian
// at 16).
void write_png_direct(const std::string& path, const PngSpec& spec, const std::vector<int>& values) {
  const int file_channels = spec.color_type == PNG_COLOR_TYPE_RGB          ? 3
                            : spec.color_type == PNG_COLOR_TYPE_RGB_ALPHA  ? 4
                            : spec.color_type == PNG_COLOR_TYPE_GRAY_ALPHA ? 2
                                                                           : 1;
  const size_t per_row = spec.width * size_t(file_channels);
  REQUIRE(values.size() == per_row * spec.height);
  std::vector<std::vector<uint8_t>> rows(spec.height);
  for (size_t r = 0; r < spec.height; ++r) {
    std::vector<uint8_t>& row = rows[r];
    row.assign((per_row * size_t(spec.bit_depth) + 7) / 8, 0);
    for (size_t i = 0; i < per_row; ++i) {
      const int v = values[r * per_row + i];
      if (spec.bit_depth == 16) {
        row[2 * i] = static_cast<uint8_t>(v >> 8);
        row[2 * i + 1] = static_cast<uint8_t>(v & 0xff);
      } else if (spec.bit_depth == 8) {
        row[i] = static_cast<uint8_t>(v);
      } else {
        const size_t bit = i * size_t(spec.bit_depth);
        row[bit / 8] |= static_cast<uint8_t>(v << (8 - spec.bit_depth - int(bit % 8)));
      }
    }
  }
  std::vector<png_bytep> pointers;
  for (auto& row : rows) pointers.push_back(row.data());
  DirectPng w;
  w.file = std::fopen(path.c_str(), "wb");
  REQUIRE(w.file != nullptr);
  w.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  if (w.png) w.info = png_create_info_struct(w.png);
  const bool ok = w.png && w.info && encode_direct(w, spec, pointers.data());
  png_destroy_write_struct(&w.png, w.info ? &w.info : nullptr);
  std::fclose(w.file);
  REQUIRE(ok);
}

// ---- PNG chunks, for damaging files --------------------------------------------------------------------------------
struct Chunk {
  size_t offset = 0;  // of its length field
  uint32_t length = 0;
  std::string type;
  size_t data() const { return offset + 8; }
  size_t crc() const { return offset + 8 + length; }
};

uint32_t get_u32(const std::string& b, size_t at) {
  return uint32_t(uint8_t(b[at])) << 24 | uint32_t(uint8_t(b[at + 1])) << 16 | uint32_t(uint8_t(b[at + 2])) << 8 |
         uint32_t(uint8_t(b[at + 3]));
}
void put_u32(std::string& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + size_t(i)] = static_cast<char>(v >> (24 - 8 * i));
}

std::vector<Chunk> chunks_of(const std::string& png) {
  std::vector<Chunk> chunks;
  for (size_t at = 8; at + 12 <= png.size();) {
    Chunk c{at, get_u32(png, at), png.substr(at + 4, 4)};
    chunks.push_back(c);
    at = c.crc() + 4;
  }
  REQUIRE(chunks.size() >= 3);
  return chunks;
}

Chunk find_chunk(const std::string& png, const std::string& type) {
  for (const Chunk& c : chunks_of(png))
    if (c.type == type) return c;
  FAIL("no " << type << " chunk");
  return {};
}

void fix_crc(std::string& png, const Chunk& c) {
  const auto* p = reinterpret_cast<const Bytef*>(png.data() + c.offset + 4);
  put_u32(png, c.crc(), static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), p, c.length + 4)));
}

// A whole PNG of `image`, as write_png makes it.
std::string png_bytes(const TempDir& dir, const Image& image) {
  const std::string path = dir.file("source.png");
  nt::data::write_png(path, image);
  return nt::test::read_file(path);
}

// ---- Netpbm written by the test ------------------------------------------------------------------------------------
// `samples`: (rows, cols, channels) interleaved. Comments sit between the header's fields (and, in the ASCII kinds,
// between rows); binary samples take two bytes, big-endian, when maxval is over 255.
std::string netpbm(char magic, int rows, int cols, int maxval, const std::vector<int>& samples) {
  std::string s = cat("P", magic, "\n# written by test_image\n", cols, " # width\n", rows, "\n#maxval next\n", maxval);
  const bool ascii = magic == '2' || magic == '3';
  const int channels = magic == '3' || magic == '6' ? 3 : 1;
  if (ascii) {
    s += "\n";
    for (int r = 0; r < rows; ++r) {
      s += cat("# row ", r, "\n");
      for (int i = 0; i < cols * channels; ++i) s += cat(samples[size_t(r * cols * channels + i)], i % 5 ? " " : "\t");
      s += "\n";
    }
  } else {
    s += "\n";
    for (int v : samples) {
      if (maxval > 255) s += static_cast<char>(v >> 8);
      s += static_cast<char>(v & 0xff);
    }
  }
  return s;
}

// ---- round trips ---------------------------------------------------------------------------------------------------

TEST_CASE("write_png then read_image gives the image back, 1 and 3 channels, odd sizes", "[cpu][image]") {
  const TempDir dir;
  for (int channels : {1, 3})
    for (auto [rows, cols] : {std::pair{1, 1}, std::pair{7, 5}, std::pair{5, 7}, std::pair{33, 31}}) {
      INFO(channels << " channels, " << rows << "x" << cols);
      const Image image = pattern(channels, rows, cols);
      const std::string path = dir.file(cat("round-", channels, "-", rows, "x", cols, ".png"));
      nt::data::write_png(path, image);
      const std::string bytes = nt::test::read_file(path);
      REQUIRE(bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
      CHECK(nt::test::temporaries_of(path).empty());
      require_equal(read_image(path), image);
    }
}

TEST_CASE("write_png replaces a file whole and refuses what PNG cannot hold", "[cpu][image]") {
  const TempDir dir;
  const std::string path = dir.file("out.png");
  nt::data::write_png(path, pattern(3, 4, 4));
  nt::data::write_png(path, pattern(1, 2, 3));
  require_equal(read_image(path), pattern(1, 2, 3));

  auto error_of = [&](const Image& image) {
    try {
      nt::data::write_png(path, image);
    } catch (const nt::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error_of(pattern(2, 3, 3)), Contains("image '" + path + "': cannot write a 2-channel image"));
  CHECK_THAT(error_of(pattern(4, 3, 3)), Contains("image '" + path + "': cannot write a 4-channel image"));
  Image short_one = pattern(1, 3, 3);
  short_one.pixels.pop_back();
  CHECK_THAT(error_of(short_one), Contains("image '" + path + "': cannot write an image of 1 channels x 3 rows"));
  require_equal(read_image(path), pattern(1, 2, 3));  // untouched by the refusals
}

TEST_CASE("the format is chosen by the magic bytes, not the name", "[cpu][image]") {
  const TempDir dir;
  const std::string png_named_pgm = dir.file("really-a-png.pgm"), pgm_named_png = dir.file("really-a-pgm.png");
  nt::data::write_png(png_named_pgm, pattern(3, 3, 2));
  write_bytes(pgm_named_png, netpbm('5', 2, 3, 255, {1, 2, 3, 4, 5, 6}));
  require_equal(read_image(png_named_pgm), pattern(3, 3, 2));
  require_equal(read_image(pgm_named_png), planar(1, 2, 3, {1, 2, 3, 4, 5, 6}));
}

// ---- PNG kinds that write_png never makes
// ----------------------------------------------------------------------------

TEST_CASE("palette PNGs expand to RGB, with 8 and 2 bits per index, and a tRNS is dropped", "[cpu][image]") {
  const TempDir dir;
  const std::vector<png_color> palette = {{0, 0, 0}, {255, 0, 0}, {10, 200, 30}, {255, 255, 255}};
  const std::vector<int> indexes = {0, 1, 2, 3, 3, 2, 1, 0, 2, 2, 1, 3, 0, 0, 1};  // 3 rows x 5 columns
  std::vector<int> rgb;
  for (int i : indexes)
    rgb.insert(rgb.end(), {palette[size_t(i)].red, palette[size_t(i)].green, palette[size_t(i)].blue});
  const Image want = planar(3, 3, 5, rgb);
  for (int depth : {8, 2}) {
    for (bool with_trns : {false, true}) {
      INFO("bit depth " << depth << (with_trns ? ", with tRNS" : ""));
      PngSpec spec{
          .width = 5, .height = 3, .color_type = PNG_COLOR_TYPE_PALETTE, .bit_depth = depth, .palette = palette};
      if (with_trns) spec.trans = {0, 128};
      const std::string path = dir.file(cat("palette-", depth, with_trns ? "-trns" : "", ".png"));
      write_png_direct(path, spec, indexes);
      require_equal(read_image(path), want);
    }
  }
}

TEST_CASE("gray PNGs of 1, 2 and 4 bits expand to 0..255", "[cpu][image]") {
  const TempDir dir;
  for (int depth : {1, 2, 4}) {
    INFO("bit depth " << depth);
    const int levels = 1 << depth;
    std::vector<int> values, want;
    for (int i = 0; i < 9 * 3; ++i) {  // 3 rows x 9 columns: rows that end inside a byte
      values.push_back((i * 7 + 1) % levels);
      want.push_back(values.back() * 255 / (levels - 1));  // 1 bit: 0, 255; 2: x 85; 4: x 17
    }
    const std::string path = dir.file(cat("gray-", depth, ".png"));
    write_png_direct(path, PngSpec{.width = 9, .height = 3, .bit_depth = depth}, values);
    require_equal(read_image(path), planar(1, 3, 9, want));
  }
}

TEST_CASE("16-bit PNGs scale to 8 bits rounded to nearest, gray and RGB", "[cpu][image]") {
  const TempDir dir;
  // round(v * 255 / 65535) = round(v / 257): 0x12ff -> 18.92 -> 19 (dropping the low byte would give 18),
  // 0x00ff -> 0.99 -> 1, 0x8000 -> 127.5019 -> 128, 257 * 7 -> 7.
  const std::vector<int> values = {0, 0x12ff, 0x00ff, 0x8000, 257 * 7, 0xffff};
  const std::vector<int> want = {0, 19, 1, 128, 7, 255};
  const std::string gray = dir.file("gray16.png"), rgb = dir.file("rgb16.png");
  write_png_direct(gray, PngSpec{.width = 3, .height = 2, .bit_depth = 16}, values);
  require_equal(read_image(gray), planar(1, 2, 3, want));
  write_png_direct(rgb, PngSpec{.width = 2, .height = 1, .color_type = PNG_COLOR_TYPE_RGB, .bit_depth = 16}, values);
  require_equal(read_image(rgb), planar(3, 1, 2, want));
}

TEST_CASE("alpha is dropped, not composited: RGBA gives RGB, gray+alpha gives gray", "[cpu][image]") {
  const TempDir dir;
  const std::string rgba = dir.file("rgba.png"), gray_alpha = dir.file("gray-alpha.png");
  // 2 rows x 2 columns; the alphas (0, 64, 128, 255) must not change the colours.
  write_png_direct(rgba, PngSpec{.width = 2, .height = 2, .color_type = PNG_COLOR_TYPE_RGB_ALPHA},
                   {255, 0, 0, 0, 10, 200, 30, 64, 1, 2, 3, 128, 250, 251, 252, 255});
  require_equal(read_image(rgba), planar(3, 2, 2, {255, 0, 0, 10, 200, 30, 1, 2, 3, 250, 251, 252}));
  write_png_direct(gray_alpha, PngSpec{.width = 3, .height = 1, .color_type = PNG_COLOR_TYPE_GRAY_ALPHA},
                   {7, 0, 130, 77, 255, 255});
  require_equal(read_image(gray_alpha), planar(1, 1, 3, {7, 130, 255}));
}

TEST_CASE("interlaced (Adam7) PNGs read like plain ones", "[cpu][image]") {
  const TempDir dir;
  const Image want = pattern(3, 33, 31);
  std::vector<int> interleaved;
  for (int i = 0; i < 33 * 31; ++i)
    for (int c = 0; c < 3; ++c) interleaved.push_back(want.pixels[size_t(c * 33 * 31 + i)]);
  const std::string path = dir.file("adam7.png");
  write_png_direct(path, PngSpec{.width = 31, .height = 33, .color_type = PNG_COLOR_TYPE_RGB, .interlaced = true},
                   interleaved);
  require_equal(read_image(path), want);
}

// ---- Netpbm
// ----------------------------------------------------------------------------------------------------------

TEST_CASE("PGM and PPM, binary and ASCII, with comments and maxvals 15, 255 and 65535", "[cpu][image]") {
  const TempDir dir;
  for (char magic : {'2', '3', '5', '6'})
    for (int maxval : {15, 255, 65535}) {
      INFO("P" << magic << ", maxval " << maxval);
      const int channels = magic == '3' || magic == '6' ? 3 : 1, rows = 5, cols = 7;
      std::vector<int> samples, scaled;
      for (int i = 0; i < rows * cols * channels; ++i) {
        const int v = (i == 0) ? maxval : int((int64_t(i) * 7919) % (maxval + 1));  // maxval itself, then a spread
        samples.push_back(v);
        scaled.push_back(int(std::lround(v * 255.0 / maxval)));  // no ties for these maxvals
      }
      const std::string path = dir.file(cat("p", magic, "-", maxval));
      write_bytes(path, netpbm(magic, rows, cols, maxval, samples));
      const Image got = read_image(path);
      require_equal(got, planar(channels, rows, cols, scaled));
      CHECK(int(got.pixels[0]) == 255);  // maxval is white
    }
}

TEST_CASE("Netpbm samples scale as documented: maxval 15 x 17, maxval 65535 / 257, maxval 2 halves up",
          "[cpu][image]") {
  const TempDir dir;
  const std::string p = dir.file("scale");
  write_bytes(p, "P2 4 1 15 0 1 7 15");
  require_equal(read_image(p), planar(1, 1, 4, {0, 17, 119, 255}));
  write_bytes(p, std::string("P5 3 1 65535\n\x12\xff\x00\xff\x80\x00", 19));
  require_equal(read_image(p), planar(1, 1, 3, {19, 1, 128}));
  write_bytes(p, "P3\n1 1\n2\n0 1 2\n");
  require_equal(read_image(p), planar(3, 1, 1, {0, 128, 255}));
  write_bytes(p, "P2 2 1 255 0 255 and trailing text, ignored");  // only the first image is read
  require_equal(read_image(p), planar(1, 1, 2, {0, 255}));
}

// ---- conversions
// -----------------------------------------------------------------------------------------------------

TEST_CASE("to_channels: BT.601 luma rounded to nearest, replication, refusals", "[cpu][image]") {
  // red, green, blue, white, black, yellow, (10, 200, 30), and (0, 0, 250): 0.114 * 250 = 28.5 rounds up to 29.
  const Image rgb =
      planar(3, 2, 4, {255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 255, 255, 0, 10, 200, 30, 0, 0, 250});
  const Image gray = nt::data::to_channels(rgb, 1);
  require_equal(gray, planar(1, 2, 4, {76, 150, 29, 255, 0, 226, 124, 29}));

  const Image back = nt::data::to_channels(gray, 3);
  require_equal(back, planar(3, 2, 4, {76, 76, 76, 150, 150, 150, 29,  29,  29,  255, 255, 255,
                                       0,  0,  0,  226, 226, 226, 124, 124, 124, 29,  29,  29}));
  require_equal(nt::data::to_channels(rgb, 3), rgb);
  require_equal(nt::data::to_channels(gray, 1), gray);
  CHECK_THROWS_AS(nt::data::to_channels(rgb, 2), nt::Error);
  CHECK_THROWS_AS(nt::data::to_channels(gray, 4), nt::Error);
  CHECK_THROWS_AS(nt::data::to_channels(pattern(2, 3, 3), 1), nt::Error);
  CHECK_THROWS_AS(nt::data::to_channels(pattern(4, 3, 3), 3), nt::Error);
}

TEST_CASE("resize_bilinear: hand-computed cases, and the same size is the identity", "[cpu][image]") {
  // 2x2 -> 4x4: sy = max(0, (y + 0.5) / 2 - 0.5) = 0, 0.25, 0.75, 1.25 (clamped to the last row); likewise sx.
  // Row 1 (fy = 0.25): left 0.75*0 + 0.25*200 = 50, right 0.75*100 + 0.25*255 = 138.75;
  // x = 1: 0.75*50 + 0.25*138.75 = 72.19 -> 72, x = 2: 0.25*50 + 0.75*138.75 = 116.56 -> 117.
  const Image small = planar(1, 2, 2, {0, 100, 200, 255});
  require_equal(nt::data::resize_bilinear(small, 4, 4),
                planar(1, 4, 4, {0, 25, 75, 100, 50, 72, 117, 139, 150, 167, 200, 216, 200, 214, 241, 255}));
  // 1x4 -> 1x2: sx = 0.5, 2.5: the mean of each pair, 35.5 rounding up to 36. 1x3 -> 1x2: sx = 0.25, 1.75.
  require_equal(nt::data::resize_bilinear(planar(1, 1, 4, {10, 20, 30, 41}), 1, 2), planar(1, 1, 2, {15, 36}));
  require_equal(nt::data::resize_bilinear(planar(1, 1, 3, {0, 100, 200}), 1, 2), planar(1, 1, 2, {25, 175}));
  // Channels are resized independently: channel 1 of an RGB resize is the resize of channel 1 alone.
  const Image rgb = pattern(3, 9, 13);
  const Image resized = nt::data::resize_bilinear(rgb, 5, 20);
  Image green{1, 9, 13, {rgb.pixels.begin() + 9 * 13, rgb.pixels.begin() + 2 * 9 * 13}};
  const Image green_resized = nt::data::resize_bilinear(green, 5, 20);
  REQUIRE(resized.pixels.size() == size_t(3 * 5 * 20));
  CHECK(std::equal(green_resized.pixels.begin(), green_resized.pixels.end(), resized.pixels.begin() + 5 * 20));
  // The same size is the identity, and a constant image stays constant at any size.
  require_equal(nt::data::resize_bilinear(pattern(3, 33, 31), 33, 31), pattern(3, 33, 31));
  Image flat{1, 7, 5, std::vector<uint8_t>(35, 201)};
  require_equal(nt::data::resize_bilinear(flat, 28, 28), Image{1, 28, 28, std::vector<uint8_t>(28 * 28, 201)});
  CHECK_THROWS_AS(nt::data::resize_bilinear(small, 0, 4), nt::Error);
  CHECK_THROWS_AS(nt::data::resize_bilinear(small, 4, nt::data::kMaxImageSide + 1), nt::Error);
}

TEST_CASE("invert maps v to 255 - v", "[cpu][image]") {
  Image image = planar(1, 1, 5, {0, 1, 128, 254, 255});
  nt::data::invert(image);
  require_equal(image, planar(1, 1, 5, {255, 254, 127, 1, 0}));
  Image rgb = pattern(3, 4, 3);
  nt::data::invert(rgb);
  nt::data::invert(rgb);
  require_equal(rgb, pattern(3, 4, 3));
}

// ---- bad files
// -------------------------------------------------------------------------------------------------------

TEST_CASE("missing, empty and unknown files are one-line errors naming the file", "[cpu][image]") {
  const TempDir dir;
  CHECK_THAT(read_error(dir.file("absent.png")), Contains("file not found"));
  CHECK_THAT(read_error(dir.path), Contains("is a directory"));
  const std::string p = dir.file("bad");
  write_bytes(p, "");
  CHECK_THAT(read_error(p), Contains("empty file"));
  write_bytes(p, "GIF89a\x01\x00\x01\x00");
  CHECK_THAT(read_error(p), Contains("not a PNG, PGM (P2, P5) or PPM (P3, P6) file: it starts with bytes 47 49 46 38"));
  write_bytes(p, "P4\n1 1\n\x80");  // PBM: not read
  CHECK_THAT(read_error(p), Contains("not a PNG, PGM"));
  write_bytes(p, "P");
  CHECK_THAT(read_error(p), Contains("not a PNG, PGM"));
}

TEST_CASE("a PNG cut anywhere is an error", "[cpu][image]") {
  const TempDir dir;
  const std::string whole = png_bytes(dir, pattern(3, 33, 31));
  const std::string p = dir.file("cut.png");
  for (size_t length : {size_t(1), size_t(4), size_t(7), size_t(8), size_t(12), size_t(20), size_t(33), size_t(40),
                        whole.size() / 2, whole.size() - 13, whole.size() - 12, whole.size() - 1}) {
    INFO("the first " << length << " of " << whole.size() << " bytes");
    write_bytes(p, whole.substr(0, length));
    CHECK_THAT(read_error(p), Contains("truncated PNG"));
  }
  write_bytes(p, whole);
  require_equal(read_image(p), pattern(3, 33, 31));
}

TEST_CASE("a PNG with a bad CRC or bad compressed data is an error", "[cpu][image]") {
  const TempDir dir;
  const std::string whole = png_bytes(dir, pattern(1, 7, 5));
  const std::string p = dir.file("corrupt.png");
  for (const char* type : {"IHDR", "IDAT"}) {
    INFO(type);
    std::string bad = whole;
    bad[find_chunk(bad, type).crc()] ^= 0x01;
    write_bytes(p, bad);
    const std::string message = read_error(p);
    CHECK_THAT(message, Contains("corrupt PNG ("));
    CHECK_THAT(message, Contains("CRC error"));
  }
  // A byte of the IDAT data flipped, its CRC left stale: bad compressed data or the CRC, whichever libpng meets first.
  std::string bad = whole;
  const Chunk idat = find_chunk(bad, "IDAT");
  bad[idat.data() + idat.length / 2] ^= 0x40;
  write_bytes(p, bad);
  CHECK_THAT(read_error(p), Contains("corrupt PNG ("));
  // The zlib stream's header broken and the CRC made to match: the data itself is bad.
  bad = whole;
  bad[idat.data()] = '\xff';
  bad[idat.data() + 1] = '\xff';
  fix_crc(bad, idat);
  write_bytes(p, bad);
  CHECK_THAT(read_error(p), Contains("corrupt PNG ("));
  // The IDAT data replaced by zeros (a stored block claiming garbage lengths), CRC made to match.
  bad = whole;
  for (size_t i = 2; i < idat.length; ++i) bad[idat.data() + i] = '\0';
  fix_crc(bad, idat);
  write_bytes(p, bad);
  CHECK_THAT(read_error(p), Contains("corrupt PNG ("));
  // A palette image without its palette.
  const std::string palette_path = dir.file("palette.png");
  write_png_direct(palette_path,
                   PngSpec{.width = 2, .height = 1, .color_type = PNG_COLOR_TYPE_PALETTE, .palette = {{1, 2, 3}}},
                   {0, 0});
  std::string no_plte = nt::test::read_file(palette_path);
  const Chunk plte = find_chunk(no_plte, "PLTE");
  no_plte.erase(plte.offset, plte.length + 12);
  write_bytes(p, no_plte);
  CHECK_THAT(read_error(p), Contains("corrupt PNG ("));
}

TEST_CASE("oversize images are refused from the header, naming both sizes", "[cpu][image]") {
  const TempDir dir;
  const std::string one_pixel = png_bytes(dir, pattern(1, 1, 1));
  const std::string p = dir.file("huge.png");
  const Chunk ihdr = find_chunk(one_pixel, "IHDR");
  auto with_size = [&](uint32_t width, uint32_t height) {
    std::string b = one_pixel;
    put_u32(b, ihdr.data(), width);
    put_u32(b, ihdr.data() + 4, height);
    fix_crc(b, ihdr);
    write_bytes(p, b);
  };
  with_size(16385, 1);
  CHECK_THAT(read_error(p), Contains("too large: 1 rows x 16385 columns (the limit is 16384 per side"));
  with_size(3, 100000);
  CHECK_THAT(read_error(p), Contains("too large: 100000 rows x 3 columns"));
  // Within the limits, but far more rows than a file of a few dozen bytes can inflate to.
  with_size(16384, 16384);
  CHECK_THAT(read_error(p), Contains("corrupt PNG (its header promises 16384 rows x 16384 columns"));

  write_bytes(p, "P5\n20000 10\n255\n");
  CHECK_THAT(read_error(p), Contains("too large: 10 rows x 20000 columns"));
  write_bytes(p, "P3 16384 16385 255\n");
  CHECK_THAT(read_error(p), Contains("too large: 16385 rows x 16384 columns"));
  write_bytes(p, "P2 99999999999 1 255\n");
  CHECK_THAT(read_error(p), Contains("width is over 1000000000"));
}

TEST_CASE("bad Netpbm headers and data are errors naming the fault", "[cpu][image]") {
  const TempDir dir;
  const std::string p = dir.file("bad.pnm");
  auto error_for = [&](const std::string& bytes) {
    write_bytes(p, bytes);
    return read_error(p);
  };
  CHECK_THAT(error_for("P5\n3 2\n"), Contains("bad PGM (P5) header: missing maxval (the file ends)"));
  CHECK_THAT(error_for(std::string("P5\n3 2\n\x01\x02\x03\x04\x05\x06", 13)),
             Contains("bad PGM (P5) header: missing maxval: expected a number, found byte 0x01"));
  CHECK_THAT(error_for("P2\n# only a comment\n"), Contains("bad PGM (P2) header: missing width (the file ends)"));
  CHECK_THAT(error_for("P6 3 x 255\n"), Contains("bad PPM (P6) header: missing height: expected a number, found 'x'"));
  CHECK_THAT(error_for("P5 3a 2 255\n"), Contains("width is not a number: found 'a' after its digits"));
  CHECK_THAT(error_for("P5x 3 2 255\n"), Contains("expected whitespace after the magic P5, found 'x'"));
  CHECK_THAT(error_for("P5 0 2 255\n"), Contains("an empty image (2 rows x 0 columns)"));
  CHECK_THAT(error_for("P5 3 2 0\n"), Contains("maxval 0 is outside 1..65535"));
  CHECK_THAT(error_for("P5 3 2 70000\n"), Contains("maxval 70000 is outside 1..65535"));
  CHECK_THAT(error_for("P5 3 2 255"), Contains("truncated PGM (P5): the header ends without the byte after maxval"));
  CHECK_THAT(error_for("P5 3 2 255\nabcde"),
             Contains("truncated PGM (P5): the header promises 2 rows x 3 columns x 1 channels, 6 bytes of samples, "
                      "found 5"));
  CHECK_THAT(error_for("P6 2 1 65535\n\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b"),
             Contains("12 bytes of samples, found 11"));
  CHECK_THAT(error_for("P2 3 2 255\n1 2 3 4 5"), Contains("truncated PGM (P2): the header promises 6 samples"));
  CHECK_THAT(error_for("P2 3 2 255\n1 2 3 4 5           "), Contains("truncated PGM (P2): found 5 of the 6 samples"));
  CHECK_THAT(error_for("P2 3 2 255\n1 2 3 4 x 6"), Contains("bad PGM (P2) sample 4: expected a number, found 'x'"));
  CHECK_THAT(error_for("P2 3 2 15\n1 2 3 4 16 6"), Contains("bad PGM (P2): sample 4 is 16, over maxval 15"));
  CHECK_THAT(error_for("P3 1 1 255\n1 2 99999999"), Contains("bad PPM (P3): sample 2 is over 65535"));
  CHECK_THAT(error_for(std::string("P5 2 1 1000\n\x03\xe9\x00\x00", 16)),
             Contains("sample 0 is 1001, over maxval 1000"));
}

}  // namespace
