// DeviceBatcher: a data set resident on the execution device, served in batches.
//
// The images are uploaded once as bytes (47 MB for MNIST's train split instead of 188 MB as floats).
// Each epoch a seeded permutation is uploaded once; each step one kernel gathers the batch by that
// permutation and normalizes it (kernels/batch.h). No host-to-device copy happens inside a step.
//
// Optional augmentation for training: with flip every gathered image is mirrored left-right or not, each with
// probability 1/2; with shift k > 0 it is then translated by a random (dy, dx) in [-k, k]^2, zero-filled. Both are
// drawn from hashes of (seed, epoch, position in the epoch's order), with independent keys (kernels/batch.h).
// The epoch's two keys live in a two-word buffer on the device, written by begin_epoch next to the permutation, so
// a captured whole-epoch graph replays with fresh draws. Neither on (the default) is the plain gather, bit for bit.
// Evaluation batchers keep both off.
//
// Normalization is the data set's, per channel (at most kernels::kMaxBatchChannels channels).
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataset.h"
#include "engine/batch_source.h"
#include "engine/context.h"
#include "kernels/batch.h"

namespace nt::data {

class DeviceBatcher final : public BatchSource {
 public:
  // shuffle: a new order each epoch, derived from (seed, epoch); otherwise the stored order.
  // shift: the largest random translation in pixels (0 = none). flip: random left-right mirroring.
  DeviceBatcher(const Context& ctx, const Dataset& data, bool shuffle, uint64_t seed, int shift = 0, bool flip = false);

  int64_t examples() const override { return count_; }
  void begin_epoch(const kernels::Exec& exec, int epoch) override;
  void gather(const kernels::Exec& exec, int64_t first, int rows, const Tensor& x, const Tensor& y,
              bool beside_previous) override;

  // The order of examples in `epoch` (what begin_epoch uploads), for reproducing a run elsewhere.
  std::vector<int32_t> order(int epoch) const;

 private:
  void upload_keys(const kernels::Exec& exec, int epoch);

  int64_t count_;
  bool shuffle_;
  uint64_t seed_;
  int shift_;
  bool flip_;
  uint64_t shift_seed_, flip_seed_;
  Tensor images_, labels_, order_;
  Tensor keys_;  // (2) i64 on the device: the epoch's keys of the shifts and of the flips (kernels/batch.h)
  kernels::BatchSource source_;
};

}  // namespace nt::data
