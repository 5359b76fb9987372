// IDX reading and data sets: synthetic files (raw and gzip) round-trip, each kind of damaged file gets
// its own one-line error naming the file, and the real MNIST loads with the expected shape and statistics.
#include "tests/support/catch2.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <zlib.h>

#include "core/error.h"
#include "data/dataset.h"
#include "data/idx.h"
#include "tests/support/test_support.h"

namespace {

namespace fs = std::filesystem;
using nt::data::load_idx_pair;
using nt::data::read_idx_images;
using nt::data::read_idx_labels;
using nt::test::Approx;
using nt::test::Contains;
using nt::test::names;

using Bytes = std::vector<uint8_t>;

// A fresh folder under the system temp dir, removed when the test ends.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "nt_test_idx_XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void put_u32(Bytes& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

// A well-formed images file: pixel (i, r, c) = (7*i + 3*r + c) mod 256, so any misplaced byte shows.
Bytes images_idx(uint32_t count, uint32_t rows, uint32_t cols) {
  Bytes b;
  put_u32(b, 2051);
  put_u32(b, count);
  put_u32(b, rows);
  put_u32(b, cols);
  for (uint32_t i = 0; i < count; ++i)
    for (uint32_t r = 0; r < rows; ++r)
      for (uint32_t c = 0; c < cols; ++c) b.push_back(static_cast<uint8_t>(7 * i + 3 * r + c));
  return b;
}

Bytes labels_idx(const Bytes& labels) {
  Bytes b;
  put_u32(b, 2049);
  put_u32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

void write_raw(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

void write_gzip(const std::string& path, const Bytes& bytes) {
  gzFile gz = gzopen(path.c_str(), "wb");
  REQUIRE(gz != nullptr);
  if (!bytes.empty()) REQUIRE(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())) > 0);
  REQUIRE(gzclose(gz) == Z_OK);
}

Bytes read_raw(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

void write_as(bool gzip, const std::string& path, const Bytes& bytes) {
  if (gzip)
    write_gzip(path, bytes);
  else
    write_raw(path, bytes);
}

}  // namespace

TEST_CASE("IDX images and labels round-trip, raw and gzip", "[cpu][data]") {
  TempDir dir;
  Bytes images = images_idx(5, 3, 4);
  Bytes labels = {0, 9, 3, 3, 7};
  bool gzip = GENERATE(false, true);
  std::string suffix = gzip ? ".gz" : "";
  write_as(gzip, dir / ("images" + suffix), images);
  write_as(gzip, dir / ("labels" + suffix), labels_idx(labels));
  CAPTURE(gzip);

  auto img = read_idx_images(dir / ("images" + suffix));
  REQUIRE(img.count == 5);
  REQUIRE(img.rows == 3);
  REQUIRE(img.cols == 4);
  REQUIRE(img.pixels == Bytes(images.begin() + 16, images.end()));

  auto d = load_idx_pair(dir / ("images" + suffix), dir / ("labels" + suffix), 10, "synthetic");
  REQUIRE(d.name == "synthetic");
  REQUIRE(d.count == 5);
  REQUIRE(d.channels == 1);
  REQUIRE(d.image_size() == 12);
  REQUIRE(d.images == img.pixels);
  REQUIRE(d.labels == labels);
}

TEST_CASE("IDX gzip is recognised by its magic bytes, not by the file name", "[cpu][data]") {
  TempDir dir;
  Bytes images = images_idx(2, 2, 2);
  write_gzip(dir / "gzip-without-suffix", images);
  write_raw(dir / "raw-with-suffix.gz", images);
  REQUIRE(read_idx_images(dir / "gzip-without-suffix").pixels == Bytes(images.begin() + 16, images.end()));
  REQUIRE(read_idx_images(dir / "raw-with-suffix.gz").pixels == Bytes(images.begin() + 16, images.end()));
}

TEST_CASE("IDX reader names the file and the fault for each damaged file", "[cpu][data]") {
  TempDir dir;
  Bytes images = images_idx(4, 2, 3);  // 16-byte header + 24 pixels
  Bytes labels = labels_idx({1, 2, 3, 4});

  SECTION("missing file") {
    std::string p = dir / "nope-idx3-ubyte";
    REQUIRE_THROWS_WITH(read_idx_images(p), names(p, "file not found"));
  }
  SECTION("empty file, raw and gzip") {
    std::string p = dir / "empty";
    bool gzip = GENERATE(false, true);
    write_as(gzip, p, {});
    REQUIRE_THROWS_WITH(read_idx_images(p), names(p, "empty file"));
  }
  SECTION("truncated header") {
    std::string p = dir / "short-header";
    write_raw(p, Bytes(images.begin(), images.begin() + 10));  // magic + 6 of the 12 dimension bytes
    REQUIRE_THROWS_WITH(read_idx_images(p), names(p, "truncated header: 10 bytes, expected 16"));
    write_raw(p, Bytes(images.begin(), images.begin() + 3));
    REQUIRE_THROWS_WITH(read_idx_images(p), names(p, "truncated header: 3 bytes"));
  }
  SECTION("truncated payload, raw and gzip") {
    std::string p = dir / "short-payload";
    bool gzip = GENERATE(false, true);
    write_as(gzip, p, Bytes(images.begin(), images.end() - 5));
    REQUIRE_THROWS_WITH(read_idx_images(p),
                        names(p, "truncated payload") && Contains("promises 24 bytes") && Contains("found 19"));
  }
  SECTION("trailing bytes, raw and gzip") {
    std::string p = dir / "trailing";
    bool gzip = GENERATE(false, true);
    Bytes longer = labels;
    longer.insert(longer.end(), {0xde, 0xad, 0xbe});
    write_as(gzip, p, longer);
    REQUIRE_THROWS_WITH(read_idx_labels(p), names(p, "trailing bytes: 3 extra bytes"));
  }
  SECTION("wrong magic") {
    std::string p = dir / "not-idx";
    Bytes junk = images;
    junk[2] = 0x0c;  // type 0x0c (int32), rank 3: an IDX file, but not of bytes
    write_raw(p, junk);
    REQUIRE_THROWS_WITH(read_idx_images(p), names(p, "wrong magic number 3075") && Contains("expected 2051"));
  }
  SECTION("a labels file given as images, and the reverse") {
    std::string li = dir / "labels", im = dir / "images";
    write_raw(li, labels);
    write_raw(im, images);
    REQUIRE_THROWS_WITH(read_idx_images(li), names(li, "this is a labels file, given where images"));
    REQUIRE_THROWS_WITH(read_idx_labels(im), names(im, "this is an images file, given where labels"));
  }
  SECTION("a zero dimension") {
    std::string p = dir / "zero-rows";
    write_raw(p, images_idx(4, 0, 3));
    REQUIRE_THROWS_WITH(read_idx_images(p), names(p, "dimension 1 of the header is zero"));
  }
  SECTION("absurd image size") {
    std::string p = dir / "huge";
    Bytes b;
    for (uint32_t v : {2051u, 1u, 100000u, 28u}) put_u32(b, v);
    write_raw(p, b);
    REQUIRE_THROWS_WITH(read_idx_images(p), names(p, "absurd image size 100000x28"));
  }
  SECTION("corrupt gzip: a valid gzip header followed by garbage") {
    std::string p = dir / "garbage.gz";
    Bytes b = {0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0x00, 0x03};  // gzip header: deflate, no flags, Unix
    for (int i = 0; i < 64; ++i) b.push_back(0xff);              // 0xff: final block of reserved type 3
    write_raw(p, b);
    REQUIRE_THROWS_WITH(read_idx_images(p), names(p, "corrupt gzip data (Z_DATA_ERROR"));
  }
  SECTION("corrupt gzip: a stream cut off midway") {
    std::string p = dir / "cut.gz";
    write_gzip(p, images_idx(50, 10, 10));
    Bytes whole = read_raw(p);
    write_raw(p, Bytes(whole.begin(), whole.begin() + static_cast<long>(whole.size() / 2)));
    REQUIRE_THROWS_WITH(read_idx_images(p), names(p, "corrupt gzip data (Z_BUF_ERROR"));
  }
}

TEST_CASE("A tiny gzip whose header promises 4 GiB fails after reading its bytes, not after allocating 4 GiB",
          "[cpu][data]") {
  TempDir dir;
  Bytes header;  // 2^32 - 1 images of 1x1: 4 GiB - 1 of pixels, within the reader's limit, and two of them present
  put_u32(header, 2051), put_u32(header, 0xffffffffu), put_u32(header, 1), put_u32(header, 1);
  header.push_back(7), header.push_back(9);
  write_gzip(dir / "train-images-idx3-ubyte.gz", header);
  REQUIRE(fs::file_size(dir / "train-images-idx3-ubyte.gz") < 64);
  REQUIRE_THROWS_WITH(read_idx_images(dir / "train-images-idx3-ubyte.gz"),
                      names(dir / "train-images-idx3-ubyte.gz", "truncated payload") && Contains("found 2"));
  // The same through the CLI in a process that may map 1 GiB at most: one line naming the file, no bad_alloc.
  write_raw(dir / "train-labels-idx1-ubyte", labels_idx({1, 2}));
  write_raw(dir / "t10k-images-idx3-ubyte", images_idx(2, 1, 1));
  write_raw(dir / "t10k-labels-idx1-ubyte", labels_idx({1, 2}));
  const auto r = nt::test::run_command(nt::test::with_memory_limit(
      1024, nt::test::cli_path() + " train --device cpu --threads 1 --epochs 1 --data " + dir.path.string()));
  INFO(r.out);
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("truncated payload") != std::string::npos);
  CHECK(r.out.find("bad_alloc") == std::string::npos);
}

