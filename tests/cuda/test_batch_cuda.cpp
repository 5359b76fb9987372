// CUDA tests of the batch gather (kernels/batch.h) against the CPU twin, bit for bit (same fp32 operations, integer
// hashes shared by host and device), every output poisoned (NaN) first: plain, with random shifts, with several
// channels (per-channel normalization) and the random flip; odd planes, 1 to 4 channels, misaligned inputs and
// outputs (the scalar path), rows wider than a block, batches past the grid's y limit, a gather beside the one
// before it. And captured gathers replay with each epoch's shift or flip key, read from device memory.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/batch.h"
#include "kernels/runtime.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

// ---- batch gather --------------------------------------------------------------------------------------

// The GPU gather twice, the second beside the first (it writes other buffers, as a training step's gather runs
// beside the optimizer update), each checked against the CPU twin's x and y bit for bit, outputs poisoned.
void check_gather_twice(const Exec& gpu, const kernels::BatchSource& src, int64_t first, int B, size_t x_offset,
                        const std::vector<float>& cpu_x, const std::vector<int32_t>& cpu_y) {
  const size_t n = cpu_x.size();
  DeviceBuffer<float> d_x(gpu, padded(poisoned(n), x_offset, kPoison)),
      d_x2(gpu, padded(poisoned(n), x_offset, kPoison));
  DeviceBuffer<int32_t> d_y(gpu, std::vector<int32_t>(B, -1)), d_y2(gpu, std::vector<int32_t>(B, -1));
  kernels::gather_batch(gpu, {.src = src, .first = first, .B = B, .x = d_x.get() + x_offset, .y = d_y.get()});
  kernels::gather_batch(
      gpu,
      {.src = src, .first = first, .B = B, .x = d_x2.get() + x_offset, .y = d_y2.get(), .overlaps_previous = true});
  for (const auto* out : {&d_x, &d_x2}) {
    const auto got_x = out->download();
    REQUIRE(same_bits(got_x.data() + x_offset, cpu_x.data(), n));
    REQUIRE(std::isnan(got_x.back()));  // nothing written past the batch
    if (x_offset) REQUIRE(std::isnan(got_x.front()));
  }
  for (const auto* out : {&d_y, &d_y2}) REQUIRE(out->download() == cpu_y);
}

TEST_CASE("gather_batch on CUDA is bit-identical to the CPU twin", "[cuda][batch]") {
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  struct Case {
    int N, D, B;
    int64_t first;
    size_t image_offset, x_offset;  // bytes into the image buffer, floats into x: breaks the vector path
  };
  const Case cases[] = {{300, 784, 64, 100, 0, 0}, {300, 784, 64, 7, 0, 1},      {300, 784, 33, 0, 1, 0},
                        {50, 13, 17, 20, 0, 0},    {10000, 784, 10000, 0, 0, 0}, {5, 1, 5, 0, 0, 0}};
  for (const Case& k : cases) {
    INFO("N=" << k.N << " D=" << k.D << " B=" << k.B << " first=" << k.first << " offsets " << k.image_offset << "/"
              << k.x_offset);
    std::vector<uint8_t> images(size_t(k.N) * k.D), labels(k.N);
    std::uniform_int_distribution<int> byte(0, 255), digit(0, 9);
    for (auto& px : images) px = static_cast<uint8_t>(byte(rng()));
    for (auto& l : labels) l = static_cast<uint8_t>(digit(rng()));
    std::vector<int32_t> perm(k.N);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
    const float mean = 0.1307f, std_dev = 0.3081f;

    const size_t n = size_t(k.B) * k.D;
    std::vector<float> cpu_x(n);
    std::vector<int32_t> cpu_y(k.B);
    const kernels::BatchSource cpu_src{
        .images = images.data(), .labels = labels.data(), .perm = perm.data(), .D = k.D, .mean = mean, .std = std_dev};
    kernels::gather_batch(Exec{}, {.src = cpu_src, .first = k.first, .B = k.B, .x = cpu_x.data(), .y = cpu_y.data()});

    DeviceBuffer<uint8_t> d_images(gpu, padded(images, k.image_offset, uint8_t{0}));
    DeviceBuffer<uint8_t> d_labels(gpu, labels);
    DeviceBuffer<int32_t> d_perm(gpu, perm);
    const kernels::BatchSource src{d_images.get() + k.image_offset, d_labels.get(), d_perm.get(), k.D, mean, std_dev};
    check_gather_twice(gpu, src, k.first, k.B, k.x_offset, cpu_x, cpu_y);
  }
}

// ---- batch gather with random shifts ---------------------------------------------------------------------

