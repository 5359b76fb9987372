#include "data/batcher.h"

#include <numeric>

#include "engine/rng.h"

namespace nt::data {

namespace {
constexpr uint64_t kShufflePurpose = 1;
constexpr uint64_t kShiftPurpose = 2;
}

DeviceBatcher::DeviceBatcher(const Context& ctx, const Dataset& data, bool shuffle, uint64_t seed, int shift)
    : count_(data.count), shuffle_(shuffle), seed_(seed), shift_(shift), shift_seed_(derive_seed(seed, kShiftPurpose, 0)) {
  NT_CHECK(shift_ >= 0, "batcher shift must be >= 0, got ", shift_);
  NT_CHECK(shift_ == 0 || (data.rows > 0 && data.cols > 0 && data.channels > 0),
           "a shifted batcher needs the image shape, data set '", data.name, "' has none");
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
  source_ = {images_.u8(), labels_.u8(), order_.i32(), static_cast<int>(data.image_size()), data.mean, data.std};
  if (shift_ > 0) {
    shift_key_ = Tensor::empty(Shape{1}, DType::i64, exec.backend);
    source_.height = data.rows;
    source_.width = data.cols;
    source_.shift = shift_;
    source_.shift_key = static_cast<const uint64_t*>(shift_key_.raw());
    upload_shift_key(exec, 0);  // epoch 0's key until the first begin_epoch
  }
}

void DeviceBatcher::upload_shift_key(const kernels::Exec& exec, int epoch) {
  const uint64_t key = kernels::counter_key(shift_seed_, static_cast<uint64_t>(epoch));
  // Stream-ordered like the permutation's upload; from pageable memory the call returns once `key` is read.
  kernels::copy_host_to_device(exec, shift_key_.raw(), &key, sizeof key);
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
  if (shift_ > 0) upload_shift_key(exec, epoch);
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
  kernels::gather_batch(exec, source_, first, rows, x.f32(), y.i32(), beside_previous);
}

}  // namespace nt::data