TEST_CASE("A folder where an IDX file should be is named as a folder, not as missing", "[cpu][data]") {
  TempDir dir;
  write_raw(dir / "train-labels-idx1-ubyte", labels_idx({1, 2}));
  write_raw(dir / "t10k-images-idx3-ubyte", images_idx(2, 1, 1));
  write_raw(dir / "t10k-labels-idx1-ubyte", labels_idx({1, 2}));
  fs::create_directory(dir / "train-images-idx3-ubyte");
  REQUIRE_THROWS_WITH(nt::data::load_dataset_dir(dir.path.string(), "mnist"),
                      Contains(dir / "train-images-idx3-ubyte") && Contains("is a folder, not an IDX file"));
}

TEST_CASE("Data set pairing checks counts and label range", "[cpu][data]") {
  TempDir dir;
  write_raw(dir / "images", images_idx(4, 2, 3));

  SECTION("image and label counts differ") {
    write_raw(dir / "labels", labels_idx({1, 2, 3}));
    REQUIRE_THROWS_WITH(load_idx_pair(dir / "images", dir / "labels", 10, "toy"),
                        Contains("count mismatch") && Contains(dir / "images") && Contains("has 4 images") &&
                            Contains(dir / "labels") && Contains("has 3 labels"));
  }
  SECTION("a label out of range") {
    write_raw(dir / "labels", labels_idx({1, 9, 2, 10}));
    REQUIRE_THROWS_WITH(load_idx_pair(dir / "images", dir / "labels", 10, "toy"),
                        names(dir / "labels", "label out of range at index 3: value 10, expected 0..9"));
  }
}

