#include "engine/rng.h"

#include <cstddef>
#include <numeric>
#include <utility>

namespace nt {

uint64_t Rng::below(uint64_t n) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = next_u64();
  while (x >= limit);
  return x % n;
}

uint64_t derive_seed(uint64_t seed, uint64_t purpose, uint64_t index) {
  Rng r(seed ^ (purpose * 0xD1B54A32D192ED03ull));
  r.next_u64();
  Rng s(r.next_u64() ^ (index * 0x8CB92BA72F3D8DD7ull));
  return s.next_u64();
}

std::vector<int32_t> random_permutation(int64_t n, Rng& rng) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(rng.below(static_cast<uint64_t>(i + 1)))]);
  return p;
}

}  // namespace nt
