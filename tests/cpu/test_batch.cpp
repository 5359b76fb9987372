// CPU tests of the batch gather (kernels/batch.h), every value checked bit for bit against the exact fp32 formula
// (the op is specified to the bit), on one thread and on a pool:
//   - gather_batch is ToTensor then Normalize of the permuted rows; with random shifts each image is translated by
//     its drawn (dy, dx), zero-filled, the draws reproducible per (seed, epoch) and uniform over [-k, k];
//   - several channels (per-channel normalization) and the random left-right flip, against the contract of
//     kernels/batch.h written out here (flip first, then shift; black outside), the draws reproducible per key and
//     independent of each other; DeviceBatcher's flip option: off is the plain gather, on is reproducible per
//     (seed, epoch) whatever the batch size, and adding it leaves the shifts as they were.
// The statistical checks of the draws allow 4 to 6 standard deviations (each says which).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include "data/batcher.h"
#include "data/dataset.h"
#include "engine/context.h"
#include "kernels/batch.h"
#include "kernels/cpu/thread_pool.h"
#include "support/test_support.h"

namespace nt::test {
namespace {

using kernels::Exec;

// ---- batch gather --------------------------------------------------------------------------------------

struct SyntheticData {
  int N, D;
  std::vector<uint8_t> images, labels;
  std::vector<int32_t> perm;
  SyntheticData(int n, int d) : N(n), D(d), images(size_t(n) * d), labels(n), perm(n) {
    std::uniform_int_distribution<int> byte(0, 255), digit(0, 9);
    for (auto& px : images) px = static_cast<uint8_t>(byte(rng()));
    for (auto& l : labels) l = static_cast<uint8_t>(digit(rng()));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
  }
  kernels::BatchSource source() const {
    return {
        .images = images.data(), .labels = labels.data(), .perm = perm.data(), .D = D, .mean = 0.1307f, .std = 0.3081f};
  }
};

TEST_CASE("gather_batch is exactly ToTensor then Normalize of the permuted rows", "[cpu][batch]") {
  CpuExecs execs;
  struct Case {
    int N, D, B;
    int64_t first;
  };
  const Case cases[] = {{50, 784, 17, 10}, {50, 13, 7, 43}, {200, 784, 64, 128}, {3, 1, 3, 0}};
  for (const Case& k : cases)
    for (const Exec* exec : {&execs.serial, &execs.pooled}) {
      INFO("N=" << k.N << " D=" << k.D << " B=" << k.B << " first=" << k.first);
      SyntheticData data(k.N, k.D);
      std::vector<float> x = poisoned(size_t(k.B) * k.D);
      std::vector<int32_t> y(k.B, -1);
      kernels::gather_batch(*exec, {.src = data.source(), .first = k.first, .B = k.B, .x = x.data(), .y = y.data()});

      const float mean = 0.1307f, std_dev = 0.3081f;
      for (int b = 0; b < k.B; ++b) {
        int32_t r = data.perm[k.first + b];
        REQUIRE(y[b] == data.labels[r]);
        for (int d = 0; d < k.D; ++d) {
          float want = (float(data.images[size_t(r) * k.D + d]) / 255.0f - mean) / std_dev;
          REQUIRE(x[size_t(b) * k.D + d] == want);  // bit-exact: the same three fp32 operations
        }
      }
    }
}

// ---- batch gather with random shifts ---------------------------------------------------------------------

constexpr float kShiftMean = 0.1307f, kShiftStd = 0.3081f;  // the normalization of the shift tests (MNIST's)

// Synthetic (C,H,W) images with pixels in [1, 255], so that no source pixel equals the zero fill and a
// translation is recognisable from its output alone.
struct ShiftData {
  int N, C, H, W, D;
  std::vector<uint8_t> images, labels;
  std::vector<int32_t> perm;
  ShiftData(int n, int c, int h, int w)
      : N(n), C(c), H(h), W(w), D(c * h * w), images(size_t(n) * D), labels(n), perm(n) {
    std::uniform_int_distribution<int> byte(1, 255), digit(0, 9);
    for (auto& px : images) px = static_cast<uint8_t>(byte(rng()));
    for (auto& l : labels) l = static_cast<uint8_t>(digit(rng()));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
  }
  kernels::BatchSource source(int k, const uint64_t* key) const {
    kernels::BatchSource s{.images = images.data(),
                           .labels = labels.data(),
                           .perm = perm.data(),
                           .D = D,
                           .mean = kShiftMean,
                           .std = kShiftStd};
    s.height = H, s.width = W, s.shift = k, s.shift_key = key;
    return s;
  }
};

bool same_shift(kernels::PixelShift a, kernels::PixelShift b) { return a.dy == b.dy && a.dx == b.dx; }

TEST_CASE("gather_batch with shift 0 is the plain gather, bit for bit", "[cpu][batch][shift]") {
  CpuExecs execs;
  for (const Exec* exec : {&execs.serial, &execs.pooled}) {
    ShiftData data(100, 1, 28, 28);
    const int B = 37;
    const int64_t first = 50;
    const uint64_t key = kernels::counter_key(7, 3);
    std::vector<float> plain = poisoned(size_t(B) * data.D), unshifted = poisoned(size_t(B) * data.D);
    std::vector<int32_t> y_plain(B, -1), y_unshifted(B, -1);
    kernels::BatchSource src{.images = data.images.data(),
                             .labels = data.labels.data(),
                             .perm = data.perm.data(),
                             .D = data.D,
                             .mean = kShiftMean,
                             .std = kShiftStd};
    kernels::gather_batch(*exec, {.src = src, .first = first, .B = B, .x = plain.data(), .y = y_plain.data()});
    kernels::gather_batch(
        *exec, {.src = data.source(0, &key), .first = first, .B = B, .x = unshifted.data(), .y = y_unshifted.data()});
    REQUIRE(same_bits(plain, unshifted));
    REQUIRE(y_plain == y_unshifted);
    kernels::gather_batch(
        *exec,
        {.src = data.source(0, nullptr), .first = first, .B = B, .x = unshifted.data(), .y = y_unshifted.data()});
    REQUIRE(same_bits(plain, unshifted));  // the key is not even read
  }
}

TEST_CASE("gather_batch with shift k translates each image by its drawn (dy, dx), zero-filled", "[cpu][batch][shift]") {
  CpuExecs execs;
  struct Case {
    int N, C, H, W, k, B;
    int64_t first;
  };
  // MNIST's shape; odd and non-square planes; several channels; a shift beyond the image (k > H, W);
  // a one-column image; a batch spanning several CPU tasks.
  const Case cases[] = {{120, 1, 28, 28, 2, 64, 30}, {60, 1, 7, 5, 3, 33, 17}, {40, 3, 9, 11, 1, 40, 0},
                        {30, 1, 4, 3, 8, 25, 5},     {20, 2, 13, 1, 2, 20, 0}, {300, 1, 6, 6, 4, 250, 50}};
  for (const Case& k : cases)
    for (const Exec* exec : {&execs.serial, &execs.pooled}) {
      INFO("N=" << k.N << " C=" << k.C << " H=" << k.H << " W=" << k.W << " k=" << k.k << " B=" << k.B
                << " first=" << k.first);
      ShiftData data(k.N, k.C, k.H, k.W);
      const uint64_t key = kernels::counter_key(rng()(), 1);
      std::vector<float> x = poisoned(size_t(k.B) * data.D);
      std::vector<int32_t> y(k.B, -1);
      kernels::gather_batch(*exec,
                            {.src = data.source(k.k, &key), .first = k.first, .B = k.B, .x = x.data(), .y = y.data()});

      for (int b = 0; b < k.B; ++b) {
        const int32_t r = data.perm[k.first + b];
        REQUIRE(y[b] == data.labels[r]);
        const kernels::PixelShift drawn = kernels::batch_shift(key, uint64_t(k.first + b), k.k);
        REQUIRE(std::abs(drawn.dy) <= k.k);
        REQUIRE(std::abs(drawn.dx) <= k.k);
        const auto found = matching_shifts(&data.images[size_t(r) * data.D], k.C, k.H, k.W, k.k, kShiftMean, kShiftStd,
                                           &x[size_t(b) * data.D]);
        INFO("b=" << b << " drawn (" << drawn.dy << ", " << drawn.dx << ")");
        REQUIRE(!found.empty());  // some translation in range explains the output exactly
        REQUIRE(std::any_of(found.begin(), found.end(), [&](kernels::PixelShift s) { return same_shift(s, drawn); }));
      }
    }
}

TEST_CASE("the shifts differ across examples and epochs and repeat for the same (seed, epoch)", "[cpu][batch][shift]") {
  CpuExecs execs;
  ShiftData data(500, 1, 12, 10);
  const int k = 2, B = 500;
  const uint64_t seed = 1234;
  auto gather = [&](const Exec& exec, uint64_t epoch) {
    const uint64_t key = kernels::counter_key(seed, epoch);
    std::vector<float> x = poisoned(size_t(B) * data.D);
    std::vector<int32_t> y(B, -1);
    kernels::gather_batch(exec, {.src = data.source(k, &key), .first = 0, .B = B, .x = x.data(), .y = y.data()});
    return x;
  };
  // The shift of each example, recovered from the output alone (pixels >= 1 make it unique here).
  auto shifts_of = [&](const std::vector<float>& x) {
    std::vector<kernels::PixelShift> s;
    for (int b = 0; b < B; ++b) {
      auto found = matching_shifts(&data.images[size_t(data.perm[b]) * data.D], data.C, data.H, data.W, k, kShiftMean,
                                   kShiftStd, &x[size_t(b) * data.D]);
      REQUIRE(found.size() == 1);
      s.push_back(found[0]);
    }
    return s;
  };
  const auto epoch1 = gather(execs.serial, 1);
  REQUIRE(same_bits(epoch1, gather(execs.serial, 1)));  // reproducible
  REQUIRE(same_bits(epoch1, gather(execs.pooled, 1)));  // whatever the thread count
  const auto s1 = shifts_of(epoch1), s2 = shifts_of(gather(execs.serial, 2));

  // Across examples: 500 draws cover every value of dy and of dx and most of the 25 pairs.
  int dy_seen[2 * k + 1] = {}, dx_seen[2 * k + 1] = {};
  std::vector<int> pairs;
  for (const auto& s : s1) {
    ++dy_seen[s.dy + k], ++dx_seen[s.dx + k];
    pairs.push_back((s.dy + k) * (2 * k + 1) + s.dx + k);
  }
  for (int v = 0; v <= 2 * k; ++v) CHECK((dy_seen[v] > 0 && dx_seen[v] > 0));
  std::sort(pairs.begin(), pairs.end());
  CHECK(std::unique(pairs.begin(), pairs.end()) - pairs.begin() >= 20);

  // Across epochs: the same positions get other shifts (equal by chance with probability 1/25 each).
  int same = 0;
  for (int b = 0; b < B; ++b) same += same_shift(s1[b], s2[b]) ? 1 : 0;
  CHECK(same < B / 5);
}

TEST_CASE("batch_shift draws each offset uniformly from [-k, k]", "[cpu][batch][shift]") {
  for (int k : {1, 2, 8}) {
    const int n = 2 * k + 1, draws = 200000;
    std::vector<int> dy(n), dx(n);
    const uint64_t key = kernels::counter_key(99, uint64_t(k));
    for (int p = 0; p < draws; ++p) {
      const auto s = kernels::batch_shift(key, uint64_t(p), k);
      REQUIRE((s.dy >= -k && s.dy <= k && s.dx >= -k && s.dx <= k));
      ++dy[s.dy + k], ++dx[s.dx + k];
    }
    // Each count is binomial with mean draws/n and sd below sqrt(draws/n); 6 sd never fails by chance.
    const double mean = double(draws) / n, bound = 6 * std::sqrt(mean);
    for (int v = 0; v < n; ++v) {
      INFO("k=" << k << " offset " << v - k);
      CHECK(std::abs(dy[v] - mean) < bound);
      CHECK(std::abs(dx[v] - mean) < bound);
    }
  }
}

}  // namespace

// ---- several channels and the random flip -----------------------------------------------------------------

namespace {

// Distinct per channel, none of them MNIST's, so that a channel read with another's values shows.
const float kMean[4] = {0.4914f, 0.4822f, 0.4465f, 0.1307f};
const float kStd[4] = {0.2470f, 0.2435f, 0.2616f, 0.3081f};

float norm(uint8_t px, int c) { return (float(px) / 255.0f - kMean[c]) / kStd[c]; }

// The contract: image (C,H,W) mirrored when f, then translated by s, black outside, normalized per channel.
std::vector<float> expected(const uint8_t* image, int C, int H, int W, kernels::PixelShift s, bool f) {
  std::vector<float> out(size_t(C) * H * W);
  for (int c = 0; c < C; ++c)
    for (int i = 0; i < H; ++i)
      for (int j = 0; j < W; ++j) {
        const int si = i - s.dy, sj = j - s.dx;
        const bool inside = si >= 0 && si < H && sj >= 0 && sj < W;
        const uint8_t px = inside ? image[(size_t(c) * H + si) * W + (f ? W - 1 - sj : sj)] : uint8_t{0};
        out[(size_t(c) * H + i) * W + j] = norm(px, c);
      }
  return out;
}

// Random (C,H,W) images with pixels in [1, 255] (none equals the black fill), labels, a permutation.
struct Images {
  int N, C, H, W, D;
  std::vector<uint8_t> images, labels;
  std::vector<int32_t> perm;
  Images(int n, int c, int h, int w) : N(n), C(c), H(h), W(w), D(c * h * w), images(size_t(n) * D), labels(n), perm(n) {
    std::uniform_int_distribution<int> byte(1, 255), digit(0, 9);
    for (auto& px : images) px = static_cast<uint8_t>(byte(rng()));
    for (auto& l : labels) l = static_cast<uint8_t>(digit(rng()));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
  }
  kernels::BatchSource source(int k, const uint64_t* shift_key, bool flip, const uint64_t* flip_key) const {
    return {.images = images.data(),
            .labels = labels.data(),
            .perm = perm.data(),
            .D = D,
            .mean = kernels::ChannelValues(kMean, C),
            .std = kernels::ChannelValues(kStd, C),
            .height = H,
            .width = W,
            .shift = k,
            .shift_key = shift_key,
            .flip = flip,
            .flip_key = flip_key};
  }
  const uint8_t* image(int64_t r) const { return &images[size_t(r) * D]; }
};

using Batch = GatheredEpoch;  // x (B, D), y (B)

Batch gather(const Exec& exec, const kernels::BatchSource& src, int64_t first, int B) {
  Batch g{poisoned(size_t(B) * src.D), std::vector<int32_t>(size_t(B), -1)};
  kernels::gather_batch(exec, {.src = src, .first = first, .B = B, .x = g.x.data(), .y = g.y.data()});
  return g;
}

bool same_image(const float* got, const std::vector<float>& want) {
  return std::memcmp(got, want.data(), want.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("gather_batch normalizes each channel with its own mean and std, bit for bit", "[cpu][data][batch]") {
  CpuExecs execs;
  struct Case {
    int N, C, H, W, B;
    int64_t first;
  };
  // CIFAR's shape; odd planes; 2 and 4 channels; a batch spanning several CPU tasks.
  const Case cases[] = {{40, 3, 32, 32, 17, 5}, {30, 3, 5, 7, 30, 0}, {20, 2, 1, 9, 11, 9}, {100, 4, 3, 3, 70, 30}};
  for (const Case& k : cases)
    for (const Exec* exec : {&execs.serial, &execs.pooled}) {
      INFO("N=" << k.N << " C=" << k.C << " H=" << k.H << " W=" << k.W << " B=" << k.B << " first=" << k.first);
      const Images data(k.N, k.C, k.H, k.W);
      const Batch g = gather(*exec, data.source(0, nullptr, false, nullptr), k.first, k.B);
      for (int b = 0; b < k.B; ++b) {
        const int32_t r = data.perm[size_t(k.first + b)];
        REQUIRE(g.y[size_t(b)] == data.labels[size_t(r)]);
        REQUIRE(same_image(&g.x[size_t(b) * data.D], expected(data.image(r), k.C, k.H, k.W, {}, false)));
      }
    }
}

TEST_CASE("gather_batch with flip mirrors the examples its hash bit picks, then shifts them", "[cpu][data][batch]") {
  CpuExecs execs;
  struct Case {
    int N, C, H, W, k, B;
    int64_t first;
  };
  // Flip alone and with shifts; CIFAR's shape; odd and one-column planes; a shift beyond the image.
  const Case cases[] = {{200, 1, 28, 28, 0, 150, 20}, {80, 3, 32, 32, 0, 64, 16}, {90, 3, 7, 5, 2, 90, 0},
                        {60, 2, 4, 9, 3, 33, 27},     {30, 1, 6, 1, 1, 30, 0},    {40, 3, 3, 4, 6, 40, 0}};
  for (const Case& k : cases)
    for (const Exec* exec : {&execs.serial, &execs.pooled}) {
      INFO("N=" << k.N << " C=" << k.C << " H=" << k.H << " W=" << k.W << " k=" << k.k << " B=" << k.B
                << " first=" << k.first);
      const Images data(k.N, k.C, k.H, k.W);
      const uint64_t shift_key = kernels::counter_key(rng()(), 1), flip_key = kernels::counter_key(rng()(), 1);
      const Batch g = gather(*exec, data.source(k.k, &shift_key, true, &flip_key), k.first, k.B);
      int flipped = 0;
      for (int b = 0; b < k.B; ++b) {
        const int32_t r = data.perm[size_t(k.first + b)];
        const uint64_t p = uint64_t(k.first + b);
        const bool f = kernels::batch_flip(flip_key, p);
        const kernels::PixelShift s = k.k > 0 ? kernels::batch_shift(shift_key, p, k.k) : kernels::PixelShift{};
        flipped += f;
        INFO("b=" << b << " flip " << f << " shift (" << s.dy << ", " << s.dx << ")");
        REQUIRE(g.y[size_t(b)] == data.labels[size_t(r)]);
        REQUIRE(same_image(&g.x[size_t(b) * data.D], expected(data.image(r), k.C, k.H, k.W, s, f)));
      }
      if (k.B >= 64) {  // about half of them: [B/4, 3B/4] is 4 standard deviations either side at B = 64
        CHECK(flipped > k.B / 4);
        CHECK(flipped < 3 * k.B / 4);
      }
    }
}

TEST_CASE("flip draws repeat for the same key, change with the epoch and do not move the shifts",
          "[cpu][data][batch]") {
  CpuExecs execs;
  const Images data(300, 3, 6, 8);
  const uint64_t seed = 99;
  auto flips = [](uint64_t key, int n) {
    std::vector<bool> f;
    for (int p = 0; p < n; ++p) f.push_back(kernels::batch_flip(key, uint64_t(p)));
    return f;
  };
  const uint64_t key1 = kernels::counter_key(seed, 1), key2 = kernels::counter_key(seed, 2);
  const auto f1 = flips(key1, 300), f2 = flips(key2, 300);
  const auto differing = std::inner_product(f1.begin(), f1.end(), f2.begin(), 0, std::plus<>(), std::not_equal_to<>());
  CHECK(differing > 100);  // two epochs: about half the examples flip differently
  CHECK(differing < 200);

  const uint64_t shift_key = kernels::counter_key(seed + 1, 1);
  const Batch a = gather(execs.serial, data.source(2, &shift_key, true, &key1), 0, 300);
  REQUIRE(same_bits(a.x, gather(execs.pooled, data.source(2, &shift_key, true, &key1), 0, 300).x));  // any threads
  // Cut into batches of 7 (the draws depend on the position in the epoch's order, not on the batch).
  std::vector<float> cut;
  for (int first = 0; first < 300; first += 7) {
    const Batch part = gather(execs.serial, data.source(2, &shift_key, true, &key1), first, std::min(7, 300 - first));
    cut.insert(cut.end(), part.x.begin(), part.x.end());
  }
  REQUIRE(same_bits(a.x, cut));
  // Flip off: the same shifts, images unmirrored; flip on, shift off: the same flips, unshifted.
  const Batch shifted = gather(execs.serial, data.source(2, &shift_key, false, nullptr), 0, 300);
  const Batch mirrored = gather(execs.serial, data.source(0, nullptr, true, &key1), 0, 300);
  for (int b = 0; b < 300; ++b) {
    const auto* img = data.image(data.perm[size_t(b)]);
    const auto s = kernels::batch_shift(shift_key, uint64_t(b), 2);
    const bool f = f1[size_t(b)];
    REQUIRE(same_image(&shifted.x[size_t(b) * data.D], expected(img, 3, 6, 8, s, false)));
    REQUIRE(same_image(&mirrored.x[size_t(b) * data.D], expected(img, 3, 6, 8, {}, f)));
    REQUIRE(same_image(&a.x[size_t(b) * data.D], expected(img, 3, 6, 8, s, f)));
  }
  // Flip on with shift 0 and flip off with shift 0: the keys that are off are not read.
  REQUIRE(same_bits(gather(execs.serial, data.source(0, nullptr, false, &key1), 0, 300).x,
                    gather(execs.serial, data.source(0, nullptr, false, nullptr), 0, 300).x));
}

// ---- DeviceBatcher --------------------------------------------------------------------------------------

namespace {

data::Dataset rgb_set(int64_t count, int rows, int cols) {
  data::Dataset d;
  d.name = "rgb";
  d.count = count;
  d.channels = 3, d.rows = rows, d.cols = cols;
  d.images.resize(size_t(count * d.image_size()));
  d.labels.resize(size_t(count));
  std::uniform_int_distribution<int> byte(1, 255), digit(0, 9);
  for (auto& px : d.images) px = static_cast<uint8_t>(byte(rng()));
  for (auto& l : d.labels) l = static_cast<uint8_t>(digit(rng()));
  d.mean.assign(kMean, kMean + 3);
  d.std.assign(kStd, kStd + 3);
  return d;
}

// The (flip, shift) within [-k, k]^2 that explains each gathered image; fails unless exactly one does.
struct Draw {
  bool flip;
  kernels::PixelShift shift;
};
std::vector<Draw> draws_of(const Batch& g, const data::Dataset& d, const std::vector<int32_t>& order, int k) {
  std::vector<Draw> out;
  const int64_t D = d.image_size();
  for (size_t b = 0; b < order.size(); ++b) {
    std::vector<Draw> found;
    for (bool f : {false, true})
      for (int dy = -k; dy <= k; ++dy)
        for (int dx = -k; dx <= k; ++dx)
          if (same_image(&g.x[b * size_t(D)],
                         expected(&d.images[size_t(order[b] * D)], d.channels, d.rows, d.cols, {dy, dx}, f)))
            found.push_back({f, {dy, dx}});
    INFO("position " << b);
    REQUIRE(found.size() == 1);
    out.push_back(found[0]);
  }
  return out;
}

}  // namespace

TEST_CASE("DeviceBatcher with flip: off is the plain gather, on is reproducible and leaves the shifts alone",
          "[cpu][data][batch]") {
  Context ctx({"cpu", 2});
  const auto d = rgb_set(160, 6, 7);
  data::DeviceBatcher plain(ctx, d, /*shuffle=*/true, 5);
  data::DeviceBatcher off(ctx, d, /*shuffle=*/true, 5, /*shift=*/0, /*flip=*/false);
  REQUIRE(same_bits(gather_epoch(ctx, plain, d, 1, 64).x, gather_epoch(ctx, off, d, 1, 64).x));

  data::DeviceBatcher flip(ctx, d, /*shuffle=*/true, 5, /*shift=*/0, /*flip=*/true);
  data::DeviceBatcher shift(ctx, d, /*shuffle=*/true, 5, /*shift=*/1, /*flip=*/false);
  data::DeviceBatcher both(ctx, d, /*shuffle=*/true, 5, /*shift=*/1, /*flip=*/true);
  const auto order = flip.order(1);
  const auto flips = draws_of(gather_epoch(ctx, flip, d, 1, 64), d, order, 0);
  const auto shifts = draws_of(gather_epoch(ctx, shift, d, 1, 64), d, order, 1);
  const auto epoch1 = gather_epoch(ctx, both, d, 1, 64);
  const auto joint = draws_of(epoch1, d, order, 1);
  int flipped = 0;
  for (size_t b = 0; b < order.size(); ++b) {
    INFO("position " << b);
    REQUIRE(!shifts[b].flip);
    REQUIRE(joint[b].flip == flips[b].flip);           // the flips of the flip-only batcher
    REQUIRE(joint[b].shift.dy == shifts[b].shift.dy);  // the shifts of the shift-only batcher
    REQUIRE(joint[b].shift.dx == shifts[b].shift.dx);
    flipped += joint[b].flip;
  }
  CHECK(flipped > 40);
  CHECK(flipped < 120);
  // The same (seed, epoch): the same bits, from a new batcher, whatever the batch size; another epoch differs.
  data::DeviceBatcher twin(ctx, d, /*shuffle=*/true, 5, 1, true);
  REQUIRE(same_bits(epoch1.x, gather_epoch(ctx, twin, d, 1, 7).x));
  REQUIRE(same_bits(epoch1.x, gather_epoch(ctx, both, d, 1, 160).x));
  data::DeviceBatcher fixed(ctx, d, /*shuffle=*/false, 5, 0, true);
  const auto e1 = draws_of(gather_epoch(ctx, fixed, d, 1, 64), d, fixed.order(1), 0);
  const auto e2 = draws_of(gather_epoch(ctx, fixed, d, 2, 64), d, fixed.order(2), 0);
  int changed = 0;
  for (size_t b = 0; b < e1.size(); ++b) changed += e1[b].flip != e2[b].flip;
  CHECK(changed > 40);
}

}  // namespace nt::test
