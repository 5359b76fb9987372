// gather_batch with several channels (per-channel normalization) and the random left-right flip, on the CPU
// backend: every value checked bit for bit against the contract of kernels/batch.h written out here (flip first,
// then shift; black outside), the draws reproducible per key and independent of each other, and DeviceBatcher's
// flip option: off is the plain gather, on is reproducible per (seed, epoch) whatever the batch size, and adding
// it leaves the shifts as they were.
#include "test_support.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include "data/batcher.h"
#include "data/dataset.h"
#include "engine/context.h"
#include "kernels/batch.h"

namespace nt::test {
namespace {

using kernels::Exec;

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
  Images(int n, int c, int h, int w)
      : N(n), C(c), H(h), W(w), D(c * h * w), images(size_t(n) * D), labels(n), perm(n) {
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
                        {60, 2, 4, 9, 3, 33, 27},       {30, 1, 6, 1, 1, 30, 0},    {40, 3, 3, 4, 6, 40, 0}};
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
  CHECK(differing > 100);   // two epochs: about half the examples flip differently
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
    REQUIRE(joint[b].flip == flips[b].flip);                // the flips of the flip-only batcher
    REQUIRE(joint[b].shift.dy == shifts[b].shift.dy);       // the shifts of the shift-only batcher
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
