// The launch-stamps timer's arithmetic (profile/launch_stamps.h), which needs no GPU: slots written by kernels, in the
// order they took them, become each launch's start, exclusive start and end. Times are in ns, chosen so that every
// difference is distinct and an off-by-one in the matching shows.
#include "test_support.h"

#include <vector>

#include "profile/launch_stamps.h"

using namespace nt;
using profile::LaunchStamp;
using profile::StampedLaunch;

namespace {

StampedLaunch in_replay(int64_t replay) { return {replay, false}; }
StampedLaunch closing(int64_t replay) { return {replay, true}; }
StampedLaunch eager() { return {-1, false}; }

void check_time(const profile::StampedTime& t, uint64_t start, uint64_t exclusive_start, uint64_t end) {
  CHECK(t.timed);
  CHECK(t.start_ns == start);
  CHECK(t.exclusive_start_ns == exclusive_start);
  CHECK(t.end_ns == end);
}

}  // namespace

TEST_CASE("launch stamps: a replay's kernels run from their own release to their successor's",
          "[cpu][profile][stamps]") {
  // Three kernels, each launched early (start) and released when its predecessor ended; the closing kernel's
  // release is the last one's end.
  const std::vector<StampedLaunch> launches = {in_replay(0), in_replay(0), in_replay(0), closing(0)};
  const std::vector<LaunchStamp> slots = {{1000, 1010}, {1005, 1107}, {1100, 1230}, {1200, 1371}};
  const auto times = profile::times_from_launch_stamps(launches, slots);
  REQUIRE(times.aligned);
  CHECK(times.untimed == 0);
  REQUIRE(times.launches.size() == 4);
  check_time(times.launches[0], 1000, 1000, 1107);  // the first of a replay counts from its start
  check_time(times.launches[1], 1005, 1107, 1230);
  check_time(times.launches[2], 1100, 1230, 1371);
  CHECK_FALSE(times.launches[3].timed);  // the closing launch is no row, and not counted as untimed
}

TEST_CASE("launch stamps: a sampled window's lead-in is timed for its successor, and no row is untimed without it",
          "[cpu][profile][stamps]") {
  // A lead-in kernel (uncounted), the sampled kernel, and the launch after it closing the window; then a window cut
  // short (its counted kernel's successor missing) and one of a lead-in alone.
  const auto lead_in = [](int64_t replay) { return StampedLaunch{replay, false, false}; };
  const std::vector<StampedLaunch> launches = {lead_in(0), in_replay(0), closing(0), in_replay(1), lead_in(2)};
  const std::vector<LaunchStamp> slots = {{1000, 1010}, {1005, 1107}, {1100, 1230}, {2000, 2010}, {3000, 3010}};
  const auto times = profile::times_from_launch_stamps(launches, slots);
  REQUIRE(times.aligned);
  check_time(times.launches[0], 1000, 1000, 1107);  // timed: its end clips the sampled kernel's start
  check_time(times.launches[1], 1005, 1107, 1230);
  CHECK_FALSE(times.launches[3].timed);
  CHECK_FALSE(times.launches[4].timed);
  CHECK(times.untimed == 1);  // the counted kernel without a successor; the lone lead-in is no row
}

TEST_CASE("launch stamps: a kernel beside its predecessor ends that one with its closing wait",
          "[cpu][profile][stamps]") {
  // a (waits), b (beside a: starts at once, waits at its end), c (waits for b), closing kernel. b's release slot comes
  // after c's start slot, as it can on the GPU: the two kinds of slot are matched separately.
  const std::vector<StampedLaunch> launches = {in_replay(3), in_replay(3), in_replay(3), closing(3)};
  const std::vector<LaunchStamp> slots = {{100, 120}, {130, 0}, {140, 420}, {0, 300}, {400, 515}};
  const auto times = profile::times_from_launch_stamps(launches, slots);
  REQUIRE(times.aligned);
  CHECK(times.untimed == 0);
  check_time(times.launches[0], 100, 100, 300);  // a ends when b's closing wait returned
  check_time(times.launches[1], 130, 300, 420);  // b extends the stream from a's end to c's release
  check_time(times.launches[2], 140, 420, 515);
}

