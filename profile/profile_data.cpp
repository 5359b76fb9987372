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

const char* math_name(Math m) {
  switch (m) {
    case Math::fp32:
      return "fp32";
    case Math::tf32:
      return "tf32";
    case Math::bf16:
      return "bf16";
  }
  return "?";
}

Row& ProfileData::row_for(const Key& key, const Launch& l) {
  Row& row = rows_[key];
  if (row.calls == 0) {
    row.kernel = name(l.kernel), row.phase = name(l.phase), row.layer = name(l.layer), row.part = name(key.part);
    row.math = l.cost.math;
  }
  return row;
}

namespace {

void count_call(Row& row, double us) {
  row.min_us = row.calls == 0 ? us : std::min(row.min_us, us);
  row.max_us = row.calls == 0 ? us : std::max(row.max_us, us);
  ++row.calls;
  row.total_us += us;
}

}  // namespace

size_t ProfileData::add(const Launch& l) {
  NT_CHECK(l.kernel != kNoName, "a profiled launch without a kernel name");
  Row& row = row_for(Key{l.kernel, l.phase, l.layer, kNoName}, l);
  count_call(row, l.exclusive_us);
  row.span_us += l.span_us;
  row.bytes += l.cost.bytes;
  row.flops += l.cost.flops;
  row.overlaps_previous = row.overlaps_previous || l.cost.overlaps_previous;
  kernel_us_ += l.exclusive_us;
  ++launch_count_;
  if (launches_.size() >= max_launches_) return kNotInTrace;
  launches_.push_back(l);
  return launches_.size() - 1;
}

void ProfileData::add_part(const Launch& parent, size_t parent_index, int part, int order, double start_us,
                           double dur_us) {
  NT_CHECK(part != kNoName, "a stamped phase without a name");
  const Key key{parent.kernel, parent.phase, parent.layer, part};
  Row& row = row_for(key, parent);
  count_call(row, dur_us);
  row.span_us += dur_us;
  part_order_.emplace(key, order);
  if (parent_index != kNotInTrace) parts_.push_back({parent_index, part, start_us, dur_us});
}

std::vector<Row> ProfileData::rows() const {
  std::vector<Row> kernels;
  std::vector<std::pair<int, const Row*>> parts;  // (declared order, row)
  for (const auto& [key, row] : rows_) {
    if (key.part == kNoName)
      kernels.push_back(row);
    else
      parts.emplace_back(part_order_.at(key), &row);
  }
  const auto by_name = [](const Row& r) { return std::tie(r.kernel, r.phase, r.layer); };
  std::sort(kernels.begin(), kernels.end(), [&](const Row& a, const Row& b) {
    if (a.total_us != b.total_us) return a.total_us > b.total_us;
    return by_name(a) < by_name(b);
  });
  std::sort(parts.begin(), parts.end(), [&](const auto& a, const auto& b) {
    return std::tie(a.second->kernel, a.second->phase, a.second->layer, a.first, a.second->part) <
           std::tie(b.second->kernel, b.second->phase, b.second->layer, b.first, b.second->part);
  });
  std::vector<Row> out;
  out.reserve(rows_.size());
  for (const Row& k : kernels) {
    out.push_back(k);
    auto it = std::lower_bound(parts.begin(), parts.end(), by_name(k),
                               [&](const auto& p, const auto& name) { return by_name(*p.second) < name; });
    for (; it != parts.end() && by_name(*it->second) == by_name(k); ++it) out.push_back(*it->second);
  }
  return out;
}

std::vector<StepSummary> ProfileData::step_summaries() const {
  // The launches of one step opening, in launch order (a step's launches are contiguous: steps do not interleave).
  std::vector<StepSummary> out;
  std::vector<std::pair<double, double>> spans;  // of the current step
  const auto finish = [&] {
    if (out.empty() || spans.empty()) return;
    StepSummary& s = out.back();
    std::sort(spans.begin(), spans.end());
    // One pass over the union of the spans: all of it (for the overlap), and its part from the step's first exclusive
    // start on (the time some kernel of the step was resident within its wall time).
    double covered = 0, inside = 0, reach = -1e300, last = -1e300;
    for (const auto& [b, e] : spans) {
      const double from = std::max(b, reach);
      if (e > from) covered += e - from, inside += std::max(e - std::max(from, s.start_us), 0.0);
      reach = std::max(reach, e);
      last = std::max(last, e);
    }
    s.wall_us = std::max(last - s.start_us, 0.0);
    s.idle_us = std::max(s.wall_us - inside, 0.0);
    s.overlap_us = std::max(s.span_us - covered, 0.0);
    spans.clear();
  };
  uint64_t current = 0;
  for (const Launch& l : launches_) {
    if (l.step_id == 0) continue;  // outside any step
    if (l.step_id != current) {
      finish();
      current = l.step_id;
      out.push_back({});
      out.back().step_id = l.step_id;
      out.back().name = l.step;
      out.back().start_us = l.exclusive_start_us();
    }
    StepSummary& s = out.back();
    ++s.kernels;
    s.start_us = std::min(s.start_us, l.exclusive_start_us());
    s.exclusive_us += l.exclusive_us;
    s.span_us += l.span_us;
    spans.emplace_back(l.start_us, l.end_us());
  }
  finish();
  return out;
}

}  // namespace nt::profile
