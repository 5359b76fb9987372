// Counter-based random numbers shared by host and device: the draws of the ops that need randomness
// inside a step (dropout masks, training-batch shifts) are pure functions of (seed, draw, i), so both
// backends, any thread count and any launch shape give the same numbers, bit for bit.
//
//   key  = counter_key(seed, draw)                  one 64-bit key per (stream, draw), computed once per call
//   bits = counter_bits(key, i)                     the i-th 64-bit output of a SplitMix64 generator at key
// Within a draw the outputs are SplitMix64's own sequence; distinct draws or seeds start at unrelated
// points of its 2^64 cycle.
#pragma once

#include <cstdint>

#include "kernels/exec.h"

namespace nt::kernels {

// SplitMix64's finalizer (Steele, Lea, Flood 2014; the mixing of engine/rng.h): a bijection of 64-bit
// words whose outputs pass BigCrush when fed a Weyl sequence.
NT_HOST_DEVICE inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline constexpr uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ull;  // SplitMix64's Weyl increment

NT_HOST_DEVICE inline uint64_t counter_key(uint64_t seed, uint64_t draw) {
  return splitmix64_mix(splitmix64_mix(seed) ^ (draw * kSplitMix64Gamma + kSplitMix64Gamma));
}
NT_HOST_DEVICE inline uint64_t counter_bits(uint64_t key, uint64_t i) {
  return splitmix64_mix(key + (i + 1) * kSplitMix64Gamma);
}

}  // namespace nt::kernels
