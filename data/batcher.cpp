#include "data/batcher.h"

#include <numeric>

#include "engine/rng.h"

namespace nt::data {

namespace {
constexpr uint64_t kShufflePurpose = 1;
constexpr uint64_t kShiftPurpose = 2;
constexpr uint64_t kFlipPurpose = 3;
}  // namespace

DeviceBatcher::DeviceBatcher(const Context& ctx, const Dataset& data, bool shuffle, uint64_t seed, int shift, bool flip)
    : count_(data.count),
      shuffle_(shuffle),
      seed_(seed),
      shift_(shift),
      flip_(flip),
      shift_seed_(derive_seed(seed, kShiftPurpose, 0)),
      flip_seed_(derive_seed(seed, kFlipPurpose, 0)) {
  NT_CHECK(shift_ >= 0, "batcher shift must be >= 0, got ", shift_);
  NT_CHECK((shift_ == 0 && !flip_) || (data.rows > 0 && data.cols > 0 && data.channels > 0),
           "a shifted or flipped batcher needs the image shape, data set '", data.name, "' has none");
  NT_CHECK(data.channels >= 1 && data.channels <= kernels::kMaxBatchChannels, "data set '", data.name, "' has ",
           data.channels, " channels; the batch kernels take 1 to ", kernels::kMaxBatchChannels);
  NT_CHECK(data.mean.size() == size_t(data.channels) && data.std.size() == size_t(data.channels), "data set '",
           data.name, "': ", data.mean.size(), " means and ", data.std.size(), " standard deviations for ",
           data.channels, " channels");
  const auto& exec = ctx.exec();
  images_ = Tensor::empty(Shape{data.count, data.image_size()}, DType::u8, exec.backend);
  labels_ = Tensor::empty(Shape{data.count}, DType::u8, exec.backend);
  order_ = Tensor::empty(Shape{data.count}, DType::i32, exec.backend);
  images_.copy_from_host(exec, data.images.data(), data.images.size());
  labels_.copy_from_host(exec, data.labels.data(), data.labels.size());
  if (!shuffle_) {
    auto identity = order(0);
    order_.copy_from_host(exec, identity.data(), identity.size() * sizeof(int32_t));
  }
  source_ = {.images = images_.u8(),
             .labels = labels_.u8(),
             .perm = order_.i32(),
             .D = static_cast<int>(data.image_size()),
             .mean = kernels::ChannelValues(data.mean.data(), data.channels),
             .std = kernels::ChannelValues(data.std.data(), data.channels),
             .height = data.rows,
             .width = data.cols};
  if (shift_ > 0 || flip_) {
    keys_ = Tensor::empty(Shape{2}, DType::i64, exec.backend);
    const auto* keys = static_cast<const uint64_t*>(keys_.raw());
    source_.shift = shift_;
    source_.shift_key = keys;
    source_.flip = flip_;
    source_.flip_key = keys + 1;
    upload_keys(exec, 0);  // epoch 0's keys until the first begin_epoch
  }
}

void DeviceBatcher::upload_keys(const kernels::Exec& exec, int epoch) {
  const uint64_t keys[2] = {kernels::counter_key(shift_seed_, static_cast<uint64_t>(epoch)),
                            kernels::counter_key(flip_seed_, static_cast<uint64_t>(epoch))};
  // Stream-ordered like the permutation's upload; from pageable memory the call returns once `keys` is read.
  kernels::copy_host_to_device(exec, keys_.raw(), keys, sizeof keys);
}

std::vector<int32_t> DeviceBatcher::order(int epoch) const {
  if (!shuffle_) {
    std::vector<int32_t> identity(static_cast<size_t>(count_));
    std::iota(identity.begin(), identity.end(), 0);
    return identity;
  }
  Rng rng(derive_seed(seed_, kShufflePurpose, static_cast<uint64_t>(epoch)));
  return random_permutation(count_, rng);
}

void DeviceBatcher::begin_epoch(const kernels::Exec& exec, int epoch) {
  if (shift_ > 0 || flip_) upload_keys(exec, epoch);
  if (!shuffle_) return;
  auto perm = order(epoch);
  // Stream-ordered: the copy lands before any gather enqueued after it, and from pageable memory
  // the call returns only once `perm` has been read, so the vector may go out of scope.
  kernels::copy_host_to_device(exec, order_.raw(), perm.data(), perm.size() * sizeof(int32_t));
}

void DeviceBatcher::gather(const kernels::Exec& exec, int64_t first, int rows, const Tensor& x, const Tensor& y,
                           bool beside_previous) {
  NT_CHECK(first >= 0 && first + rows <= count_, "batch [", first, ", ", first + rows, ") of ", count_);
  NT_CHECK(x.numel() >= int64_t(rows) * source_.D, "batch input too small");
  kernels::gather_batch(
      exec,
      {.src = source_, .first = first, .B = rows, .x = x.f32(), .y = y.i32(), .overlaps_previous = beside_previous});
}

}  // namespace nt::data
