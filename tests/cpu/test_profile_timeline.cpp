// The profiler's view of overlap, without a GPU: span and exclusive time in rows and step summaries, the Chrome
// trace's tracks and flow arrows, phase stamps split into slices and child rows, and the roofline columns and step
// floors against given ceilings. Launches are synthetic, with times chosen so that every expected figure can be
// worked out by hand.
#include "test_support.h"

#include <algorithm>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "profile/phase_stamps.h"
#include "profile/profile_data.h"
#include "profile/report.h"

using namespace nt;

namespace {

// A launch on `stream` whose span is [start, end) and whose exclusive time starts at exclusive_start.
profile::Launch span(profile::ProfileData& d, const char* kernel, uint64_t step_id, double start,
                     double exclusive_start, double end, int stream = 0, profile::OpCost cost = {}) {
  profile::Launch l;
  l.kernel = d.intern(kernel);
  l.step = d.intern("train_step"), l.step_id = step_id;
  l.phase = d.intern("forward"), l.phase_id = step_id;
  l.stream = stream;
  l.start_us = start, l.span_us = end - start, l.exclusive_us = end - exclusive_start;
  l.cost = cost;
  return l;
}

std::vector<nlohmann::json> events_of(const nlohmann::json& trace, const char* cat) {
  std::vector<nlohmann::json> out;
  for (const auto& e : trace["traceEvents"])
    if (e.contains("cat") && e["cat"] == cat) out.push_back(e);
  return out;
}

}  // namespace

TEST_CASE("rows sum exclusive times and keep spans beside them", "[cpu][profile]") {
  profile::ProfileData d;
  d.add(span(d, "a", 1, 0, 0, 10));
  d.add(span(d, "b", 1, 6, 10, 14));  // resident from 6, its own time from 10
  const auto rows = d.rows();
  REQUIRE(rows.size() == 2);
  CHECK(rows[1].kernel == "b");
  CHECK(rows[1].total_us == 4);
  CHECK(rows[1].avg_span_us() == 8);
  CHECK(d.kernel_us() == 14);  // exclusive times never add up to more than the stream was busy
}

TEST_CASE("a step's summary: exclusive sum, wall, idle and overlap", "[cpu][profile]") {
  profile::ProfileData d;
  // Step 1 on one stream: a [0,10); b resident from 6, runs [10,14); a gap; c [15,20).
  d.add(span(d, "a", 1, 0, 0, 10));
  d.add(span(d, "b", 1, 6, 10, 14));
  d.add(span(d, "c", 1, 15, 15, 20));
  // Step 2: its first kernel overlaps the end of step 1 (a gather beside the update): resident from 18.
  d.add(span(d, "a", 2, 18, 20, 30));
  const auto steps = d.step_summaries();
  REQUIRE(steps.size() == 2);
  const auto& s = steps[0];
  CHECK(s.kernels == 3);
  CHECK(s.exclusive_us == 10 + 4 + 5);
  CHECK(s.span_us == 10 + 8 + 5);
  CHECK(s.wall_us == 20);                          // from 0 to 20
  CHECK(s.idle_us == 1);                           // [14, 15)
  CHECK(s.overlap_us == 4);                        // b's [6, 10) beside a
  CHECK(s.exclusive_us + s.idle_us == s.wall_us);  // one stream: the wall is its kernels' own times and its gaps
  CHECK(steps[1].start_us == 20);                  // its exclusive start, after step 1's last end
  CHECK(steps[1].wall_us == 10);
  CHECK(steps[1].overlap_us == 0);  // beside step 1's kernel, not one of its own

  const std::string text = profile::format_steps(d);
  INFO(text);
  CHECK(text.find("train_step 1: 3 kernels | exclusive 19.00 us | wall 20.00 us, idle 1.00 | overlap 4.00 us") !=
        std::string::npos);
  CHECK(text.find("median train_step (2):") != std::string::npos);
  CHECK(text.find("floor of") == std::string::npos);  // no ceilings: no floor
  CHECK(profile::format_steps(d, 1).find("1 more steps") != std::string::npos);
  const auto json = nlohmann::json::parse(profile::to_json(d));
  REQUIRE(json["step_summaries"].size() == 2);
  CHECK(json["step_summaries"][0]["overlap_us"] == 4.0);
}

