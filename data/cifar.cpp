// CIFAR-10 binary batches: check the length is a whole number of 3073-byte records before allocating, read the
// records, split each into its label and its (already planar) image; the folder loader joins the five train batches
// and reads the test batch and the class names. Every check names the file.
#include "data/cifar.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <utility>

#include "core/error.h"

namespace nt::data {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxBatchBytes = uint64_t(1) << 32;  // 4 GiB: a real batch is 30 MB
constexpr int64_t kRecordsPerRead = 1024;               // ~3 MB of records per fread

constexpr const char* kTrainFiles[5] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                                        "data_batch_5.bin"};
constexpr const char* kTestFile = "test_batch.bin";
constexpr const char* kMetaFile = "batches.meta.txt";

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error(cat("CIFAR-10 batch file '", path, "': ", what));
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

// Appends `from`'s records to `to`.
void append(CifarBatch& to, CifarBatch&& from) {
  if (to.count == 0) {
    to = std::move(from);
    return;
  }
  to.images.insert(to.images.end(), from.images.begin(), from.images.end());
  to.labels.insert(to.labels.end(), from.labels.begin(), from.labels.end());
  to.count += from.count;
}

// Labels must be below `classes`; the message names the file, the record, the label and the class count.
void check_labels(const CifarBatch& b, int classes, const std::string& path, bool test) {
  for (int64_t i = 0; i < b.count; ++i) {
    const int label = b.labels[size_t(i)];
    if (label < classes) continue;
    if (test)
      fail(path, cat("test label ", label, " at record ", i, " is outside the trained range 0..", classes - 1, " (",
                     classes, " classes)"));
    fail(path, cat("label out of range at record ", i, ": value ", label, ", expected 0..", classes - 1, " (", classes,
                   " classes)"));
  }
}

}  // namespace

CifarBatch read_cifar10_batch(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path, "file not found");
  if (fs::is_directory(path, ec)) fail(path, "is a directory, not a file");
  std::unique_ptr<FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) fail(path, cat("cannot open: ", std::strerror(errno)));
  const uint64_t size = fs::file_size(path, ec);
  if (ec) fail(path, cat("cannot read its size: ", ec.message()));
  if (size == 0) fail(path, "empty file");
  if (size % kCifarRecordBytes != 0)
    fail(path, cat("length ", size, " is not a multiple of the ", kCifarRecordBytes, "-byte record (1 label byte + ",
                   kCifarImageBytes, " pixel bytes): ", size / kCifarRecordBytes, " records and ",
                   size % kCifarRecordBytes, " bytes over"));
  if (size > kMaxBatchBytes) fail(path, cat("absurd size ", size, " bytes (limit ", kMaxBatchBytes, ")"));

  CifarBatch batch;
  batch.count = static_cast<int64_t>(size / kCifarRecordBytes);
  std::vector<uint8_t> records;
  try {
    batch.images.resize(size_t(batch.count * kCifarImageBytes));
    batch.labels.resize(size_t(batch.count));
    records.resize(size_t(std::min(batch.count, kRecordsPerRead) * kCifarRecordBytes));
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(cat("CIFAR-10 batch file '", path, "': out of memory holding its ", size, " bytes"));
  }
  for (int64_t first = 0; first < batch.count; first += kRecordsPerRead) {
    const int64_t n = std::min(kRecordsPerRead, batch.count - first);
    const size_t want = size_t(n * kCifarRecordBytes);
    const size_t got = std::fread(records.data(), 1, want, file.get());
    if (std::ferror(file.get())) fail(path, cat("read error: ", std::strerror(errno)));
    if (got < want)
      fail(path,
           cat("truncated while reading: ", uint64_t(first * kCifarRecordBytes) + got, " of its ", size, " bytes"));
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* record = records.data() + i * kCifarRecordBytes;  // label, then R, G, B planes
      const int64_t r = first + i;
      if (record[0] >= kCifarClasses)
        fail(path,
             cat("label out of range at record ", r, ": value ", int(record[0]), ", expected 0..", kCifarClasses - 1));
      batch.labels[size_t(r)] = record[0];
      std::memcpy(batch.images.data() + r * kCifarImageBytes, record + 1, size_t(kCifarImageBytes));
    }
  }
  return batch;
}

std::vector<std::string> read_cifar10_class_names(const std::string& path) {
  auto meta_fail = [&](const std::string& what) { throw Error(cat("CIFAR-10 meta file '", path, "': ", what)); };
  std::error_code ec;
  if (!fs::exists(path, ec)) meta_fail("file not found");
  if (fs::is_directory(path, ec)) meta_fail("is a directory, not a file");
  std::ifstream in(path);
  if (!in) meta_fail(cat("cannot open: ", std::strerror(errno)));
  std::vector<std::string> names;
  std::string line;
  constexpr size_t kMaxLine = 256;  // a class name, not a blob: anything longer is the wrong file
  while (names.size() <= size_t(kCifarClasses) && std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    if (line.empty()) continue;
    if (line.size() > kMaxLine) meta_fail(cat("a line of ", line.size(), " characters is no class name"));
    names.push_back(line);
  }
  if (in.bad()) meta_fail("read error");
  if (names.size() > size_t(kCifarClasses)) meta_fail(cat("more than ", kCifarClasses, " class names"));
  if (names.size() < size_t(kCifarClasses))
    meta_fail(cat(names.size(), " class names, expected ", kCifarClasses, " (one per line)"));
  return names;
}

DatasetSplit load_cifar10_dir(const std::string& dir, int classes) {
  const std::string name = "cifar10";
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(cat("dataset '", name, "': folder ", dir, " does not exist; scripts/fetch-data cifar10 fetches it"));
  if (classes < 0 || classes > 256)
    throw Error(cat("dataset '", name, "': ", classes, " classes; byte labels allow 1 to 256 (0: from the data)"));
  const int class_count = classes == 0 ? kCifarClasses : classes;

  std::string missing;
  for (const char* f : kTrainFiles)
    if (!fs::is_regular_file(fs::path(dir) / f, ec)) missing += cat(missing.empty() ? "" : ", ", f);
  if (!fs::is_regular_file(fs::path(dir) / kTestFile, ec)) missing += cat(missing.empty() ? "" : ", ", kTestFile);
  if (!missing.empty())
    throw Error(cat("dataset '", name, "': missing ", missing, " in ", dir,
                    " (the CIFAR-10 binary version); scripts/fetch-data cifar10 fetches it"));

  CifarBatch train;
  for (const char* f : kTrainFiles) {
    const std::string path = (fs::path(dir) / f).string();
    CifarBatch part = read_cifar10_batch(path);
    check_labels(part, class_count, path, false);
    append(train, std::move(part));
  }
  const std::string test_path = (fs::path(dir) / kTestFile).string();
  CifarBatch test = read_cifar10_batch(test_path);
  check_labels(test, class_count, test_path, true);

  std::vector<std::string> class_names;
  const fs::path meta = fs::path(dir) / kMetaFile;
  if (fs::exists(meta, ec)) class_names = read_cifar10_class_names(meta.string());
  if (class_names.size() != size_t(class_count)) class_names.clear();

  DatasetSplit split;
  for (auto [part, batch] : {std::pair{&split.train, &train}, std::pair{&split.test, &test}}) {
    part->name = name;
    part->count = batch->count;
    part->channels = kCifarChannels;
    part->rows = part->cols = kCifarSide;
    part->classes = class_count;
    part->images = std::move(batch->images);
    part->labels = std::move(batch->labels);
    part->class_names = class_names;
  }
  set_normalization(split, dir);
  return split;
}

}  // namespace nt::data