// Random (C,H,W) images, labels and a permutation, uploaded; the CPU twin reads the host copies.
struct ShiftCase {
  int N, C, H, W, k, B;
  int64_t first;
  size_t x_offset;  // floats into x: a misaligned output
};

struct ShiftInputs {
  std::vector<uint8_t> images, labels;
  std::vector<int32_t> perm;
  explicit ShiftInputs(const ShiftCase& k) : images(size_t(k.N) * k.C * k.H * k.W), labels(k.N), perm(k.N) {
    std::uniform_int_distribution<int> byte(0, 255), digit(0, 9);
    for (auto& px : images) px = static_cast<uint8_t>(byte(rng()));
    for (auto& l : labels) l = static_cast<uint8_t>(digit(rng()));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
  }
};

kernels::BatchSource shift_source(const ShiftCase& k, const uint8_t* images, const uint8_t* labels, const int32_t* perm,
                                  const uint64_t* key) {
  kernels::BatchSource s{images, labels, perm, k.C * k.H * k.W, 0.1307f, 0.3081f};
  s.height = k.H, s.width = k.W, s.shift = k.k, s.shift_key = key;
  return s;
}

TEST_CASE("gather_batch with random shifts on CUDA is bit-identical to the CPU twin", "[cuda][batch][shift]") {
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  // MNIST's shape at two offsets; odd planes; channels; a shift beyond the image; one column; rows wider
  // than a block's x threads (the column loop strides); a batch past the grid's y limit (rows stride).
  const ShiftCase cases[] = {
      {300, 1, 28, 28, 2, 64, 100, 0}, {300, 1, 28, 28, 4, 64, 7, 1},      {50, 1, 7, 5, 3, 17, 20, 0},
      {40, 3, 9, 11, 1, 33, 0, 1},     {30, 1, 4, 3, 8, 25, 5, 0},         {20, 2, 13, 1, 2, 20, 0, 0},
      {40, 1, 5, 300, 3, 9, 3, 1},     {10000, 1, 28, 28, 2, 10000, 0, 0}, {70001, 1, 3, 5, 1, 70001, 0, 0}};
  for (const ShiftCase& k : cases) {
    INFO("N=" << k.N << " C=" << k.C << " H=" << k.H << " W=" << k.W << " k=" << k.k << " B=" << k.B
              << " first=" << k.first << " x offset " << k.x_offset);
    const ShiftInputs in(k);
    const uint64_t key = kernels::counter_key(rng()(), 3);
    const size_t n = size_t(k.B) * k.C * k.H * k.W;

    std::vector<float> cpu_x = poisoned(n);
    std::vector<int32_t> cpu_y(k.B, -1);
    kernels::gather_batch(Exec{}, {.src = shift_source(k, in.images.data(), in.labels.data(), in.perm.data(), &key),
                                   .first = k.first,
                                   .B = k.B,
                                   .x = cpu_x.data(),
                                   .y = cpu_y.data()});

    DeviceBuffer<uint8_t> d_images(gpu, in.images), d_labels(gpu, in.labels);
    DeviceBuffer<int32_t> d_perm(gpu, in.perm);
    DeviceBuffer<uint64_t> d_key(gpu, std::vector<uint64_t>{key});
    check_gather_twice(gpu, shift_source(k, d_images.get(), d_labels.get(), d_perm.get(), d_key.get()), k.first, k.B,
                       k.x_offset, cpu_x, cpu_y);
  }
}

TEST_CASE("a captured shifted gather reads each epoch's key from device memory on replay", "[cuda][batch][shift]") {
  CudaExec cuda;
  Exec capture_exec = cuda.exec;
  capture_exec.debug_sync = false;  // synchronizing is what a capture forbids
  const ShiftCase k{256, 1, 28, 28, 2, 64, 64, 0};
  const ShiftInputs in(k);
  const size_t n = size_t(k.B) * k.C * k.H * k.W;
  const uint64_t seed = 77;

  DeviceBuffer<uint8_t> d_images(cuda.exec, in.images), d_labels(cuda.exec, in.labels);
  DeviceBuffer<int32_t> d_perm(cuda.exec, in.perm);
  DeviceBuffer<uint64_t> d_key(cuda.exec, std::vector<uint64_t>{kernels::counter_key(seed, 0)});
  DeviceBuffer<float> d_x(cuda.exec, poisoned(n));
  DeviceBuffer<int32_t> d_y(cuda.exec, std::vector<int32_t>(k.B, -1));
  const auto src = shift_source(k, d_images.get(), d_labels.get(), d_perm.get(), d_key.get());
  kernels::Graph graph = kernels::Graph::capture(capture_exec, [&] {
    kernels::gather_batch(capture_exec, {.src = src, .first = k.first, .B = k.B, .x = d_x.get(), .y = d_y.get()});
  });
  REQUIRE(graph.node_count() == 1);

  std::vector<float> previous;
  for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
    INFO("epoch " << epoch);
    const uint64_t key = kernels::counter_key(seed, epoch);
    d_key.upload({key});  // what DeviceBatcher::begin_epoch does, once per epoch
    graph.launch(capture_exec);
    std::vector<float> cpu_x = poisoned(n);
    std::vector<int32_t> cpu_y(k.B, -1);
    kernels::gather_batch(Exec{}, {.src = shift_source(k, in.images.data(), in.labels.data(), in.perm.data(), &key),
                                   .first = k.first,
                                   .B = k.B,
                                   .x = cpu_x.data(),
                                   .y = cpu_y.data()});
    const auto got_x = d_x.download();
    REQUIRE(same_bits(got_x, cpu_x));
    REQUIRE(d_y.download() == cpu_y);
    REQUIRE(!same_bits(got_x, previous));  // fresh shifts every epoch
    previous = got_x;
  }
}