TEST_CASE("the trace puts overlapping kernels on separate tracks, with an arrow to the kernel each waits on",
          "[cpu][profile]") {
  profile::ProfileData d;
  d.add(span(d, "a", 1, 0, 0, 10));
  d.add(span(d, "b", 1, 6, 10, 14));              // overlaps a: a second track
  d.add(span(d, "c", 1, 12, 14, 20));             // overlaps b but not a: back on the first
  d.add(span(d, "x", 1, 2, 2, 8, /*stream=*/1));  // another stream: its own track
  const auto trace = nlohmann::json::parse(profile::to_trace_json(d));
  INFO(trace.dump(1));
  std::map<std::string, nlohmann::json> kernel;
  for (const auto& e : events_of(trace, "kernel")) kernel[e["name"]] = e;
  REQUIRE(kernel.size() == 4);
  CHECK(kernel["a"]["tid"] == kernel["c"]["tid"]);
  CHECK(kernel["b"]["tid"] != kernel["a"]["tid"]);
  CHECK(kernel["x"]["tid"] != kernel["a"]["tid"]);
  CHECK(kernel["x"]["tid"] != kernel["b"]["tid"]);
  CHECK(kernel["b"]["ts"] == 6.0);  // the slice is the span
  CHECK(kernel["b"]["dur"] == 8.0);
  CHECK(kernel["b"]["args"]["exclusive_us"] == 4.0);
  // b's wait before its exclusive start is a child slice on its track
  const auto waits = events_of(trace, "wait");
  REQUIRE(waits.size() == 2);  // b and c started early
  CHECK(waits[0]["tid"] == kernel["b"]["tid"]);
  CHECK(waits[0]["ts"] == 6.0);
  CHECK(waits[0]["dur"] == 4.0);
  // Arrows: a -> b, b -> c on stream 0; x has no predecessor on stream 1.
  const auto flows = events_of(trace, "dependency");
  REQUIRE(flows.size() == 4);
  std::map<uint64_t, std::vector<nlohmann::json>> by_id;
  for (const auto& f : flows) by_id[f["id"]].push_back(f);
  CHECK(by_id.size() == 2);
  for (const auto& [id, pair] : by_id) {
    REQUIRE(pair.size() == 2);
    CHECK(pair[0]["ph"] == "s");
    CHECK(pair[1]["ph"] == "f");
    CHECK(pair[0]["ts"] <= pair[1]["ts"]);
  }
  // Track names: a stream's tracks are named after it.
  std::set<std::string> names;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") names.insert(e["args"]["name"]);
  CHECK(names.count("stream 0"));
  CHECK(names.count("stream 0, beside 1"));
  CHECK(names.count("stream 1"));
  CHECK(trace["otherData"]["streams"] == 2);
}

TEST_CASE("phase stamps split into slices per launch and run, whatever order they arrive in", "[cpu][profile]") {
  using profile::kPhaseEnd;
  // Tag 1 ran twice (a graph replayed twice), with phases 0, 1, 0 (a phase may come back); tag 2 once; tag 3 lost
  // its end.
  std::vector<profile::PhaseStamp> stamps{
      {1000, 1, 0}, {1300, 1, 1},         {1500, 1, 0},         {1600, 1, kPhaseEnd},  // tag 1, first run
      {5000, 1, 0}, {5100, 1, 1},         {5400, 1, kPhaseEnd},                        // tag 1, second run
      {2000, 2, 0}, {2070, 2, kPhaseEnd},                                              // tag 2
      {9000, 3, 0}, {9100, 3, 1}};                                                     // tag 3: no end
  std::reverse(stamps.begin(), stamps.end());
  const auto runs = profile::split_stamps(stamps);
  CHECK(runs.unended == 2);
  REQUIRE(runs.slices.size() == 6);
  const auto& s = runs.slices;
  CHECK((s[0].launch == 1 && s[0].occurrence == 0 && s[0].phase == 0 && s[0].offset_ns == 0 && s[0].dur_ns == 300));
  CHECK((s[1].phase == 1 && s[1].offset_ns == 300 && s[1].dur_ns == 200));
  CHECK((s[2].phase == 0 && s[2].offset_ns == 500 && s[2].dur_ns == 100));
  CHECK((s[3].launch == 1 && s[3].occurrence == 1 && s[3].dur_ns == 100));
  CHECK((s[4].occurrence == 1 && s[4].phase == 1 && s[4].dur_ns == 300));
  CHECK((s[5].launch == 2 && s[5].occurrence == 0 && s[5].dur_ns == 70));
  CHECK(profile::split_stamps({}).slices.empty());
}

