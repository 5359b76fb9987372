// A persistent mlp problem for the tests (kernels/persistent_mlp.h): random images, labels and order, a random model,
// and the op's arguments over host or device buffers.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/persistent_mlp.h"

namespace nt::test {

struct PersistentMlpCase {
  std::vector<int> width;  // width[0] = D, ..., width.back() = classes
  int B = 1;
  int groups = 1;  // the batch's groups (kernels/persistent_mlp.h): a GPU run takes the device's, and its twin the same
  int steps = 1;
  float lr = 0.05f, momentum = 0.f, weight_decay = 0.f;
  bool adam = false;                // Adam (lr, weight_decay above; betas 0.9, 0.999, eps 1e-8) instead of SGD
  bool decoupled = false;           // AdamW
  int height = 0, plane_width = 0;  // planes of the images (0: one plane); mean and std per plane
  int64_t first = 0;

  int layers() const { return static_cast<int>(width.size()) - 1; }
};

// The host side: data, order and the model's starting weights (and velocities), fixed by the test's random seed.
struct PersistentMlpData {
  std::vector<uint8_t> images, labels;
  std::vector<int32_t> perm;
  kernels::ChannelValues mean, std_dev;
  std::vector<std::vector<float>> weight, bias, weight_velocity, bias_velocity;  // per layer (velocities: Adam's m)
  std::vector<std::vector<float>> weight_second_moment, bias_second_moment;      // Adam's v
  uint64_t adam_steps = 0;                                                       // Adam's steps so far (t0)
};

PersistentMlpData make_persistent_mlp_data(const PersistentMlpCase& c);

// What a run leaves: the weights and the optimizer's state after the last step, and the totals.
struct PersistentMlpResult {
  std::vector<std::vector<float>> weight, bias, weight_velocity, bias_velocity;
  std::vector<std::vector<float>> weight_second_moment, bias_second_moment;
  uint64_t adam_steps = 0;
  double loss_sum = 0;
  int64_t correct = 0;
};

// The op's arguments for the case, with the data's host buffers; a GPU run swaps in device copies of every pointer.
// The tensors and Adam's step counter are left unset.
kernels::PersistentMlpArgs persistent_mlp_args(const PersistentMlpCase& c, const PersistentMlpData& d);

// The op on the CPU twin (host buffers).
PersistentMlpResult run_persistent_mlp_cpu(const PersistentMlpCase& c, const PersistentMlpData& d);

// The largest |got - want| over every weight, bias and velocity, over the largest |want|.
double persistent_mlp_relative_error(const PersistentMlpResult& got, const PersistentMlpResult& want);
bool same_bits(const PersistentMlpResult& a, const PersistentMlpResult& b);

}  // namespace nt::test
