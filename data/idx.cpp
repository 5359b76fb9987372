// IDX reader: sniff the gzip magic, read the big-endian header, read the payload once into a buffer
// sized from the header, then insist the file ends exactly there. Every check names the file.
#include "data/idx.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include <zlib.h>

#include "core/error.h"

namespace nt::data {
namespace {

constexpr uint32_t kImagesMagic = 2051;   // 0x00000803: unsigned bytes, rank 3
constexpr uint32_t kImages4Magic = 2052;  // 0x00000804: unsigned bytes, rank 4 (channels last)
constexpr uint32_t kLabelsMagic = 2049;   // 0x00000801: unsigned bytes, rank 1
constexpr uint32_t kMaxImageSide = 4096;  // larger rows/cols mean a damaged header, not a real data set
constexpr uint32_t kMaxChannels = 4096;   // likewise for channels (the batch kernels take far fewer: data/dataset.h)
constexpr uint64_t kMaxPayload = uint64_t(1) << 32;  // 4 GiB: far beyond any IDX set we train on

const char* zlib_error_name(int code) {
  switch (code) {
    case Z_ERRNO:
      return "Z_ERRNO";
    case Z_STREAM_ERROR:
      return "Z_STREAM_ERROR";
    case Z_DATA_ERROR:
      return "Z_DATA_ERROR";
    case Z_MEM_ERROR:
      return "Z_MEM_ERROR";
    case Z_BUF_ERROR:
      return "Z_BUF_ERROR";
    default:
      return "zlib error";
  }
}

// The bytes of a file, decompressed if it starts with the gzip magic. read() returns fewer bytes than
// asked only at the end of the data; a zlib failure (corrupt or cut-off stream) throws at once.
class ByteSource {
 public:
  ByteSource(const std::string& path, const char* kind) : path_(path), kind_(kind) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) fail("file not found");
    if (std::filesystem::is_directory(path, ec)) fail("is a directory, not a file");
    raw_ = std::fopen(path.c_str(), "rb");
    if (!raw_) fail(cat("cannot open: ", std::strerror(errno)));
    std::array<unsigned char, 2> head{};
    bool gzip = std::fread(head.data(), 1, 2, raw_) == 2 && head[0] == 0x1f && head[1] == 0x8b;
    if (gzip) {
      std::fclose(raw_);
      raw_ = nullptr;
      gz_ = gzopen(path.c_str(), "rb");
      if (!gz_) fail("cannot open as gzip");
      gzbuffer(gz_, 1 << 17);
    } else {
      std::rewind(raw_);
    }
  }
  ~ByteSource() {
    if (raw_) std::fclose(raw_);
    if (gz_) gzclose(gz_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  bool gzip() const { return gz_ != nullptr; }

  // Bytes left to read in a raw file; for gzip the decompressed size is unknown until it is read.
  std::optional<uint64_t> raw_bytes_left() const {
    if (gz_) return std::nullopt;
    std::error_code ec;
    uint64_t size = std::filesystem::file_size(path_, ec);
    long pos = std::ftell(raw_);
    if (ec || pos < 0) return std::nullopt;
    return size - std::min<uint64_t>(size, static_cast<uint64_t>(pos));
  }

  size_t read(uint8_t* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      size_t want = std::min<size_t>(n - got, size_t(1) << 30);  // gzread takes an unsigned int
      size_t step = gz_ ? gz_step(dst + got, want) : std::fread(dst + got, 1, want, raw_);
      if (!gz_ && std::ferror(raw_)) fail(cat("read error: ", std::strerror(errno)));
      if (step == 0) break;
      got += step;
    }
    return got;
  }

  [[noreturn]] void fail(const std::string& what) const { throw Error(cat(kind_, " file '", path_, "': ", what)); }

 private:
  size_t gz_step(uint8_t* dst, size_t n) {
    int step = gzread(gz_, dst, static_cast<unsigned>(n));
    int code = Z_OK;
    const char* msg = gzerror(gz_, &code);
    // A cut-off stream reads as a short read with Z_BUF_ERROR set, so check the error state every time.
    if (step < 0 || code != Z_OK) {
      std::string text = msg ? msg : "";
      if (text.starts_with(path_ + ": ")) text.erase(0, path_.size() + 2);  // zlib prefixes the path
      fail(cat("corrupt gzip data (", zlib_error_name(code), ": ", text, ")"));
    }
    return static_cast<size_t>(step);
  }

  std::string path_;
  const char* kind_;
  FILE* raw_ = nullptr;
  gzFile gz_ = nullptr;
};

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

std::string describe_magic(uint32_t magic) {
  if (magic == kImagesMagic) return "2051 (IDX images)";
  if (magic == kImages4Magic) return "2052 (IDX images with channels)";
  if (magic == kLabelsMagic) return "2049 (IDX labels)";
  return cat(magic, " (not an IDX ubyte file)");
}

// Reads the magic and the dimensions; returns them after checking the magic (expected_magic, or also_magic when
// that is not 0) and each dimension.
std::vector<uint32_t> read_header(ByteSource& src, uint32_t expected_magic, uint32_t also_magic = 0) {
  std::array<uint8_t, 4> magic_bytes{};
  size_t got = src.read(magic_bytes.data(), 4);
  if (got == 0) src.fail(src.gzip() ? "empty file (gzip data decompresses to nothing)" : "empty file");
  if (got < 4) src.fail(cat("truncated header: ", got, " bytes, expected at least 4 for the magic number"));
  uint32_t magic = big_endian_u32(magic_bytes.data());
  if (magic != expected_magic && (also_magic == 0 || magic != also_magic)) {
    std::string hint;
    if (magic == kLabelsMagic) hint = "; this is a labels file, given where images were expected";
    if (magic == kImagesMagic || magic == kImages4Magic)
      hint = "; this is an images file, given where labels were expected";
    src.fail(cat("wrong magic number ", describe_magic(magic), ", expected ", describe_magic(expected_magic),
                 also_magic ? cat(" or ", describe_magic(also_magic)) : std::string(), hint));
  }
  size_t rank = magic & 0xff;
  std::vector<uint8_t> raw(4 * rank);
  got = src.read(raw.data(), raw.size());
  if (got < raw.size())
    src.fail(
        cat("truncated header: ", 4 + got, " bytes, expected ", 4 + raw.size(), " for a rank-", rank, " IDX header"));
  std::vector<uint32_t> dims(rank);
  for (size_t i = 0; i < rank; ++i) {
    dims[i] = big_endian_u32(raw.data() + 4 * i);
    if (dims[i] == 0) src.fail(cat("dimension ", i, " of the header is zero"));
  }
  return dims;
}

// Reads exactly `bytes` payload bytes and checks nothing follows them.
std::vector<uint8_t> read_payload(ByteSource& src, uint64_t bytes, size_t header_bytes, const char* what) {
  if (bytes > kMaxPayload) src.fail(cat("header promises ", bytes, " bytes of ", what, ", an absurd size"));
  auto truncated = [&](uint64_t found) {
    src.fail(cat("truncated payload: the header promises ", bytes, " bytes of ", what, " after its ", header_bytes,
                 " bytes, found ", found, src.gzip() ? " (after decompression)" : ""));
  };
  // A raw file's size is known: a damaged header claiming gigabytes fails here, before allocating them. A gzip's
  // is known only by decompressing it, so the payload grows by chunks as the bytes arrive: a 34-byte file that
  // promises 4 GiB fails after reading its few bytes, having allocated one chunk, not 4 GiB.
  if (auto left = src.raw_bytes_left(); left && *left < bytes) truncated(*left);
  constexpr uint64_t kChunk = uint64_t(16) << 20;
  std::vector<uint8_t> payload;
  try {
    payload.reserve(static_cast<size_t>(src.raw_bytes_left() ? bytes : std::min(bytes, kChunk)));
    while (payload.size() < bytes) {
      const size_t before = payload.size(), want = static_cast<size_t>(std::min(bytes - before, kChunk));
      payload.resize(before + want);
      const size_t got = src.read(payload.data() + before, want);
      payload.resize(before + got);
      if (got < want) truncated(payload.size());
    }
  } catch (const std::bad_alloc&) {
    src.fail(cat("out of memory holding its ", bytes, " bytes of ", what));
  }
  std::array<uint8_t, 1 << 16> scratch{};
  uint64_t extra = 0;
  while (size_t n = src.read(scratch.data(), scratch.size())) extra += n;
  if (extra > 0)
    src.fail(
        cat("trailing bytes: ", extra, " extra bytes after the ", bytes, " bytes of ", what, " the header promises"));
  return payload;
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  ByteSource src(path, "IDX images");
  std::vector<uint32_t> dims = read_header(src, kImagesMagic, kImages4Magic);
  if (dims[1] > kMaxImageSide || dims[2] > kMaxImageSide)
    src.fail(cat("absurd image size ", dims[1], "x", dims[2], " (limit ", kMaxImageSide, " per side)"));
  const uint32_t channels = dims.size() == 4 ? dims[3] : 1;  // zero was refused with the other dimensions
  if (channels > kMaxChannels) src.fail(cat("absurd channel count ", channels, " (limit ", kMaxChannels, ")"));
  IdxImages images;
  images.count = dims[0];
  images.rows = static_cast<int>(dims[1]);
  images.cols = static_cast<int>(dims[2]);
  images.channels = static_cast<int>(channels);
  // At most 2^32 * 2^12 * 2^12 * 2^12 = 2^68 would overflow: the product saturates, and read_payload refuses it.
  const uint64_t per_image = uint64_t(dims[1]) * dims[2] * channels;  // <= 2^36
  const uint64_t bytes = dims[0] > UINT64_MAX / per_image ? UINT64_MAX : dims[0] * per_image;
  images.pixels = read_payload(src, bytes, 4 + 4 * dims.size(), "pixels");
  return images;
}

IdxLabels read_idx_labels(const std::string& path) {
  ByteSource src(path, "IDX labels");
  std::vector<uint32_t> dims = read_header(src, kLabelsMagic);
  IdxLabels labels;
  labels.count = dims[0];
  labels.labels = read_payload(src, dims[0], 8, "labels");
  return labels;
}

}  // namespace nt::data