TEST_CASE("stamped phases are child rows right after their kernel, and slices inside its slice", "[cpu][profile]") {
  profile::ProfileData d;
  const auto big = span(d, "persistent", 1, 0, 0, 100);
  const size_t at = d.add(big);
  d.add(span(d, "small", 1, 100, 100, 101));
  const int fwd = d.intern("forward pass"), bwd = d.intern("backward pass");
  d.add_part(big, at, bwd, 1, 60, 40);
  d.add_part(big, at, fwd, 0, 0, 30);
  d.add_part(big, at, fwd, 0, 30, 30);
  const auto rows = d.rows();
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].kernel == "persistent");
  CHECK(rows[0].part.empty());
  CHECK(rows[1].part == "forward pass");  // declared order, not time order
  CHECK(rows[1].calls == 2);
  CHECK(rows[1].total_us == 60);
  CHECK(rows[2].part == "backward pass");
  CHECK(rows[3].kernel == "small");
  CHECK(d.kernel_us() == 101);  // the parts are inside their kernel's time, not added to it
  const std::string table = profile::format_table(d);
  INFO(table);
  CHECK(table.find("  > forward pass") != std::string::npos);
  const auto trace = nlohmann::json::parse(profile::to_trace_json(d));
  const auto parts = events_of(trace, "kernel_phase");
  REQUIRE(parts.size() == 3);
  for (const auto& p : parts) {
    CHECK(p["ts"] >= 0.0);
    CHECK(p["ts"].get<double>() + p["dur"].get<double>() <= 100.0);
  }
}

TEST_CASE("roofline: rates as a share of the measured ceilings, by math, and the step's floor", "[cpu][profile]") {
  profile::ProfileData d;
  d.timer = "cupti";
  // 1 MB in 10 us = 100 GB/s; 2 MFLOP fp32 in 10 us = 200 GFLOP/s; a tf32 kernel of 40 MFLOP in 10 us = 4000.
  d.add(span(d, "gemm", 1, 0, 0, 10, 0, {1e6, 2e6}));
  d.add(span(d, "conv", 1, 10, 10, 20, 0, {0, 40e6, profile::Math::tf32}));
  SECTION("not measured: blank shares, and the totals say how to measure") {
    const std::string totals = profile::format_totals(d);
    CHECK(totals.find("nanotrain devices --measure") != std::string::npos);
    CHECK(profile::format_steps(d).find("floor of") == std::string::npos);
  }
  SECTION("measured") {
    profile::Ceilings c;
    c.uuid = "GPU-test", c.device = "test GPU";
    c.copy_gb_per_s = 1000, c.fp32_gflop_per_s = 2000, c.tf32_gflop_per_s = 8000;
    d.ceilings = c;
    const auto json = nlohmann::json::parse(profile::to_json(d));
    INFO(json.dump(1));
    std::map<std::string, nlohmann::json> row;
    for (const auto& r : json["kernels"]) row[r["kernel"]] = r;
    CHECK(row["gemm"]["bw_pct"] == 10.0);
    CHECK(row["gemm"]["flop_pct"] == 10.0);  // against fp32
    CHECK(row["conv"]["flop_pct"] == 50.0);  // against tf32
    CHECK(row["conv"]["math"] == "tf32");
    CHECK(row["conv"]["bw_pct"].is_null());  // no bytes declared
    const std::string table = profile::format_table(d);
    INFO(table);
    CHECK(table.find("tf32") != std::string::npos);
    // The step: 2 MFLOP fp32 = 1 us, 40 MFLOP tf32 = 5 us, 1 MB = 1 us: a floor of 6 us, compute-bound, against a
    // wall of 20 us (3.3x). Each kernel at its own roof: gemm max(1, 1) + conv 5 = 6 us.
    const std::string steps = profile::format_steps(d);
    INFO(steps);
    CHECK(steps.find("floor 6.00 us (compute) against 20.00 us wall: 3.3x") != std::string::npos);
    CHECK(steps.find("each kernel at its own roof, one after another: 6.00 us") != std::string::npos);
    CHECK(profile::format_totals(d).find("measured ceilings") != std::string::npos);
  }
}