TEST_CASE("Data set folders: standard names, .gz fallback, missing pieces, statistics", "[cpu][data]") {
  TempDir dir;
  // Train pixels take two values, 0 and 255, in equal numbers: mean 0.5 and population std 0.5.
  Bytes train = {0x00, 0x00, 0x08, 0x03};
  for (uint32_t v : {2u, 1u, 2u}) put_u32(train, v);
  train.insert(train.end(), {0, 255, 255, 0});

  SECTION("missing folder") {
    std::string missing = dir / "absent";
    REQUIRE_THROWS_WITH(nt::data::load_dataset_dir(missing, "toy"),
                        names(missing, "does not exist") && Contains("scripts/fetch-data"));
  }
  SECTION("a missing file names the file and the folder") {
    write_raw(dir / "train-images-idx3-ubyte", train);
    REQUIRE_THROWS_WITH(nt::data::load_dataset_dir(dir.path.string(), "toy"),
                        Contains("missing train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
                                 "t10k-labels-idx1-ubyte (raw or .gz) in " +
                                 dir.path.string()));
  }
  SECTION("raw and gzip files mix; raw wins when both exist; statistics come from train") {
    write_raw(dir / "train-images-idx3-ubyte", train);
    write_gzip(dir / "train-images-idx3-ubyte.gz", images_idx(2, 1, 2));  // shadowed by the raw file
    write_gzip(dir / "train-labels-idx1-ubyte.gz", labels_idx({3, 4}));
    write_gzip(dir / "t10k-images-idx3-ubyte.gz", images_idx(3, 1, 2));
    write_raw(dir / "t10k-labels-idx1-ubyte", labels_idx({0, 1, 2}));

    auto split = nt::data::load_dataset_dir(dir.path.string(), "toy");
    REQUIRE(split.train.count == 2);
    REQUIRE(split.train.images == Bytes{0, 255, 255, 0});
    REQUIRE(split.train.labels == Bytes{3, 4});
    REQUIRE(split.test.count == 3);
    REQUIRE(split.test.labels == Bytes{0, 1, 2});
    // 0.5 and 0.5 are exact in float: the statistics must be exactly these.
    REQUIRE(split.train.mean == std::vector<float>{0.5f});
    REQUIRE(split.train.std == std::vector<float>{0.5f});
    REQUIRE(split.test.mean == std::vector<float>{0.5f});
    REQUIRE(split.test.std == std::vector<float>{0.5f});

    auto one = nt::data::subset(split.test, 1, 2);
    REQUIRE(one.count == 2);
    REQUIRE(one.labels == Bytes{1, 2});
    REQUIRE(one.images == Bytes(split.test.images.begin() + 2, split.test.images.end()));
    REQUIRE(one.mean == std::vector<float>{0.5f});
    REQUIRE_THROWS_WITH(nt::data::subset(split.test, 2, 2), Contains("outside its 3 examples"));
  }
}

