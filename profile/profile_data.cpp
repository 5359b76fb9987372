#include "profile/profile_data.h"

#include <algorithm>
#include <tuple>

#include "core/error.h"

namespace nt::profile {

int ProfileData::intern(std::string_view name) {
  if (name.empty()) return kNoName;
  if (auto it = ids_.find(name); it != ids_.end()) return it->second;
  const int id = static_cast<int>(names_.size());
  names_.emplace_back(name);
  ids_.emplace(names_.back(), id);
  return id;
}

const std::string& ProfileData::name(int id) const {
  static const std::string none;
  if (id == kNoName) return none;
  NT_CHECK(id >= 0 && static_cast<size_t>(id) < names_.size(), "profile name id ", id, " out of range");
  return names_[static_cast<size_t>(id)];
}

void ProfileData::add(const Launch& l) {
  NT_CHECK(l.kernel != kNoName, "a profiled launch without a kernel name");
  Row& row = rows_[Key{l.kernel, l.phase, l.layer}];
  if (row.calls == 0) {
    row.kernel = name(l.kernel), row.phase = name(l.phase), row.layer = name(l.layer);
    row.min_us = row.max_us = l.dur_us;
  }
  ++row.calls;
  row.total_us += l.dur_us;
  row.min_us = std::min(row.min_us, l.dur_us);
  row.max_us = std::max(row.max_us, l.dur_us);
  row.bytes += l.cost.bytes;
  row.flops += l.cost.flops;
  kernel_us_ += l.dur_us;
  ++launch_count_;
  if (launches_.size() < max_launches_) launches_.push_back(l);
}

std::vector<Row> ProfileData::rows() const {
  std::vector<Row> out;
  out.reserve(rows_.size());
  for (const auto& [key, row] : rows_) out.push_back(row);
  std::sort(out.begin(), out.end(), [](const Row& a, const Row& b) {
    if (a.total_us != b.total_us) return a.total_us > b.total_us;
    return std::tie(a.kernel, a.phase, a.layer) < std::tie(b.kernel, b.phase, b.layer);
  });
  return out;
}

}  // namespace nt::profile
