// Dropout (training mode; the evaluation mode is an identity copy and needs no kernel).
//
//   dropout_forward:  mask[i] = u(seed, draw, i) >= p ? 1 : 0;   y[i] = (x[i] * mask[i]) / (1 - p)
//   dropout_backward: dx[i] = (dy[i] * mask[i]) / (1 - p)
// with 1 - p computed in the element type, p in [0, 1): each element is kept with probability 1 - p, and
// a kept element is exactly x / (1 - p), one correctly rounded division (PyTorch multiplies by the
// rounded reciprocal instead, which can differ in the last bit). The multiply by the 0/1 mask is
// arithmetic, not a select, so a NaN or infinite input still shows up as NaN in y (as torch's dropout).
// draw is the value of a device-resident counter, {value, done} as in kernels/cuda/grid_counter.cuh: each
// forward call uses draw = value and leaves value + 1, so every call (and every replay of a captured CUDA
// graph) draws a fresh mask, p == 0 and n == 0 included. u is a counter-based hash of (seed, draw, i),
// dropout_uniform below, compiled for host and device alike: the same seed and counter give the same
// masks on CPU and CUDA, bit for bit, and DropoutArgs<double> draws the same masks as DropoutArgs<float>.
// mask: (n) bytes 0/1, written (=); y, dx written (=). x == y and dy == dx may alias exactly (in place).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/counter_hash.h"
#include "kernels/dispatch.h"

namespace nt::kernels {

// The uniform number of element i in draw `draw` of stream `seed`: in [0, 1) with 24 random bits, every
// value exactly representable in fp32, from the counter-based hash of kernels/counter_hash.h: (seed, draw)
// picks a 64-bit key; element i is then the i-th output of a SplitMix64 generator started at that key.
// The ops compute the key once per call: dropout_uniform(seed, draw, i) == dropout_uniform_keyed(key, i).
NT_HOST_DEVICE inline uint64_t dropout_key(uint64_t seed, uint64_t draw) { return counter_key(seed, draw); }
NT_HOST_DEVICE inline float dropout_uniform_keyed(uint64_t key, uint64_t i) {
  return static_cast<float>(counter_bits(key, i) >> 40) * 0x1.0p-24f;
}
NT_HOST_DEVICE inline float dropout_uniform(uint64_t seed, uint64_t draw, uint64_t i) {
  return dropout_uniform_keyed(dropout_key(seed, draw), i);
}

// Both ops of the family; each reads and writes only the fields its comment names.
template <class T>
struct DropoutArgs {
  size_t n = 0;                 // elements of every tensor below
  float p = 0.f;                // drop probability in [0, 1), both ops (the backward divides by the same 1 - p)
  uint64_t seed = 0;            // dropout_forward: the layer's stream of masks
  uint64_t* counter = nullptr;  // (2) {value, done}: dropout_forward reads value as the draw, leaves value + 1
  const T* x = nullptr;         // (n)  dropout_forward reads
  T* y = nullptr;               // (n)  dropout_forward writes (=, may be x)
  uint8_t* mask = nullptr;      // (n)  dropout_forward writes (=) 0/1; dropout_backward reads
  const T* dy = nullptr;        // (n)  dropout_backward reads
  T* dx = nullptr;              // (n)  dropout_backward writes (=, may be dy)
};

namespace cpu {
template <class T>
void dropout_forward(const Exec& exec, const DropoutArgs<T>& a);  // float, double
template <class T>
void dropout_backward(const Exec& exec, const DropoutArgs<T>& a);  // float, double
}  // namespace cpu
namespace cuda {
void dropout_forward(const Exec& exec, const DropoutArgs<float>& a);
void dropout_backward(const Exec& exec, const DropoutArgs<float>& a);
}  // namespace cuda

template <class T>
void dropout_forward(const Exec& exec, const DropoutArgs<T>& a) {
  dispatch<cpu::dropout_forward<T>, cuda::dropout_forward>(exec, a);
}
template <class T>
void dropout_backward(const Exec& exec, const DropoutArgs<T>& a) {
  dispatch<cpu::dropout_backward<T>, cuda::dropout_backward>(exec, a);
}

}  // namespace nt::kernels