TEST_CASE("Real MNIST loads with its shape, labels and statistics", "[cpu][data]") {
  std::string dir = nt::test::mnist_dir();
  if (!fs::is_directory(dir)) FAIL("no MNIST in " << dir << ": run scripts/fetch-data mnist");
  auto split = nt::data::load_dataset_dir(dir, "mnist");
  REQUIRE(split.train.count == 60000);
  REQUIRE(split.test.count == 10000);
  for (auto* d : {&split.train, &split.test}) {
    REQUIRE(d->rows == 28);
    REQUIRE(d->cols == 28);
    REQUIRE(d->images.size() == size_t(d->count) * 784);
    REQUIRE(d->labels.size() == size_t(d->count));
    REQUIRE(std::all_of(d->labels.begin(), d->labels.end(), [](uint8_t label) { return label < 10; }));
    REQUIRE(d->mean == std::vector<float>{0.1307f});  // "mnist" uses the standard constants for both splits
    REQUIRE(d->std == std::vector<float>{0.3081f});
    REQUIRE(d->classes == 10);  // the largest train label + 1
    REQUIRE(d->class_names.empty());
  }
  // Every digit occurs in both splits (a shuffled or truncated read would skew this).
  for (auto* d : {&split.train, &split.test}) {
    std::vector<int> histogram(10, 0);
    for (uint8_t label : d->labels) ++histogram[label];
    for (int c = 0; c < 10; ++c) REQUIRE(histogram[c] > 0);
  }
  // The computed statistics of the train images reproduce the constants to 4 decimals.
  auto stats = nt::data::pixel_stats(split.train.images);
  REQUIRE(stats.mean == Approx(0.1307).margin(5e-5));
  REQUIRE(stats.std == Approx(0.3081).margin(5e-5));
  // Under another name the loader computes them itself.
  auto computed = nt::data::load_dataset_dir(dir, "mnist-computed");
  REQUIRE(computed.train.mean.size() == 1);
  REQUIRE(computed.train.mean[0] == Approx(0.1307).margin(5e-5));
  REQUIRE(computed.test.std[0] == Approx(0.3081).margin(5e-5));
  REQUIRE(computed.train.mean[0] == static_cast<float>(stats.mean));  // exactly the single-channel statistics
  REQUIRE(computed.train.std[0] == static_cast<float>(stats.std));
}