// ---- several channels, flip and shift -----------------------------------------------------------------------

const float kMean[4] = {0.4914f, 0.4822f, 0.4465f, 0.1307f};
const float kStd[4] = {0.2470f, 0.2435f, 0.2616f, 0.3081f};

struct AugmentCase {
  int N, C, H, W, k;
  bool flip;
  int B;
  int64_t first;
  size_t image_offset, x_offset;  // bytes into the images, floats into x: off the vector path
};

struct AugmentInputs {
  std::vector<uint8_t> images, labels;
  std::vector<int32_t> perm;
  explicit AugmentInputs(const AugmentCase& k) : images(size_t(k.N) * k.C * k.H * k.W), labels(k.N), perm(k.N) {
    std::uniform_int_distribution<int> byte(0, 255), digit(0, 9);
    for (auto& px : images) px = static_cast<uint8_t>(byte(rng()));
    for (auto& l : labels) l = static_cast<uint8_t>(digit(rng()));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
  }
};

kernels::BatchSource augment_source(const AugmentCase& k, const uint8_t* images, const uint8_t* labels,
                                    const int32_t* perm, const uint64_t* keys) {
  return {.images = images,
          .labels = labels,
          .perm = perm,
          .D = k.C * k.H * k.W,
          .mean = kernels::ChannelValues(kMean, k.C),
          .std = kernels::ChannelValues(kStd, k.C),
          .height = k.H,
          .width = k.W,
          .shift = k.k,
          .shift_key = keys,
          .flip = k.flip,
          .flip_key = keys + 1};
}

// A host vector placed `offset` elements into a buffer whose other elements hold `pad`.
template <class T>
std::vector<T> placed(const std::vector<T>& v, size_t offset, T pad) {
  std::vector<T> out(v.size() + offset + 1, pad);
  std::copy(v.begin(), v.end(), out.begin() + static_cast<long>(offset));
  return out;
}

}  // namespace

