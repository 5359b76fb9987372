#include "profile/phase_stamps.h"

#include <algorithm>
#include <tuple>

namespace nt::profile {

StampedRuns split_stamps(const std::vector<PhaseStamp>& stamps) {
  // Order: by tag, then by time; the slot order breaks ties (two marks of one thread in the same tick).
  std::vector<size_t> order(stamps.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(stamps[a].launch, stamps[a].time_ns, a) < std::tie(stamps[b].launch, stamps[b].time_ns, b);
  });
  StampedRuns out;
  size_t run_begin = 0;  // first mark of the current run, in `order`
  uint32_t occurrence = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const PhaseStamp& s = stamps[order[k]];
    if (k > run_begin && s.launch != stamps[order[run_begin]].launch) {  // a new tag before the run's end()
      out.unended += static_cast<int64_t>(k - run_begin);
      run_begin = k, occurrence = 0;
    }
    if (s.phase != kPhaseEnd) continue;
    const uint64_t first = stamps[order[run_begin]].time_ns;
    for (size_t j = run_begin; j < k; ++j) {
      const PhaseStamp& a = stamps[order[j]];
      const PhaseStamp& b = stamps[order[j + 1]];
      if (a.phase == kPhaseEnd) continue;
      out.slices.push_back({a.launch, occurrence, a.phase, a.time_ns - first, b.time_ns - a.time_ns});
    }
    ++occurrence;
    run_begin = k + 1;
    if (run_begin < order.size() && stamps[order[run_begin]].launch != s.launch) occurrence = 0;
  }
  out.unended += static_cast<int64_t>(order.size() - run_begin);
  return out;
}

}  // namespace nt::profile