// ---- rank-4 IDX images (channels last), classes from the data, per-channel statistics --------------------------

namespace {

// A rank-4 images file (magic 2052): dims (count, rows, cols, channels), value (i, r, c, ch) = f(i, r, c, ch), stored
// channels last.
template <class F>
Bytes images4_idx(uint32_t count, uint32_t rows, uint32_t cols, uint32_t channels, F f) {
  Bytes b;
  for (uint32_t v : {2052u, count, rows, cols, channels}) put_u32(b, v);
  for (uint32_t i = 0; i < count; ++i)
    for (uint32_t r = 0; r < rows; ++r)
      for (uint32_t c = 0; c < cols; ++c)
        for (uint32_t ch = 0; ch < channels; ++ch) b.push_back(f(i, r, c, ch));
  return b;
}

uint8_t mixed_pixel(uint32_t i, uint32_t r, uint32_t c, uint32_t ch) {
  return static_cast<uint8_t>(31 * i + 7 * r + 3 * c + 101 * ch);
}

// The four standard files of a data set in `dir`.
void write_set(const TempDir& dir, const Bytes& train_images, const Bytes& train_labels, const Bytes& test_images,
               const Bytes& test_labels) {
  write_raw(dir / "train-images-idx3-ubyte", train_images);
  write_raw(dir / "train-labels-idx1-ubyte", labels_idx(train_labels));
  write_raw(dir / "t10k-images-idx3-ubyte", test_images);
  write_raw(dir / "t10k-labels-idx1-ubyte", labels_idx(test_labels));
}

}  // namespace

TEST_CASE("A rank-4 IDX images file reads channels last and loads planar", "[cpu][data]") {
  TempDir dir;
  const uint32_t N = 3, H = 2, W = 5, C = 3;
  const Bytes file = images4_idx(N, H, W, C, mixed_pixel);
  bool gzip = GENERATE(false, true);
  CAPTURE(gzip);
  write_as(gzip, dir / "images", file);
  write_raw(dir / "labels", labels_idx({2, 0, 1}));

  const auto img = read_idx_images(dir / "images");
  REQUIRE(img.count == N);
  REQUIRE(img.rows == int(H));
  REQUIRE(img.cols == int(W));
  REQUIRE(img.channels == int(C));
  REQUIRE(img.pixels == Bytes(file.begin() + 20, file.end()));  // as stored

  const auto d = load_idx_pair(dir / "images", dir / "labels", 0, "rgb");
  REQUIRE(d.channels == int(C));
  REQUIRE(d.rows == int(H));
  REQUIRE(d.cols == int(W));
  REQUIRE(d.image_size() == int64_t(C * H * W));
  REQUIRE(d.classes == 3);  // the largest label + 1
  REQUIRE(d.mean.size() == C);
  REQUIRE(d.std.size() == C);
  REQUIRE(d.class_names.empty());
  for (uint32_t i = 0; i < N; ++i)
    for (uint32_t ch = 0; ch < C; ++ch)
      for (uint32_t r = 0; r < H; ++r)
        for (uint32_t c = 0; c < W; ++c) {
          INFO("image " << i << " channel " << ch << " at (" << r << ", " << c << ")");
          REQUIRE(d.images[((i * C + ch) * H + r) * W + c] == mixed_pixel(i, r, c, ch));
        }
}

