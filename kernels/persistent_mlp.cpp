#include "kernels/persistent_mlp.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace nt::kernels {

namespace {
constexpr size_t kAlign = 256;  // bytes: the workspace's header and each buffer start on this boundary
size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
}  // namespace

void check_persistent_mlp(const PersistentMlpArgs& a) {
  NT_CHECK(a.layers >= 2 && a.layers <= kPersistentMaxLayers, "persistent_mlp: layers must be in [2, ",
           kPersistentMaxLayers, "], got ", a.layers);
  NT_CHECK(a.B >= 1 && a.B <= kPersistentMaxBatch, "persistent_mlp: B must be in [1, ", kPersistentMaxBatch, "], got ",
           a.B);
  NT_CHECK(a.groups >= 1 && a.groups <= std::min(a.B, kPersistentMaxGroups), "persistent_mlp: groups must be in [1, ",
           std::min(a.B, kPersistentMaxGroups), "], got ", a.groups);
  NT_CHECK((a.groups - 1) * persistent_mlp_chunk(a.B, a.groups) < a.B, "persistent_mlp: ", a.groups,
           " groups of a batch of ", a.B, " leave the last one empty");
  NT_CHECK(a.steps >= 0 && a.first >= 0, "persistent_mlp: steps and first must not be negative");
  NT_CHECK(a.width[0] == a.src.D, "persistent_mlp: width[0] (", a.width[0], ") must be the images' D (", a.src.D, ")");
  for (int l = 0; l <= a.layers; ++l) NT_CHECK(a.width[l] >= 1, "persistent_mlp: width[", l, "] must be positive");
  NT_CHECK(a.width[a.layers] <= kPersistentMaxClasses, "persistent_mlp: at most ", kPersistentMaxClasses,
           " classes, got ", a.width[a.layers]);
  NT_CHECK(a.src.shift == 0 && !a.src.flip, "persistent_mlp: no shift or flip (the per-kernel path has them)");
  NT_CHECK(a.src.images && a.src.labels && a.src.perm, "persistent_mlp: images, labels and perm are required");
  const bool planes = a.src.height > 0 && a.src.width > 0;
  NT_CHECK(!planes || a.src.D % (a.src.height * a.src.width) == 0, "persistent_mlp: D (", a.src.D,
           ") is not a whole number of ", a.src.height, "x", a.src.width, " planes");
  NT_CHECK(!planes || a.src.D / (a.src.height * a.src.width) <= kMaxBatchChannels, "persistent_mlp: at most ",
           kMaxBatchChannels, " channels");
  for (int l = 0; l < a.layers; ++l) {
    NT_CHECK(a.weight[l] && a.bias[l], "persistent_mlp: layer ", l, " needs its weight and bias");
    NT_CHECK(a.momentum == 0.f || (a.weight_velocity[l] && a.bias_velocity[l]), "persistent_mlp: layer ", l,
             " needs its velocities with momentum");
    NT_CHECK(!a.adam_step ||
                 (a.weight_velocity[l] && a.bias_velocity[l] && a.weight_second_moment[l] && a.bias_second_moment[l]),
             "persistent_mlp: layer ", l, " needs its first and second moments with Adam");
  }
  NT_CHECK(a.loss_sum && a.correct && a.workspace, "persistent_mlp: loss_sum, correct and workspace are required");
}

PersistentMlpWorkspace persistent_mlp_workspace(void* base, const int* width, int layers, int B, int groups) {
  const auto at = [base](size_t offset) { return reinterpret_cast<std::uintptr_t>(base) + offset; };
  PersistentMlpWorkspace w;
  w.barrier = reinterpret_cast<unsigned int*>(at(0));
  size_t offset = kAlign;  // the grid barrier's words
  for (int l = 0; l + 1 < layers; ++l) {
    const size_t part = aligned(sizeof(float) * size_t(B) * size_t(width[l + 1]));
    w.activation[l + 1] = reinterpret_cast<float*>(at(offset));
    w.gradient[l] = reinterpret_cast<float*>(at(offset + part));
    offset += 2 * part;
  }
  const size_t rows = aligned(sizeof(float) * size_t(B));
  w.row_loss = reinterpret_cast<float*>(at(offset));
  w.row_hit = reinterpret_cast<float*>(at(offset + rows));
  offset += 2 * rows;
  size_t floats = 0;
  for (int l = 0; l < layers; ++l) {
    w.layer_offset[l] = (floats + 3) / 4 * 4;  // 16-byte aligned: the weights' partials are read and written as float4s
    floats = w.layer_offset[l] + size_t(width[l + 1]) * size_t(width[l]) + size_t(width[l + 1]);
  }
  w.partial_stride = aligned(sizeof(float) * floats) / sizeof(float);
  w.partial = reinterpret_cast<float*>(at(offset));
  offset += sizeof(float) * w.partial_stride * size_t(groups);
  w.bytes = offset;
  return w;
}

}  // namespace nt::kernels
