#include "profile/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"

namespace nt::profile {

namespace {

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// A JSON number, or null where there is none (JSON has no NaN or infinity).
std::string json_num(double v, const char* format = "%.6f") { return std::isfinite(v) ? fmt(format, v) : "null"; }
std::string json_str(std::string_view s) {
  std::string out(1, '"');
  out += json_escape(s);
  out += '"';
  return out;
}

double pct(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }

// ---- the table -------------------------------------------------------------------------------------

struct Column {
  const char* title;
  bool right;  // numbers right-aligned, names left-aligned
};
const Column kColumns[] = {{"Kernel", false}, {"Phase", false},   {"Layer", false},  {"Time %", true},
                           {"Total ms", true}, {"Calls", true},   {"Avg us", true},  {"Min us", true},
                           {"Max us", true},  {"GB/s", true},     {"GFLOP/s", true}};
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
                           const std::string& args = "") {
  std::string e = "{\"name\": " + json_str(name) + ", \"cat\": \"" + cat + "\", \"ph\": \"X\", \"pid\": 1, \"tid\": " +
                  std::to_string(track) + ", \"ts\": " + fmt("%.3f", ts) + ", \"dur\": " + fmt("%.3f", std::max(dur, 0.0));
  if (!args.empty()) e += ", \"args\": {" + args + "}";
  return e + "}";
}

std::string track_name(int track, const char* name) {
  const std::string tid = std::to_string(track);
  return "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": " + tid + ", \"args\": {\"name\": \"" + name +
         "\"}},\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 1, \"tid\": " + tid +
         ", \"args\": {\"sort_index\": " + tid + "}}";
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

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;  // UTF-8 passes through
    }
  }
  return out;
}

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
  std::string out = "{\n  \"device\": " + json_str(d.device) + ",\n  \"wall_ms\": " + json_num(d.wall_us / 1e3) +
                    ",\n  \"kernel_ms\": " + json_num(d.kernel_us() / 1e3) +
                    ",\n  \"launches\": " + std::to_string(d.launch_count()) +
                    ",\n  \"synchronizations\": " + std::to_string(d.synchronizations) +
                    ",\n  \"timer\": " + json_str(d.timer) +
                    ",\n  \"launches_without_record\": " + std::to_string(d.launches_without_record) +
                    ",\n  \"sample_every\": " + std::to_string(d.sample_every) +
                    ",\n  \"steps\": " + std::to_string(d.steps) +
                    ",\n  \"sampled_steps\": " + std::to_string(d.sampled_steps) +
                    ",\n  \"kernels\": [";
  const auto rows = d.rows();
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out += std::string(i ? "," : "") + "\n    {\"kernel\": " + json_str(r.kernel) + ", \"phase\": " + json_str(r.phase) +
           ", \"layer\": " + json_str(r.layer) + ", \"time_pct\": " + json_num(pct(r.total_us, d.kernel_us()), "%.3f") +
           ", \"total_ms\": " + json_num(r.total_us / 1e3) + ", \"calls\": " + std::to_string(r.calls) +
           ", \"avg_us\": " + json_num(r.avg_us(), "%.4f") + ", \"min_us\": " + json_num(r.min_us, "%.4f") +
           ", \"max_us\": " + json_num(r.max_us, "%.4f") + ", \"bytes\": " + json_num(r.bytes, "%.0f") +
           ", \"flops\": " + json_num(r.flops, "%.0f") +
           ", \"gb_per_s\": " + (r.bytes > 0 ? json_num(r.gb_per_s(), "%.3f") : "null") +
           ", \"gflop_per_s\": " + (r.flops > 0 ? json_num(r.gflop_per_s(), "%.3f") : "null") + "}";
  }
  return out + "\n  ]\n}\n";
}

std::string to_trace_json(const ProfileData& d) {
  std::vector<std::string> events{
      "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"args\": {\"name\": " +
          json_str("nanotrain" + (d.device.empty() ? "" : " " + d.device)) + "}}",
      track_name(kStepTrack, "steps"), track_name(kPhaseTrack, "phases"), track_name(kLayerTrack, "layers"),
      track_name(kKernelTrack, "kernels")};
  RangeBuilder steps{"step", kStepTrack}, phases{"phase", kPhaseTrack}, layers{"layer", kLayerTrack};
  const auto& launches = d.launches();
  for (size_t i = 0; i < launches.size(); ++i) {
    const Launch& l = launches[i];
    // One device stream (or one host thread) runs the launches one after another: rounding must not let an
    // event end after the next one starts, or trace viewers mis-nest them.
    double end = l.start_us + l.dur_us;
    if (i + 1 < launches.size() && launches[i + 1].start_us >= l.start_us) end = std::min(end, launches[i + 1].start_us);
    steps.add(l.step_id, l.step, l.start_us, end, d, events);
    phases.add(l.phase_id, l.phase, l.start_us, end, d, events);
    layers.add(l.layer_id, l.layer, l.start_us, end, d, events);
    const std::string args = "\"phase\": " + json_str(d.name(l.phase)) + ", \"layer\": " + json_str(d.name(l.layer)) +
                             ", \"bytes\": " + json_num(l.cost.bytes, "%.0f") +
                             ", \"flops\": " + json_num(l.cost.flops, "%.0f") +
                             (l.early_us > 0 ? ", \"early_us\": " + json_num(l.early_us, "%.3f") : "");
    events.push_back(complete_event(d.name(l.kernel), "kernel", kKernelTrack, l.start_us, end - l.start_us, args));
  }
  steps.finish(d, events), phases.finish(d, events), layers.finish(d, events);

  std::string out = "{\"displayTimeUnit\": \"ms\",\n\"otherData\": {\"device\": " + json_str(d.device) +
                    ", \"timer\": " + json_str(d.timer) + ", \"launches\": " + std::to_string(d.launch_count()) +
                    ", \"launches_not_in_trace\": " + std::to_string(d.dropped()) + "},\n\"traceEvents\": [\n";
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