TEST_CASE("Rank-4 IDX faults name the file: zero or too many channels, bounded reads", "[cpu][data]") {
  TempDir dir;
  write_raw(dir / "labels", labels_idx({1, 2}));

  SECTION("zero channels") {
    Bytes b;
    for (uint32_t v : {2052u, 2u, 2u, 2u, 0u}) put_u32(b, v);
    write_raw(dir / "images", b);
    REQUIRE_THROWS_WITH(read_idx_images(dir / "images"), names(dir / "images", "dimension 3 of the header is zero"));
  }
  SECTION("more channels than the batch kernels take") {
    write_raw(dir / "images", images4_idx(2, 2, 2, 5, mixed_pixel));
    REQUIRE(read_idx_images(dir / "images").channels == 5);  // the format allows it
    REQUIRE_THROWS_WITH(load_idx_pair(dir / "images", dir / "labels", 0, "toy"),
                        names(dir / "images", "5 channels; the batch kernels take 1 to 4"));
  }
  SECTION("an absurd channel count") {
    Bytes b;
    for (uint32_t v : {2052u, 1u, 1u, 1u, 100000u}) put_u32(b, v);
    write_raw(dir / "images", b);
    REQUIRE_THROWS_WITH(read_idx_images(dir / "images"), names(dir / "images", "absurd channel count 100000"));
  }
  SECTION("dimensions whose product overflows 64 bits are refused, not wrapped") {
    Bytes b;
    for (uint32_t v : {2052u, 0xffffffffu, 4096u, 4096u, 4096u}) put_u32(b, v);
    write_raw(dir / "images", b);
    REQUIRE_THROWS_WITH(read_idx_images(dir / "images"), names(dir / "images", "an absurd size"));
  }
  SECTION("a raw file promising more than it holds fails on its size, a gzip after reading its bytes") {
    Bytes b;
    for (uint32_t v : {2052u, 0x00ffffffu, 4u, 4u, 3u}) put_u32(b, v);  // 768 MiB promised
    b.insert(b.end(), {1, 2, 3});
    bool gzip = GENERATE(false, true);
    CAPTURE(gzip);
    write_as(gzip, dir / "images", b);
    REQUIRE_THROWS_WITH(read_idx_images(dir / "images"),
                        names(dir / "images", "truncated payload") && Contains("found 3"));
  }
  SECTION("a rank-4 file where labels are expected") {
    write_raw(dir / "images", images4_idx(2, 2, 2, 3, mixed_pixel));
    REQUIRE_THROWS_WITH(read_idx_labels(dir / "images"),
                        names(dir / "images", "wrong magic number 2052") && Contains("this is an images file"));
  }
}

TEST_CASE("Per-channel statistics: exact per channel, the single-channel numbers for one channel", "[cpu][data]") {
  TempDir dir;
  // 2 train images of 1x2 pixels, 3 channels; per channel the 4 values are
  //   c0: 0, 255, 255, 0   -> mean 0.5,  population std 0.5
  //   c1: 0, 0, 0, 255     -> mean 0.25, std sqrt(0.1875)
  //   c2: 255, 255, 255, 0 -> mean 0.75, std sqrt(0.1875)
  // every step exact in double, so the float results are the casts of these.
  const uint8_t values[3][4] = {{0, 255, 255, 0}, {0, 0, 0, 255}, {255, 255, 255, 0}};
  auto train_pixel = [&](uint32_t i, uint32_t, uint32_t c, uint32_t ch) { return values[ch][i * 2 + c]; };
  write_set(dir, images4_idx(2, 1, 2, 3, train_pixel), {0, 3}, images4_idx(1, 1, 2, 3, mixed_pixel), {1});
  const auto split = nt::data::load_dataset_dir(dir.path.string(), "rgb");
  const std::vector<float> want_mean{0.5f, 0.25f, 0.75f};
  const std::vector<float> want_std{0.5f, static_cast<float>(std::sqrt(0.1875)), static_cast<float>(std::sqrt(0.1875))};
  for (const auto* d : {&split.train, &split.test}) {
    REQUIRE(d->channels == 3);
    REQUIRE(d->classes == 4);
    REQUIRE(d->mean == want_mean);
    REQUIRE(d->std == want_std);
  }
  // Planar: channel 1 of train image 1 is values[1][2..3].
  REQUIRE(split.train.images[(1 * 3 + 1) * 2 + 0] == 0);
  REQUIRE(split.train.images[(1 * 3 + 1) * 2 + 1] == 255);

  // On arbitrary bytes each channel's statistics are exactly pixel_stats of that channel's plane bytes.
  const auto d = load_idx_pair(
      [&] {
        write_raw(dir / "big-images", images4_idx(17, 5, 7, 3, mixed_pixel));
        return dir / "big-images";
      }(),
      [&] {
        write_raw(dir / "big-labels", labels_idx(Bytes(17, 1)));
        return dir / "big-labels";
      }(),
      0, "rgb");
  const auto stats = nt::data::channel_stats(d);
  REQUIRE(stats.size() == 3);
  for (int ch = 0; ch < 3; ++ch) {
    Bytes plane;
    for (int i = 0; i < 17; ++i)
      plane.insert(plane.end(), d.images.begin() + (i * 3 + ch) * 35, d.images.begin() + (i * 3 + ch + 1) * 35);
    const auto want = nt::data::pixel_stats(plane);
    INFO("channel " << ch);
    REQUIRE(stats[size_t(ch)].mean == want.mean);
    REQUIRE(stats[size_t(ch)].std == want.std);
  }

  SECTION("a channel with one value everywhere cannot be normalized") {
    TempDir flat;
    write_set(flat,
              images4_idx(2, 1, 2, 2,
                          [](uint32_t i, uint32_t, uint32_t, uint32_t ch) { return uint8_t(ch == 0 ? 255 * i : 9); }),
              {0, 1}, images4_idx(1, 1, 2, 2, mixed_pixel), {1});
    REQUIRE_THROWS_WITH(nt::data::load_dataset_dir(flat.path.string(), "flat"),
                        Contains("every train pixel of channel 1") && Contains(flat.path.string()));
  }
  SECTION("train and test must agree on the channels") {
    TempDir mixed;
    write_set(mixed, images4_idx(2, 1, 2, 3, train_pixel), {0, 1}, images_idx(1, 1, 2), {1});
    REQUIRE_THROWS_WITH(nt::data::load_dataset_dir(mixed.path.string(), "mixed"),
                        Contains("train images are 1x2x3 but test images are 1x2"));
  }
}

