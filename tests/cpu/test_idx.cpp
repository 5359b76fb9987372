// IDX reading and data sets: synthetic files (raw and gzip) round-trip, each kind of damaged file gets
// its own one-line error naming the file, and the real MNIST loads with the expected shape and statistics.
#include "tests/support/catch2.h"

#include <algorithm>
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
using nt::test::Approx;
using nt::test::Contains;
using nt::data::load_idx_pair;
using nt::data::read_idx_images;
using nt::data::read_idx_labels;

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
  if (gzip) write_gzip(path, bytes);
  else write_raw(path, bytes);
}

// Matches a message that holds both the file's name and the phrase that tells this fault from the others.
// (A class, not `Contains(a) && Contains(b)` returned from a function: Catch2 v2 combined matchers keep
// pointers to their parts, which would dangle.)
class NamesFileAnd : public nt::test::TextMatcher {
 public:
  NamesFileAnd(std::string path, std::string phrase) : path_(std::move(path)), phrase_(std::move(phrase)) {}
  bool match(const std::string& msg) const override {
    return msg.find(path_) != std::string::npos && msg.find(phrase_) != std::string::npos;
  }
  std::string describe() const override { return "names \"" + path_ + "\" and contains \"" + phrase_ + "\""; }

 private:
  std::string path_, phrase_;
};
NamesFileAnd names(const std::string& path, const std::string& phrase) { return {path, phrase}; }

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
  Bytes images = images_idx(4, 2, 3);   // 16-byte header + 24 pixels
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
    write_raw(p, Bytes(images.begin(), images.begin() + 10));   // magic + 6 of the 12 dimension bytes
    REQUIRE_THROWS_WITH(read_idx_images(p), names(p, "truncated header: 10 bytes, expected 16"));
    write_raw(p, Bytes(images.begin(), images.begin() + 3));
    REQUIRE_THROWS_WITH(read_idx_images(p), names(p, "truncated header: 3 bytes"));
  }
  SECTION("truncated payload, raw and gzip") {
    std::string p = dir / "short-payload";
    bool gzip = GENERATE(false, true);
    write_as(gzip, p, Bytes(images.begin(), images.end() - 5));
    REQUIRE_THROWS_WITH(read_idx_images(p), names(p, "truncated payload") && Contains("promises 24 bytes") &&
                                                Contains("found 19"));
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
    junk[2] = 0x0c;   // type 0x0c (int32), rank 3: an IDX file, but not of bytes
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
    Bytes b = {0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0x00, 0x03};   // gzip header: deflate, no flags, Unix
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
                                 "t10k-labels-idx1-ubyte (raw or .gz) in " + dir.path.string()));
  }
  SECTION("raw and gzip files mix; raw wins when both exist; statistics come from train") {
    write_raw(dir / "train-images-idx3-ubyte", train);
    write_gzip(dir / "train-images-idx3-ubyte.gz", images_idx(2, 1, 2));   // shadowed by the raw file
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
    REQUIRE(split.train.mean == 0.5f);
    REQUIRE(split.train.std == 0.5f);
    REQUIRE(split.test.mean == 0.5f);
    REQUIRE(split.test.std == 0.5f);

    auto one = nt::data::subset(split.test, 1, 2);
    REQUIRE(one.count == 2);
    REQUIRE(one.labels == Bytes{1, 2});
    REQUIRE(one.images == Bytes(split.test.images.begin() + 2, split.test.images.end()));
    REQUIRE(one.mean == 0.5f);
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
    REQUIRE(d->mean == 0.1307f);   // "mnist" uses the standard constants for both splits
    REQUIRE(d->std == 0.3081f);
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
  REQUIRE(computed.train.mean == Approx(0.1307).margin(5e-5));
  REQUIRE(computed.test.std == Approx(0.3081).margin(5e-5));
}
