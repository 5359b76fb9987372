// Deterministic random numbers for weight initialization, shuffling and dropout masks.
//
// SplitMix64 (Steele, Lea, Flood 2014): a tiny generator with full 64-bit period whose output is the
// same on every platform and compiler, unlike std:: distributions, so a seed means the same weights
// and the same data order everywhere, which the CPU/GPU and PyTorch comparisons rely on.
#pragma once

#include <cstdint>
#include <vector>

namespace nt {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 24 random bits: every value is exactly representable as a float.
  float uniform01() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform01(); }
  // Uniform integer in [0, n), unbiased (rejection of the short top range).
  uint64_t below(uint64_t n);

 private:
  uint64_t state_;
};

// Derives an independent stream for (seed, purpose, index): e.g. the shuffle of epoch 3.
uint64_t derive_seed(uint64_t seed, uint64_t purpose, uint64_t index);

// A uniformly random permutation of [0, n) by Fisher-Yates.
std::vector<int32_t> random_permutation(int64_t n, Rng& rng);

}  // namespace nt