TEST_CASE("The class count comes from the train labels unless given, and test labels must lie in it", "[cpu][data]") {
  TempDir dir;
  const Bytes train = images_idx(4, 2, 2), test = images_idx(2, 2, 2);

  SECTION("0: the largest train label + 1") {
    write_set(dir, train, {0, 6, 2, 6}, test, {6, 0});
    const auto split = nt::data::load_dataset_dir(dir.path.string(), "toy");
    REQUIRE(split.train.classes == 7);
    REQUIRE(split.test.classes == 7);
    REQUIRE(split.train.class_names.empty());
    REQUIRE(nt::data::load_dataset_dir(dir.path.string(), "toy", 0).train.classes == 7);
  }
  SECTION("N: kept when every train label is below it") {
    write_set(dir, train, {0, 6, 2, 6}, test, {6, 0});
    const auto split = nt::data::load_dataset_dir(dir.path.string(), "toy", 12);
    REQUIRE(split.train.classes == 12);
    REQUIRE(split.test.classes == 12);
  }
  SECTION("N: a train label >= N names the file, the index and N") {
    write_set(dir, train, {0, 6, 2, 9}, test, {6, 0});
    REQUIRE_THROWS_WITH(
        nt::data::load_dataset_dir(dir.path.string(), "toy", 9),
        names(dir / "train-labels-idx1-ubyte", "label out of range at index 3: value 9") && Contains("(9 classes)"));
  }
  SECTION("a test label outside the trained range names the test file and the label") {
    write_set(dir, train, {0, 6, 2, 6}, test, {3, 7});
    REQUIRE_THROWS_WITH(
        nt::data::load_dataset_dir(dir.path.string(), "toy"),
        names(dir / "t10k-labels-idx1-ubyte", "test label 7 at index 1") && Contains("outside the trained range 0..6"));
    REQUIRE_THROWS_WITH(nt::data::load_dataset_dir(dir.path.string(), "toy", 7),
                        names(dir / "t10k-labels-idx1-ubyte", "test label 7"));
    REQUIRE(nt::data::load_dataset_dir(dir.path.string(), "toy", 8).test.classes == 8);
  }
  SECTION("a class count outside 0..256") {
    write_set(dir, train, {0, 1, 2, 3}, test, {0, 1});
    for (int classes : {-1, 257})
      REQUIRE_THROWS_WITH(nt::data::load_dataset_dir(dir.path.string(), "toy", classes),
                          Contains("dataset 'toy': ") && Contains("byte labels allow 1 to 256"));
  }
}
