#include "profile/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

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
const Column kColumns[] = {{"Kernel", false},  {"Phase", false}, {"Layer", false}, {"Time %", true},
                           {"Total ms", true}, {"Calls", true},  {"Avg us", true}, {"Min us", true},
                           {"Max us", true},   {"GB/s", true},   {"GFLOP/s", true}};
constexpr size_t kColumnCount = std::size(kColumns);

std::vector<std::string> table_cells(const Row& r, double kernel_us) {
  auto or_dash = [](const std::string& s) { return s.empty() ? std::string("-") : s; };
  return {r.kernel,
          or_dash(r.phase),
          or_dash(r.layer),
          fmt("%.1f", pct(r.total_us, kernel_us)),
          fmt("%.3f", r.total_us / 1e3),
          std::to_string(r.calls),
          fmt("%.2f", r.avg_us()),
          fmt("%.2f", r.min_us),
          fmt("%.2f", r.max_us),
          r.bytes > 0 ? fmt("%.1f", r.gb_per_s()) : "",
          r.flops > 0 ? fmt("%.1f", r.gflop_per_s()) : ""};
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
    cells.push_back(table_cells(r, d.kernel_us()));
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
  return out + "profiler: " + std::to_string(d.synchronizations) + " synchronization" +
         (d.synchronizations == 1 ? "" : "s") + " for " + launches + " launches" +
         (d.device.empty() ? "" : ", device " + d.device) + (d.timer.empty() ? "" : ", timer " + d.timer) + "\n" +
         (d.launches_without_record > 0 ? "warning: " + std::to_string(d.launches_without_record) +
                                              " launches without a CUPTI record (in no row of the table)\n"
                                        : "");
}

std::string to_csv(const ProfileData& d) {
  std::string out = "kernel,phase,layer,time_pct,total_ms,calls,avg_us,min_us,max_us,gb_per_s,gflop_per_s\n";
  for (const Row& r : d.rows()) {
    out += csv_field(r.kernel) + "," + csv_field(r.phase) + "," + csv_field(r.layer) + "," +
           fmt("%.3f", pct(r.total_us, d.kernel_us())) + "," + fmt("%.6f", r.total_us / 1e3) + "," +
           std::to_string(r.calls) + "," + fmt("%.4f", r.avg_us()) + "," + fmt("%.4f", r.min_us) + "," +
           fmt("%.4f", r.max_us) + "," + (r.bytes > 0 ? fmt("%.3f", r.gb_per_s()) : "") + "," +
           (r.flops > 0 ? fmt("%.3f", r.gflop_per_s()) : "") + "\n";
  }
  return out;
}

std::string to_json(const ProfileData& d) {
  Json kernels = Json::array();
  for (const Row& r : d.rows()) {
    kernels.push_back({{"kernel", r.kernel},
                       {"phase", r.phase},
                       {"layer", r.layer},
                       {"time_pct", number(pct(r.total_us, d.kernel_us()), 3)},
                       {"total_ms", number(r.total_us / 1e3, 6)},
                       {"calls", r.calls},
                       {"avg_us", number(r.avg_us(), 4)},
                       {"min_us", number(r.min_us, 4)},
                       {"max_us", number(r.max_us, 4)},
                       {"bytes", count(r.bytes)},
                       {"flops", count(r.flops)},
                       {"gb_per_s", r.bytes > 0 ? number(r.gb_per_s(), 3) : nullptr},
                       {"gflop_per_s", r.flops > 0 ? number(r.gflop_per_s(), 3) : nullptr}});
  }
  const Json report{{"device", d.device},
                    {"wall_ms", number(d.wall_us / 1e3, 6)},
                    {"kernel_ms", number(d.kernel_us() / 1e3, 6)},
                    {"launches", d.launch_count()},
                    {"synchronizations", d.synchronizations},
                    {"timer", d.timer},
                    {"launches_without_record", d.launches_without_record},
                    {"sample_every", d.sample_every},
                    {"steps", d.steps},
                    {"sampled_steps", d.sampled_steps},
                    {"kernels", std::move(kernels)}};
  return dumped(report, 2) + "\n";
}

// The trace is written one event per line, each event dumped on its own, rather than as one document: a trace holds
// up to max_trace_launches (2 million) events, and a document of them would take several times the memory of their
// text.
std::string to_trace_json(const ProfileData& d) {
  std::vector<std::string> events{
      dumped({{"name", "process_name"},
              {"ph", "M"},
              {"pid", 1},
              {"args", {{"name", "nanotrain" + (d.device.empty() ? "" : " " + d.device)}}}}),
      track_name(kStepTrack, "steps"), track_name(kPhaseTrack, "phases"), track_name(kLayerTrack, "layers"),
      track_name(kKernelTrack, "kernels")};
  RangeBuilder steps{"step", kStepTrack}, phases{"phase", kPhaseTrack}, layers{"layer", kLayerTrack};
  const auto& launches = d.launches();
  for (size_t i = 0; i < launches.size(); ++i) {
    const Launch& l = launches[i];
    // One device stream (or one host thread) runs the launches one after another: rounding must not let an
    // event end after the next one starts, or trace viewers mis-nest them.
    double end = l.start_us + l.dur_us;
    if (i + 1 < launches.size() && launches[i + 1].start_us >= l.start_us)
      end = std::min(end, launches[i + 1].start_us);
    steps.add(l.step_id, l.step, l.start_us, end, d, events);
    phases.add(l.phase_id, l.phase, l.start_us, end, d, events);
    layers.add(l.layer_id, l.layer, l.start_us, end, d, events);
    Json args{{"phase", d.name(l.phase)},
              {"layer", d.name(l.layer)},
              {"bytes", count(l.cost.bytes)},
              {"flops", count(l.cost.flops)}};
    if (l.early_us > 0) args["early_us"] = number(l.early_us, 3);
    events.push_back(
        complete_event(d.name(l.kernel), "kernel", kKernelTrack, l.start_us, end - l.start_us, std::move(args)));
  }
  steps.finish(d, events), phases.finish(d, events), layers.finish(d, events);

  const Json other{
      {"device", d.device}, {"timer", d.timer}, {"launches", d.launch_count()}, {"launches_not_in_trace", d.dropped()}};
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
