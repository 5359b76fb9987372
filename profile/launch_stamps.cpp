#include "profile/launch_stamps.h"

#include <algorithm>

namespace nt::profile {

StampedTimes times_from_launch_stamps(const std::vector<StampedLaunch>& launches,
                                      const std::vector<LaunchStamp>& slots) {
  StampedTimes out;
  out.launches.resize(launches.size());
  // The two kinds of slot, each in stream order: kernel k + 1 starts only after kernel k has let it launch, which k
  // does after it read its start, and a kernel beside its predecessor releases only after the one before it has
  // completed. (%globaltimer moves every 32 ns on an H100; launches are microseconds apart: no ties.)
  std::vector<const LaunchStamp*> starts, releases;
  for (const LaunchStamp& s : slots) (s.start_ns != 0 ? starts : releases).push_back(&s);
  std::stable_sort(starts.begin(), starts.end(),
                   [](const LaunchStamp* a, const LaunchStamp* b) { return a->start_ns < b->start_ns; });
  std::stable_sort(releases.begin(), releases.end(),
                   [](const LaunchStamp* a, const LaunchStamp* b) { return a->release_ns < b->release_ns; });
  out.start_slots = starts.size(), out.release_slots = releases.size();
  out.waiting_for_release = static_cast<size_t>(
      std::count_if(starts.begin(), starts.end(), [](const LaunchStamp* s) { return s->release_ns == 0; }));
  if (starts.size() != launches.size() || releases.size() != out.waiting_for_release) {
    out.aligned = false;
    out.untimed =
        std::count_if(launches.begin(), launches.end(), [](const StampedLaunch& l) { return l.counted && !l.closes; });
    return out;
  }
  std::vector<uint64_t> start(launches.size()), release(launches.size());
  for (size_t k = 0, b = 0; k < launches.size(); ++k) {
    start[k] = starts[k]->start_ns;
    release[k] = starts[k]->release_ns != 0 ? starts[k]->release_ns : releases[b++]->release_ns;
  }
  for (size_t k = 0; k < launches.size(); ++k) {
    if (launches[k].closes) continue;
    const bool observed =
        k + 1 < launches.size() && launches[k].replay >= 0 && launches[k + 1].replay == launches[k].replay;
    // A release before the kernel's own start, or before the release that precedes it, would be a slot matched to
    // the wrong launch: not a time.
    if (!observed || release[k] < start[k] || release[k + 1] < release[k]) {
      out.untimed += launches[k].counted;
      continue;
    }
    // The first kernel of a replay has no predecessor running beside it (one that runs beside would otherwise count
    // from its closing wait).
    const bool first_of_replay = k == 0 || launches[k - 1].replay != launches[k].replay;
    out.launches[k] = {true, start[k], first_of_replay ? start[k] : release[k], release[k + 1]};
  }
  return out;
}

}  // namespace nt::profile
