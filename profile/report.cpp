#include "profile/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "profile/ceilings_json.h"

namespace nt::profile {

namespace {

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// The JSON files are written by nlohmann/json, which escapes strings; members keep the order they are added in.
using Json = nlohmann::ordered_json;

// A name or a device that is not UTF-8 (JSON strings must be) is written with U+FFFD in place of the bad bytes
// rather than failing the report.
std::string dumped(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

// A JSON number rounded to `decimals` places, as the files have always printed it (no timer resolves finer), or
// null where there is none (JSON has no NaN or infinity). nlohmann prints the shortest text that reads back as the
// same double: the rounded value, without trailing zeros ("12.5" where printf's "%.4f" gave "12.5000").
Json number(double v, int decimals) {
  if (!std::isfinite(v)) return nullptr;
  const double scale = std::pow(10.0, decimals);
  const double rounded = std::round(v * scale) / scale;
  return std::isfinite(rounded) ? rounded : v;
}
// A count held in a double (bytes, flops): an integer in JSON, as "%.0f" printed it.
Json count(double v) {
  if (!std::isfinite(v)) return nullptr;
  const double rounded = std::round(v);
  if (rounded >= 0 && rounded < 0x1p64) return static_cast<uint64_t>(rounded);
  if (rounded < 0 && rounded >= -0x1p63) return static_cast<int64_t>(rounded);
  return rounded;
}

double pct(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }

// ---- the table -------------------------------------------------------------------------------------

struct Column {
  const char* title;
  bool right;  // numbers right-aligned, names left-aligned
};
const Column kColumns[] = {{"Kernel", false}, {"Phase", false}, {"Layer", false},  {"Time %", true}, {"Total ms", true},
                           {"Calls", true},   {"Avg us", true}, {"Span us", true}, {"Min us", true}, {"Max us", true},
                           {"GB/s", true},    {"BW %", true},   {"GFLOP/s", true}, {"Math", false},  {"FLOP %", true}};
constexpr size_t kColumnCount = std::size(kColumns);

// The measured rate a row's flops are set against; 0 when unknown.
double flop_ceiling(const std::optional<Ceilings>& c, Math math) {
  if (!c) return 0;
  switch (math) {
    case Math::fp32:
      return c->fp32_gflop_per_s;
    case Math::tf32:
      return c->tf32_gflop_per_s;
    case Math::bf16:
      return c->bf16_gflop_per_s;
  }
  return 0;
}
double copy_ceiling(const std::optional<Ceilings>& c) { return c ? c->copy_gb_per_s : 0; }

// A share of a ceiling, or "" where either side is unknown.
std::string share(double rate, double ceiling) {
  return rate > 0 && ceiling > 0 ? fmt("%.1f", pct(rate, ceiling)) : "";
}

std::vector<std::string> table_cells(const Row& r, const ProfileData& d) {
  auto or_dash = [](const std::string& s) { return s.empty() ? std::string("-") : s; };
  const bool part = !r.part.empty();  // a stamped phase of the kernel above: its time lies inside the kernel's
  return {part ? "  > " + r.part : r.kernel + (r.overlaps_previous ? " *" : ""),
          part ? "" : or_dash(r.phase),
          part ? "" : or_dash(r.layer),
          fmt("%.1f", pct(r.total_us, d.kernel_us())),
          fmt("%.3f", r.total_us / 1e3),
          std::to_string(r.calls),
          fmt("%.2f", r.avg_us()),
          part ? "" : fmt("%.2f", r.avg_span_us()),
          fmt("%.2f", r.min_us),
          fmt("%.2f", r.max_us),
          r.bytes > 0 ? fmt("%.1f", r.gb_per_s()) : "",
          share(r.gb_per_s(), copy_ceiling(d.ceilings)),
          r.flops > 0 ? fmt("%.1f", r.gflop_per_s()) : "",
          r.flops > 0 ? math_name(r.math) : "",
          share(r.gflop_per_s(), flop_ceiling(d.ceilings, r.math))};
}

std::string table_line(const std::vector<std::string>& cells, const std::vector<size_t>& width) {
  std::string line;
  for (size_t c = 0; c < kColumnCount; ++c) {
    if (c) line += " | ";
    const std::string pad(width[c] - cells[c].size(), ' ');
    line += kColumns[c].right ? pad + cells[c] : cells[c] + (c + 1 < kColumnCount ? pad : "");
  }
  return line + "\n";
}

// ---- the trace -------------------------------------------------------------------------------------

enum Track { kStepTrack = 1, kPhaseTrack = 2, kLayerTrack = 3, kKernelTrack = 4 };

std::string complete_event(std::string_view name, const char* cat, int track, double ts, double dur,
                           Json args = nullptr) {
  Json e{{"name", name},
         {"cat", cat},
         {"ph", "X"},
         {"pid", 1},
         {"tid", track},
         {"ts", number(ts, 3)},
         {"dur", number(std::max(dur, 0.0), 3)}};
  if (!args.is_null()) e["args"] = std::move(args);
  return dumped(e);
}

std::string track_name(int track, const char* name) {
  return dumped({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", track}, {"args", {{"name", name}}}}) +
         ",\n" +
         dumped({{"name", "thread_sort_index"},
                 {"ph", "M"},
                 {"pid", 1},
                 {"tid", track},
                 {"args", {{"sort_index", track}}}});
}

// Consecutive launches under the same opening of a scope form one range on that scope's track.
struct RangeBuilder {
  const char* cat;
  int track;
  uint64_t id = 0;
  int name = kNoName;
  double start = 0, end = 0;

  void add(uint64_t launch_id, int launch_name, double ts, double te, const ProfileData& d,
           std::vector<std::string>& out) {
    if (launch_id != id) {
      finish(d, out);
      id = launch_id, name = launch_name, start = ts, end = te;
    } else {
      end = std::max(end, te);
    }
  }
  void finish(const ProfileData& d, std::vector<std::string>& out) {
    if (id != 0) out.push_back(complete_event(d.name(name), cat, track, start, end - start));
    id = 0;
  }
};

// ---- files -----------------------------------------------------------------------------------------

void write_atomically(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent))
    throw Error(cat("--profile-out: folder '", parent.string(), "' does not exist"));
  write_file_atomically(path, text, "--profile-out");
}

}  // namespace

std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

std::string format_table(const ProfileData& d) {
  const auto rows = d.rows();
  std::vector<std::vector<std::string>> cells;
  std::vector<size_t> width(kColumnCount);
  for (size_t c = 0; c < kColumnCount; ++c) width[c] = std::string_view(kColumns[c].title).size();
  for (const Row& r : rows) {
    cells.push_back(table_cells(r, d));
    for (size_t c = 0; c < kColumnCount; ++c) width[c] = std::max(width[c], cells.back()[c].size());
  }
  std::vector<std::string> titles;
  std::string rule;
  for (size_t c = 0; c < kColumnCount; ++c) {
    titles.push_back(kColumns[c].title);
    rule += (c ? "-+-" : "") + std::string(width[c], '-');
  }
  std::string out = table_line(titles, width) + rule + "\n";
  for (const auto& row : cells) out += table_line(row, width);
  return out;
}

std::string format_totals(const ProfileData& d) {
  const double kernel_ms = d.kernel_us() / 1e3, wall_ms = d.wall_us / 1e3;
  const auto launches = std::to_string(d.launch_count());
  std::string out;
  if (d.sample_every > 1 && d.sampled_steps > 0) {
    // The wall clock covers every step and the kernel time only the sampled ones: scale the sample up.
    const double all_ms = kernel_ms * static_cast<double>(d.steps) / static_cast<double>(d.sampled_steps);
    out = "sampled: 1 step in " + std::to_string(d.sample_every) + ", " + std::to_string(d.sampled_steps) + " of " +
          std::to_string(d.steps) + " steps timed (launches outside steps are not)\n" + "kernel time " +
          fmt("%.3f", kernel_ms) + " ms in " + launches + " launches, about " + fmt("%.3f", all_ms) +
          " ms over all steps | wall clock " + fmt("%.3f", wall_ms) + " ms | kernels busy about " +
          fmt("%.1f", pct(all_ms, wall_ms)) + "% of it\n";
  } else {
    out = "kernel time " + fmt("%.3f", kernel_ms) + " ms in " + launches + " launches | wall clock " +
          fmt("%.3f", wall_ms) + " ms | kernels busy " + fmt("%.1f", pct(kernel_ms, wall_ms)) + "% of it, gaps " +
          fmt("%.3f", std::max(wall_ms - kernel_ms, 0.0)) + " ms (launch overhead, host work, idle device)\n";
  }
  if (d.timer != "host")
    out +=
        "times: exclusive (Avg us; what Time % and the rates use) from the later of a kernel's start and its "
        "stream predecessor's end; span (Span us) from its start, overlap included\n";
  for (const Row& r : d.rows())
    if (r.overlaps_previous) {
      out +=
          "* runs beside its predecessor: its exclusive time is how far it extends the stream, not its length "
          "(its span is)\n";
      break;
    }
  if (d.ceilings)
    out += "roofline: BW % and FLOP % of this GPU's measured ceilings: " + describe(*d.ceilings) + "\n";
  else if (d.timer != "host")
    out += "roofline: this GPU's ceilings are not measured (nanotrain devices --measure): no BW % or FLOP %\n";
  if (d.stamps_lost > 0)
    out += "warning: " + std::to_string(d.stamps_lost) +
           " phase stamps could not be placed (buffer full, or a "
           "launch without its end mark)\n";
  return out + "profiler: " + std::to_string(d.synchronizations) + " synchronization" +
         (d.synchronizations == 1 ? "" : "s") + " for " + launches + " launches" +
         (d.device.empty() ? "" : ", device " + d.device) + (d.timer.empty() ? "" : ", timer " + d.timer) + "\n" +
         (d.launches_without_record > 0
              ? "warning: " + std::to_string(d.launches_without_record) +
                    (d.timer == "launch stamps" ? " launches without a time (launched eagerly, outside a replayed "
                                                  "graph, or stamps lost; in no row of the table)\n"
                                                : " launches without a CUPTI record (in no row of the table)\n")
              : "");
}

namespace {

struct StepFloor {  // the steps of one name: the medians of their summaries, and their average cost against the
                    // ceilings
  int name = kNoName;
  std::vector<double> exclusive_us, wall_us, idle_us, overlap_us;  // one per step
  double flops[3] = {0, 0, 0};                                     // per Math, per step
  double bytes = 0;                                                // per step
  double own_roofs_us = 0;  // per step: each kernel at its own roof, one after another
  int64_t steps() const { return static_cast<int64_t>(wall_us.size()); }
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

double floor_us(double flops, double gflop_per_s) { return gflop_per_s > 0 ? flops / (gflop_per_s * 1e3) : 0; }

std::vector<StepFloor> step_floors(const ProfileData& d, const std::vector<StepSummary>& summaries) {
  std::vector<StepFloor> out;  // in the order the names first ran
  const auto floor_of = [&](int name) -> StepFloor& {
    for (StepFloor& f : out)
      if (f.name == name) return f;
    StepFloor& f = out.emplace_back();
    f.name = name;
    return f;
  };
  for (const StepSummary& s : summaries) {
    StepFloor& f = floor_of(s.name);
    f.exclusive_us.push_back(s.exclusive_us), f.wall_us.push_back(s.wall_us);
    f.idle_us.push_back(s.idle_us), f.overlap_us.push_back(s.overlap_us);
  }
  for (const Launch& l : d.launches()) {
    if (l.step_id == 0) continue;
    StepFloor& f = floor_of(l.step);
    f.flops[static_cast<int>(l.cost.math)] += l.cost.flops;
    f.bytes += l.cost.bytes;
    f.own_roofs_us += std::max(floor_us(l.cost.flops, flop_ceiling(d.ceilings, l.cost.math)),
                               floor_us(l.cost.bytes, copy_ceiling(d.ceilings)));
  }
  for (StepFloor& f : out) {
    const double n = std::max<double>(static_cast<double>(f.steps()), 1);
    for (double& x : f.flops) x /= n;
    f.bytes /= n;
    f.own_roofs_us /= n;
  }
  return out;
}

}  // namespace

std::string format_steps(const ProfileData& d, size_t max_lines) {
  const auto summaries = d.step_summaries();
  if (summaries.empty()) return "";
  std::string out =
      "per step: exclusive = the sum of its kernels' exclusive times; wall = from its first kernel's exclusive start "
      "to its last end (idle: no kernel resident); overlap = span time beside another kernel of the step\n";
  std::map<std::string, int64_t> numbered;
  for (size_t i = 0; i < summaries.size() && i < max_lines; ++i) {
    const StepSummary& s = summaries[i];
    out += "  " + d.name(s.name) + " " + std::to_string(++numbered[d.name(s.name)]) + ": " + std::to_string(s.kernels) +
           " kernels | exclusive " + fmt("%.2f", s.exclusive_us) + " us | wall " + fmt("%.2f", s.wall_us) +
           " us, idle " + fmt("%.2f", s.idle_us) + " | overlap " + fmt("%.2f", s.overlap_us) + " us\n";
  }
  if (summaries.size() > max_lines)
    out += "  ... " + std::to_string(summaries.size() - max_lines) + " more steps (all of them in the JSON file)\n";
  for (const StepFloor& f : step_floors(d, summaries)) {
    const std::string& name = d.name(f.name);
    const double median_wall_us = median(f.wall_us);
    out += "median " + name + " (" + std::to_string(f.steps()) + "): exclusive " + fmt("%.2f", median(f.exclusive_us)) +
           " us | wall " + fmt("%.2f", median_wall_us) + " us, idle " + fmt("%.2f", median(f.idle_us)) + " | overlap " +
           fmt("%.2f", median(f.overlap_us)) + " us\n";
    if (!d.ceilings) continue;
    std::string compute;
    double compute_us = 0;
    for (Math m : {Math::fp32, Math::tf32, Math::bf16}) {
      const double flops = f.flops[static_cast<int>(m)];
      if (flops <= 0) continue;
      const double rate = flop_ceiling(d.ceilings, m), us = floor_us(flops, rate);
      compute_us += us;
      compute +=
          fmt("%.1f", flops / 1e6) + " MFLOP " + math_name(m) +
          (rate > 0 ? " in " + fmt("%.2f", us) + " us at " + fmt("%.1f", rate / 1e3) + " TFLOP/s" : " (no ceiling)") +
          " | ";
    }
    const double memory_us = floor_us(f.bytes, copy_ceiling(d.ceilings));
    const double floor = std::max(compute_us, memory_us);
    out += "floor of each " + name + ": " + compute + fmt("%.2f", f.bytes / 1e6) + " MB in " + fmt("%.2f", memory_us) +
           " us at " + fmt("%.0f", copy_ceiling(d.ceilings)) + " GB/s | floor " + fmt("%.2f", floor) + " us (" +
           (compute_us >= memory_us ? "compute" : "memory") + ") against " + fmt("%.2f", median_wall_us) +
           " us wall: " + (floor > 0 ? fmt("%.1f", median_wall_us / floor) + "x" : std::string("-")) +
           "; each kernel at its own roof, one after another: " + fmt("%.2f", f.own_roofs_us) + " us\n";
  }
  return out;
}

std::string to_csv(const ProfileData& d) {
  std::string out =
      "kernel,phase,layer,part,time_pct,total_ms,calls,avg_us,avg_span_us,min_us,max_us,gb_per_s,bw_pct,gflop_per_s,"
      "flop_pct,math\n";
  for (const Row& r : d.rows()) {
    out += csv_field(r.kernel) + "," + csv_field(r.phase) + "," + csv_field(r.layer) + "," + csv_field(r.part) + "," +
           fmt("%.3f", pct(r.total_us, d.kernel_us())) + "," + fmt("%.6f", r.total_us / 1e3) + "," +
           std::to_string(r.calls) + "," + fmt("%.4f", r.avg_us()) + "," + fmt("%.4f", r.avg_span_us()) + "," +
           fmt("%.4f", r.min_us) + "," + fmt("%.4f", r.max_us) + "," + (r.bytes > 0 ? fmt("%.3f", r.gb_per_s()) : "") +
           "," + share(r.gb_per_s(), copy_ceiling(d.ceilings)) + "," +
           (r.flops > 0 ? fmt("%.3f", r.gflop_per_s()) : "") + "," +
           share(r.gflop_per_s(), flop_ceiling(d.ceilings, r.math)) + "," + (r.flops > 0 ? math_name(r.math) : "") +
           "\n";
  }
  return out;
}

std::string to_json(const ProfileData& d) {
  const auto or_null = [](double rate, double ceiling) -> Json {
    return rate > 0 && ceiling > 0 ? number(pct(rate, ceiling), 3) : Json(nullptr);
  };
  Json kernels = Json::array();
  for (const Row& r : d.rows()) {
    kernels.push_back({{"kernel", r.kernel},
                       {"phase", r.phase},
                       {"layer", r.layer},
                       {"part", r.part},
                       {"time_pct", number(pct(r.total_us, d.kernel_us()), 3)},
                       {"total_ms", number(r.total_us / 1e3, 6)},
                       {"calls", r.calls},
                       {"avg_us", number(r.avg_us(), 4)},
                       {"avg_span_us", number(r.avg_span_us(), 4)},
                       {"min_us", number(r.min_us, 4)},
                       {"max_us", number(r.max_us, 4)},
                       {"bytes", count(r.bytes)},
                       {"flops", count(r.flops)},
                       {"math", math_name(r.math)},
                       {"overlaps_previous", r.overlaps_previous},
                       {"gb_per_s", r.bytes > 0 ? number(r.gb_per_s(), 3) : nullptr},
                       {"bw_pct", or_null(r.gb_per_s(), copy_ceiling(d.ceilings))},
                       {"gflop_per_s", r.flops > 0 ? number(r.gflop_per_s(), 3) : nullptr},
                       {"flop_pct", or_null(r.gflop_per_s(), flop_ceiling(d.ceilings, r.math))}});
  }
  Json steps = Json::array();
  for (const StepSummary& st : d.step_summaries())
    steps.push_back({{"step", d.name(st.name)},
                     {"kernels", st.kernels},
                     {"start_us", number(st.start_us, 3)},
                     {"exclusive_us", number(st.exclusive_us, 3)},
                     {"span_us", number(st.span_us, 3)},
                     {"wall_us", number(st.wall_us, 3)},
                     {"idle_us", number(st.idle_us, 3)},
                     {"overlap_us", number(st.overlap_us, 3)}});
  Json ceilings = d.ceilings ? ceilings_json(*d.ceilings) : Json(nullptr);
  const Json report{{"device", d.device},
                    {"wall_ms", number(d.wall_us / 1e3, 6)},
                    {"kernel_ms", number(d.kernel_us() / 1e3, 6)},
                    {"launches", d.launch_count()},
                    {"synchronizations", d.synchronizations},
                    {"timer", d.timer},
                    {"launches_without_record", d.launches_without_record},
                    {"stamps_lost", d.stamps_lost},
                    {"sample_every", d.sample_every},
                    {"steps", d.steps},
                    {"sampled_steps", d.sampled_steps},
                    {"ceilings", std::move(ceilings)},
                    {"kernels", std::move(kernels)},
                    {"step_summaries", std::move(steps)}};
  return dumped(report, 2) + "\n";
}

// The trace is written one event per line, each event dumped on its own, rather than as one document: a trace holds
// up to max_trace_launches (2 million) events, and a document of them would take several times the memory of their
// text.
//
// Kernels: each launch is a slice of its span on a track of its stream. A launch whose span begins before the
// previous one on the stream's first track has ended (programmatic dependent launch, or a kernel declared to overlap
// its predecessor) goes to the stream's next free track, so overlapping kernels sit side by side; within the slice, a
// child slice "waits" covers the time before its exclusive start, and the phases it stamped are child slices too. A
// flow arrow runs from each launch's stream predecessor to the launch: the kernel it waits on.
std::string to_trace_json(const ProfileData& d) {
  const auto& launches = d.launches();
  // Tracks: per stream, lanes in order of need.
  std::vector<int> lane(launches.size(), 0);
  std::vector<std::vector<double>> lane_end;  // [stream][lane]: the end of its last slice
  int streams = 0;
  for (size_t i = 0; i < launches.size(); ++i) {
    const Launch& l = launches[i];
    const auto s = static_cast<size_t>(std::max(l.stream, 0));
    if (lane_end.size() <= s) lane_end.resize(s + 1);
    streams = std::max(streams, static_cast<int>(s) + 1);
    auto& ends = lane_end[s];
    size_t k = 0;
    while (k < ends.size() && ends[k] > l.start_us) ++k;
    if (k == ends.size()) ends.push_back(0);
    ends[k] = l.end_us();
    lane[i] = static_cast<int>(k);
  }
  // Rounding to the nanosecond must not let a slice end after the next one on its track starts, or viewers mis-nest.
  std::vector<double> shown_end(launches.size());
  {
    std::vector<std::vector<size_t>> last_on(lane_end.size());  // [stream][lane]: its previous launch
    for (size_t s = 0; s < lane_end.size(); ++s) last_on[s].assign(lane_end[s].size(), SIZE_MAX);
    for (size_t i = 0; i < launches.size(); ++i) {
      shown_end[i] = launches[i].end_us();
      size_t& prev = last_on[static_cast<size_t>(std::max(launches[i].stream, 0))][static_cast<size_t>(lane[i])];
      if (prev != SIZE_MAX) shown_end[prev] = std::min(shown_end[prev], launches[i].start_us);
      prev = i;
    }
  }
  constexpr int kLanes = 64;  // tracks per stream, at most
  const auto kernel_track = [&](int stream, int l) {
    return kKernelTrack + std::max(stream, 0) * kLanes + std::min(l, kLanes - 1);
  };

  std::vector<std::string> events{
      dumped({{"name", "process_name"},
              {"ph", "M"},
              {"pid", 1},
              {"args", {{"name", "nanotrain" + (d.device.empty() ? "" : " " + d.device)}}}}),
      track_name(kStepTrack, "steps"), track_name(kPhaseTrack, "phases"), track_name(kLayerTrack, "layers")};
  for (int s = 0; s < streams; ++s)
    for (size_t k = 0; k < lane_end[static_cast<size_t>(s)].size() && k < kLanes; ++k)
      events.push_back(
          track_name(kernel_track(s, static_cast<int>(k)),
                     ("stream " + std::to_string(s) + (k ? ", beside " + std::to_string(k) : "")).c_str()));

  RangeBuilder steps{"step", kStepTrack}, phases{"phase", kPhaseTrack}, layers{"layer", kLayerTrack};
  std::vector<size_t> previous_on_stream(static_cast<size_t>(streams), SIZE_MAX);
  // The stamped phases by launch, walked alongside the launches.
  const auto& parts = d.parts();
  std::vector<size_t> part_order(parts.size());
  for (size_t p = 0; p < parts.size(); ++p) part_order[p] = p;
  std::stable_sort(part_order.begin(), part_order.end(),
                   [&](size_t a, size_t b) { return parts[a].launch < parts[b].launch; });
  size_t next_part = 0;
  for (size_t i = 0; i < launches.size(); ++i) {
    const Launch& l = launches[i];
    const int track = kernel_track(l.stream, lane[i]);
    const double start = l.start_us, end = std::max(shown_end[i], start);
    const double exclusive_start = std::clamp(l.exclusive_start_us(), start, end);
    steps.add(l.step_id, l.step, exclusive_start, end, d, events);
    phases.add(l.phase_id, l.phase, exclusive_start, end, d, events);
    layers.add(l.layer_id, l.layer, exclusive_start, end, d, events);
    Json args{{"phase", d.name(l.phase)},     {"layer", d.name(l.layer)},
              {"stream", l.stream},           {"exclusive_us", number(l.exclusive_us, 3)},
              {"bytes", count(l.cost.bytes)}, {"flops", count(l.cost.flops)}};
    if (l.cost.flops > 0) args["math"] = math_name(l.cost.math);
    if (l.cost.overlaps_previous) args["overlaps_previous"] = true;
    events.push_back(complete_event(d.name(l.kernel), "kernel", track, start, end - start, std::move(args)));
    if (exclusive_start > start + 5e-4)  // resident before its predecessor ended (not a rounding difference)
      events.push_back(complete_event("waits", "wait", track, start, exclusive_start - start));
    for (; next_part < part_order.size() && parts[part_order[next_part]].launch == i; ++next_part) {
      const PhaseSlice& part = parts[part_order[next_part]];
      const double from = std::clamp(part.start_us, exclusive_start, end);
      const double to = std::clamp(part.start_us + part.dur_us, from, end);
      events.push_back(complete_event(d.name(part.part), "kernel_phase", track, from, to - from,
                                      Json{{"dur_us", number(part.dur_us, 3)}}));
    }
    size_t& prev = previous_on_stream[static_cast<size_t>(std::max(l.stream, 0))];
    if (prev != SIZE_MAX) {  // the arrow from the kernel it waits on: leaves the end of its slice, lands in this one
      const double from = std::max(shown_end[prev] - 0.001, launches[prev].start_us);
      const Json id = static_cast<uint64_t>(i);
      events.push_back(dumped({{"name", "waits on"},
                               {"cat", "dependency"},
                               {"ph", "s"},
                               {"id", id},
                               {"pid", 1},
                               {"tid", kernel_track(launches[prev].stream, lane[prev])},
                               {"ts", number(from, 3)}}));
      events.push_back(dumped({{"name", "waits on"},
                               {"cat", "dependency"},
                               {"ph", "f"},
                               {"bp", "e"},
                               {"id", id},
                               {"pid", 1},
                               {"tid", track},
                               {"ts", number(exclusive_start, 3)}}));
    }
    prev = i;
  }
  steps.finish(d, events), phases.finish(d, events), layers.finish(d, events);

  const Json other{{"device", d.device},
                   {"timer", d.timer},
                   {"launches", d.launch_count()},
                   {"launches_not_in_trace", d.dropped()},
                   {"streams", streams}};
  std::string out = "{\"displayTimeUnit\":\"ms\",\n\"otherData\":" + dumped(other) + ",\n\"traceEvents\":[\n";
  for (size_t i = 0; i < events.size(); ++i) out += events[i] + (i + 1 < events.size() ? ",\n" : "\n");
  return out + "]}\n";
}

void write_files(const ProfileData& d, const std::string& prefix) {
  if (prefix.empty()) throw Error("--profile-out: empty prefix");
  write_atomically(prefix + ".csv", to_csv(d));
  write_atomically(prefix + ".json", to_json(d));
  write_atomically(prefix + ".trace.json", to_trace_json(d));
}

}  // namespace nt::profile