TEST_CASE("gather_batch with channels, flip and shift on CUDA is bit-identical to the CPU twin",
          "[cuda][batch][flip]") {
  CudaExec cuda;
  const Exec& gpu = cuda.exec;
  // Per-channel plain gathers (vector path, then misaligned x, misaligned images, an odd plane); flip alone; flip
  // with shifts; 4 channels in rows wider than a block; one column; MNIST's shape; past the grid's y limit.
  const AugmentCase cases[] = {{300, 3, 32, 32, 0, false, 64, 100, 0, 0}, {300, 3, 32, 32, 0, false, 33, 7, 0, 1},
                               {300, 3, 32, 32, 0, false, 17, 0, 1, 0},   {50, 3, 5, 7, 0, false, 17, 20, 0, 0},
                               {300, 3, 32, 32, 0, true, 64, 100, 0, 0},  {90, 3, 7, 5, 2, true, 90, 0, 0, 1},
                               {40, 4, 3, 300, 3, true, 9, 3, 0, 1},      {20, 2, 13, 1, 2, true, 20, 0, 0, 0},
                               {60, 2, 4, 9, 12, true, 41, 19, 0, 0},     {10000, 1, 28, 28, 2, true, 10000, 0, 0, 0},
                               {70001, 3, 2, 3, 1, true, 70001, 0, 0, 0}};
  for (const AugmentCase& k : cases) {
    INFO("N=" << k.N << " C=" << k.C << " H=" << k.H << " W=" << k.W << " k=" << k.k << " flip=" << k.flip
              << " B=" << k.B << " first=" << k.first << " offsets " << k.image_offset << "/" << k.x_offset);
    const AugmentInputs in(k);
    const std::vector<uint64_t> keys{kernels::counter_key(rng()(), 3), kernels::counter_key(rng()(), 3)};
    const size_t n = size_t(k.B) * k.C * k.H * k.W;

    std::vector<float> cpu_x = poisoned(n);
    std::vector<int32_t> cpu_y(size_t(k.B), -1);
    kernels::gather_batch(Exec{},
                          {.src = augment_source(k, in.images.data(), in.labels.data(), in.perm.data(), keys.data()),
                           .first = k.first,
                           .B = k.B,
                           .x = cpu_x.data(),
                           .y = cpu_y.data()});
    REQUIRE(std::none_of(cpu_x.begin(), cpu_x.end(), [](float v) { return std::isnan(v); }));

    DeviceBuffer<uint8_t> d_images(gpu, placed(in.images, k.image_offset, uint8_t{0})), d_labels(gpu, in.labels);
    DeviceBuffer<int32_t> d_perm(gpu, in.perm);
    DeviceBuffer<uint64_t> d_keys(gpu, keys);
    const auto src = augment_source(k, d_images.get() + k.image_offset, d_labels.get(), d_perm.get(), d_keys.get());
    DeviceBuffer<float> d_x(gpu, placed(poisoned(n), k.x_offset, kPoison));
    DeviceBuffer<int32_t> d_y(gpu, std::vector<int32_t>(size_t(k.B), -1));
    for (bool overlap : {false, true}) {
      INFO("overlaps_previous " << overlap);
      kernels::gather_batch(gpu, {.src = src,
                                  .first = k.first,
                                  .B = k.B,
                                  .x = d_x.get() + k.x_offset,
                                  .y = d_y.get(),
                                  .overlaps_previous = overlap});
      const auto got_x = d_x.download();
      REQUIRE(same_bits(got_x.data() + k.x_offset, cpu_x.data(), n));
      REQUIRE(std::isnan(got_x.back()));  // nothing written past the batch
      if (k.x_offset) REQUIRE(std::isnan(got_x.front()));
      REQUIRE(d_y.download() == cpu_y);
      d_x.upload(placed(poisoned(n), k.x_offset, kPoison));
      d_y.upload(std::vector<int32_t>(size_t(k.B), -1));
    }
  }
}

TEST_CASE("a captured flipped gather reads each epoch's flip key from device memory on replay", "[cuda][batch][flip]") {
  CudaExec cuda;
  Exec capture_exec = cuda.exec;
  capture_exec.debug_sync = false;  // synchronizing is what a capture forbids
  const AugmentCase k{256, 3, 32, 32, 2, true, 64, 64, 0, 0};
  const AugmentInputs in(k);
  const size_t n = size_t(k.B) * k.C * k.H * k.W;
  const uint64_t seed = 78;
  auto keys_of = [&](uint64_t epoch) {
    return std::vector<uint64_t>{kernels::counter_key(seed, epoch), kernels::counter_key(seed + 1, epoch)};
  };

  DeviceBuffer<uint8_t> d_images(cuda.exec, in.images), d_labels(cuda.exec, in.labels);
  DeviceBuffer<int32_t> d_perm(cuda.exec, in.perm);
  DeviceBuffer<uint64_t> d_keys(cuda.exec, keys_of(0));
  DeviceBuffer<float> d_x(cuda.exec, poisoned(n));
  DeviceBuffer<int32_t> d_y(cuda.exec, std::vector<int32_t>(size_t(k.B), -1));
  const auto src = augment_source(k, d_images.get(), d_labels.get(), d_perm.get(), d_keys.get());
  kernels::Graph graph = kernels::Graph::capture(capture_exec, [&] {
    kernels::gather_batch(capture_exec, {.src = src, .first = k.first, .B = k.B, .x = d_x.get(), .y = d_y.get()});
  });
  REQUIRE(graph.node_count() == 1);

  std::vector<float> previous;
  for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
    INFO("epoch " << epoch);
    const auto keys = keys_of(epoch);
    d_keys.upload(keys);  // what DeviceBatcher::begin_epoch does, once per epoch
    graph.launch(capture_exec);
    std::vector<float> cpu_x = poisoned(n);
    std::vector<int32_t> cpu_y(size_t(k.B), -1);
    kernels::gather_batch(Exec{},
                          {.src = augment_source(k, in.images.data(), in.labels.data(), in.perm.data(), keys.data()),
                           .first = k.first,
                           .B = k.B,
                           .x = cpu_x.data(),
                           .y = cpu_y.data()});
    const auto got_x = d_x.download();
    REQUIRE(same_bits(got_x, cpu_x));
    REQUIRE(d_y.download() == cpu_y);
    REQUIRE(!same_bits(got_x, previous));  // fresh draws every epoch
    previous = got_x;
  }
}

}  // namespace nt::test