TEST_CASE("launch stamps: a replay's first kernel beside nothing counts from its start", "[cpu][profile][stamps]") {
  const std::vector<StampedLaunch> launches = {in_replay(0), in_replay(0), closing(0)};
  const std::vector<LaunchStamp> slots = {{500, 0}, {0, 560}, {520, 700}, {690, 800}};
  const auto times = profile::times_from_launch_stamps(launches, slots);
  REQUIRE(times.aligned);
  check_time(times.launches[0], 500, 500, 700);
  check_time(times.launches[1], 520, 700, 800);
}

TEST_CASE("launch stamps: only a successor in the same replay gives a kernel its end", "[cpu][profile][stamps]") {
  // Replay 0 (two kernels and its closing one), an eager launch after a host gap, replay 1 (one kernel, closed).
  const std::vector<StampedLaunch> launches = {in_replay(0), in_replay(0), closing(0),
                                               eager(),      in_replay(1), closing(1)};
  const std::vector<LaunchStamp> slots = {{10, 11}, {12, 40}, {30, 55}, {900, 901}, {950, 951}, {960, 990}};
  const auto times = profile::times_from_launch_stamps(launches, slots);
  REQUIRE(times.aligned);
  CHECK(times.untimed == 1);  // the eager launch: what follows it does not see its end
  check_time(times.launches[0], 10, 10, 40);
  check_time(times.launches[1], 12, 40, 55);
  CHECK_FALSE(times.launches[3].timed);
  check_time(times.launches[4], 950, 950, 990);
}

TEST_CASE("launch stamps: slots that do not line up with the launches time nothing", "[cpu][profile][stamps]") {
  const std::vector<StampedLaunch> launches = {in_replay(0), in_replay(0), in_replay(0), closing(0)};
  SECTION("a start slot missing (a full ring, a kernel that does not stamp)") {
    const std::vector<LaunchStamp> slots = {{1, 2}, {3, 0}, {0, 9}};
    const auto times = profile::times_from_launch_stamps(launches, slots);
    CHECK_FALSE(times.aligned);
    CHECK(times.untimed == 3);  // every launch but the closing one
    for (const auto& t : times.launches) CHECK_FALSE(t.timed);
  }
  SECTION("a release slot missing") {
    const std::vector<LaunchStamp> slots = {{1, 2}, {3, 0}, {4, 9}, {10, 12}};
    const auto times = profile::times_from_launch_stamps(launches, slots);
    CHECK_FALSE(times.aligned);
    CHECK(times.untimed == 3);
  }
  SECTION("no launches, no slots") {
    const auto times = profile::times_from_launch_stamps({}, {});
    CHECK(times.aligned);
    CHECK(times.untimed == 0);
  }
}

TEST_CASE("launch stamps: the slots' order does not matter, their times do", "[cpu][profile][stamps]") {
  // Kernels take slots in whatever order their atomics land: the same slots shuffled give the same times.
  const std::vector<StampedLaunch> launches = {in_replay(3), in_replay(3), in_replay(3), closing(3)};
  const std::vector<LaunchStamp> in_order = {{100, 120}, {130, 0}, {140, 420}, {0, 300}, {400, 515}};
  const std::vector<LaunchStamp> shuffled = {{400, 515}, {0, 300}, {140, 420}, {100, 120}, {130, 0}};
  const auto a = profile::times_from_launch_stamps(launches, in_order);
  const auto b = profile::times_from_launch_stamps(launches, shuffled);
  REQUIRE(a.aligned);
  REQUIRE(b.aligned);
  for (size_t k = 0; k < launches.size(); ++k) {
    CHECK(a.launches[k].timed == b.launches[k].timed);
    CHECK(a.launches[k].start_ns == b.launches[k].start_ns);
    CHECK(a.launches[k].exclusive_start_ns == b.launches[k].exclusive_start_ns);
    CHECK(a.launches[k].end_ns == b.launches[k].end_ns);
  }
}

TEST_CASE("launch stamps: a release before its predecessor's is no time", "[cpu][profile][stamps]") {
  // The second kernel's release precedes the first's, which no stream can do: the kernel whose length would come out
  // negative is left untimed rather than given one.
  const std::vector<StampedLaunch> launches = {in_replay(0), in_replay(0), in_replay(0), closing(0)};
  const std::vector<LaunchStamp> slots = {{10, 50}, {12, 40}, {30, 70}, {60, 90}};
  const auto times = profile::times_from_launch_stamps(launches, slots);
  REQUIRE(times.aligned);
  CHECK(times.untimed == 1);
  CHECK_FALSE(times.launches[0].timed);
  check_time(times.launches[1], 12, 40, 70);
  check_time(times.launches[2], 30, 70, 90);
}
