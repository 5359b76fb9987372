// What a profile looks like to a person and to tools.
//
//   format_table(d)     Kernel | Phase | Layer | Time % | Total ms | Calls | Avg us | Span us | Min us | Max us |
//                       GB/s | BW % | GFLOP/s | Math | FLOP %
//                       one row per (kernel, phase, layer), sorted by total exclusive time, each followed by the
//                       phases its kernel stamped ("  > forward"); Avg/Min/Max are exclusive times, Span us the
//                       average span (docs/profiler.md); GB/s and GFLOP/s are the op's own bytes and flops over its
//                       exclusive time, blank where the op reports none; BW % and FLOP % set them against the GPU's
//                       measured ceilings (its Math: fp32, tf32 or bf16), blank where those are not known.
//   format_totals(d)    the sum of kernel time against the wall clock of the profiled window, and the gap
//                       between them (launch overhead, host work, idle GPU); the timer used; and a warning
//                       line with the count of launches the timer gave no time for, if any.
//   write_files(d, p)   p.csv (the table), p.json ({"kernels": [...], "wall_ms", "kernel_ms", "timer", ...}) and
//                       p.trace.json (Chrome trace event format: one complete event per launch, plus step,
//                       phase and layer ranges on their own rows; opens in Perfetto and chrome://tracing).
// Files are written to a temporary name and renamed, so a file on disk is always whole.
#pragma once

#include <string>
#include <string_view>

#include "profile/profile_data.h"

namespace nt::profile {

std::string format_table(const ProfileData& d);
std::string format_totals(const ProfileData& d);
// One line per step (at most max_lines), the median step of each name, and, with the device's ceilings, the floor
// of each name's average step (its FLOPs over the rate, its bytes over the bandwidth) beside its median wall time.
// "" when no launch was in a step.
std::string format_steps(const ProfileData& d, size_t max_lines = 48);

std::string to_csv(const ProfileData& d);
std::string to_json(const ProfileData& d);
std::string to_trace_json(const ProfileData& d);

// Writes PREFIX.csv, PREFIX.json and PREFIX.trace.json; throws nt::Error naming --profile-out and the file.
void write_files(const ProfileData& d, const std::string& prefix);

std::string csv_field(std::string_view s);  // quoted when it holds a comma, quote or line break

}  // namespace nt::profile
