// DeviceBatcher's random-shift augmentation on the CPU backend: off by default and then the plain gather
// bit for bit; on, every image is a translation of its source within [-k, k]^2 (checked by brute force
// against the source), drawn afresh each epoch, the same for the same (seed, epoch), and independent of
// how an epoch is cut into batches (the shift depends on the example's position in the epoch's order).
#include "test_support.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "data/batcher.h"
#include "data/dataset.h"
#include "engine/context.h"

namespace nt::test {
namespace {

// Pixels in [1, 255]: no source pixel equals the zero fill, so a translation shows in the output.
data::Dataset synthetic(int64_t count, int channels, int rows, int cols) {
  data::Dataset d;
  d.name = "synthetic";
  d.count = count;
  d.channels = channels, d.rows = rows, d.cols = cols;
  d.images.resize(size_t(count * d.image_size()));
  d.labels.resize(size_t(count));
  std::uniform_int_distribution<int> byte(1, 255), digit(0, 9);
  for (auto& px : d.images) px = static_cast<uint8_t>(byte(rng()));
  for (auto& l : d.labels) l = static_cast<uint8_t>(digit(rng()));
  d.mean.assign(size_t(channels), 0.1307f), d.std.assign(size_t(channels), 0.3081f);
  return d;
}

// How many images of two gathers of the same epoch order differ.
int64_t images_differing(const GatheredEpoch& a, const GatheredEpoch& b, int64_t D) {
  int64_t n = 0;
  for (size_t i = 0; i < a.y.size(); ++i)
    n += std::memcmp(&a.x[i * size_t(D)], &b.x[i * size_t(D)], size_t(D) * sizeof(float)) != 0 ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("DeviceBatcher with shift 0 gathers exactly what it gathered without the option", "[cpu][batch][shift]") {
  Context ctx({"cpu", 2});
  const auto d = synthetic(300, 1, 28, 28);
  data::DeviceBatcher plain(ctx, d, /*shuffle=*/true, 5);
  data::DeviceBatcher off(ctx, d, /*shuffle=*/true, 5, /*shift=*/0);
  for (int epoch : {1, 2}) {
    const auto a = gather_epoch(ctx, plain, d, epoch, 64), b = gather_epoch(ctx, off, d, epoch, 64);
    REQUIRE(same_bits(a.x, b.x));
    REQUIRE(a.y == b.y);
  }
}

TEST_CASE("DeviceBatcher with shift k: translated images, fresh each epoch, reproducible per (seed, epoch)",
          "[cpu][batch][shift]") {
  Context ctx({"cpu", 2});
  struct Case {
    int64_t N;
    int C, H, W, k;
  };
  const Case cases[] = {{200, 1, 28, 28, 2}, {150, 2, 9, 7, 3}};
  for (const Case& c : cases) {
    INFO("N=" << c.N << " C=" << c.C << " H=" << c.H << " W=" << c.W << " k=" << c.k);
    const auto d = synthetic(c.N, c.C, c.H, c.W);
    const int64_t D = d.image_size();
    data::DeviceBatcher batcher(ctx, d, /*shuffle=*/true, 11, c.k);
    const auto epoch1 = gather_epoch(ctx, batcher, d, 1, 64);

    // Every image is its source (by the epoch's order) translated within range; every shift occurs.
    const auto order = batcher.order(1);
    std::vector<int> dys, dxs;
    for (int64_t b = 0; b < c.N; ++b) {
      const int32_t r = order[size_t(b)];
      REQUIRE(epoch1.y[size_t(b)] == d.labels[size_t(r)]);
      INFO("position " << b);
      const auto found = matching_shifts(&d.images[size_t(r * D)], d.channels, d.rows, d.cols, c.k, d.mean[0], d.std[0],
                                         &epoch1.x[size_t(b * D)]);
      REQUIRE(!found.empty());
      dys.push_back(found[0].dy), dxs.push_back(found[0].dx);
    }
    for (int v = -c.k; v <= c.k; ++v) {
      CHECK(std::count(dys.begin(), dys.end(), v) > 0);
      CHECK(std::count(dxs.begin(), dxs.end(), v) > 0);
    }

    // The same (seed, epoch): the same bits, from this batcher again or a new one, whatever the batch size.
    REQUIRE(same_bits(epoch1.x, gather_epoch(ctx, batcher, d, 1, 64).x));
    data::DeviceBatcher twin(ctx, d, /*shuffle=*/true, 11, c.k);
    REQUIRE(same_bits(epoch1.x, gather_epoch(ctx, twin, d, 1, 7).x));
    REQUIRE(same_bits(epoch1.x, gather_epoch(ctx, twin, d, 1, int(c.N)).x));

    // Another seed, same epoch (same order only if unshuffled, so compare unshuffled batchers); another
    // epoch, same seed: most images shift differently (the same shift by chance 1 in (2k+1)^2).
    data::DeviceBatcher fixed_a(ctx, d, /*shuffle=*/false, 11, c.k), fixed_b(ctx, d, /*shuffle=*/false, 12, c.k);
    const auto a1 = gather_epoch(ctx, fixed_a, d, 1, 64), a2 = gather_epoch(ctx, fixed_a, d, 2, 64);
    const auto b1 = gather_epoch(ctx, fixed_b, d, 1, 64);
    REQUIRE(a1.y == a2.y);
    CHECK(images_differing(a1, a2, D) > c.N / 2);
    CHECK(images_differing(a1, b1, D) > c.N / 2);
  }
}

}  // namespace nt::test
