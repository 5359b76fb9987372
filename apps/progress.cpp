#include "apps/progress.h"

#include <algorithm>
#include <cmath>

#include "apps/command.h"

namespace nt::app {

namespace {
double seconds(ProgressLine::Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

ProgressMode parse_progress_mode(const std::string& flag_value) {
  if (flag_value == "auto") return ProgressMode::automatic;
  if (flag_value == "always") return ProgressMode::always;
  if (flag_value == "never") return ProgressMode::never;
  throw UsageError(cat("--progress: must be auto, always or never, got '", flag_value, "'"));
}

std::string format_duration(double s) {
  char text[32];
  if (s < 60) {
    std::snprintf(text, sizeof text, "%.1f s", s);
  } else if (s < 3600) {
    const auto whole = static_cast<long>(std::lround(s));
    std::snprintf(text, sizeof text, "%ld min %02ld s", whole / 60, whole % 60);
  } else {
    const auto minutes = static_cast<long>(std::lround(s / 60));
    std::snprintf(text, sizeof text, "%ld h %02ld min", minutes / 60, minutes % 60);
  }
  return text;
}

ProgressLine::ProgressLine(ProgressMode mode, int epochs, std::FILE* out, bool terminal)
    : mode_(mode), terminal_(terminal), epochs_(epochs), out_(out) {}

bool ProgressLine::wanted() const {
  return mode_ == ProgressMode::always || (mode_ == ProgressMode::automatic && terminal_);
}

void ProgressLine::begin_epoch(int epoch, Clock::time_point now) {
  if (epoch_ > 0) last_epoch_s_ = seconds(now - epoch_start_);
  epoch_ = epoch;
  epoch_start_ = now;
}

void ProgressLine::update(const EpochProgress& p, Clock::time_point now) {
  if (!wanted() || p.steps_done <= 0) return;
  // The pace is the device's between marks: the host's clock would count the first replay's capture, and the
  // moments the host learns of marks late. At the first mark there is none yet.
  const bool paced = p.ms_per_step > 0;
  const double left = p.ms_per_step * 1e-3 * static_cast<double>(p.steps - p.steps_done);
  const double epoch_total = seconds(now - epoch_start_) + left;
  const bool shown = drawn_width_ > 0;  // once drawn, the line stays until clear()
  if (mode_ == ProgressMode::automatic && !shown && (!paced || epoch_total <= seconds(kLongEpoch))) return;

  constexpr int kWidth = 30;
  const auto filled = static_cast<int>(kWidth * p.steps_done / p.steps);
  char line[160];
  const int n = std::snprintf(line, sizeof line, "  epoch %3d/%d [%.*s%*s] %3d%%", epoch_, epochs_, filled,
                              "##############################", kWidth - filled, "",
                              static_cast<int>(100 * p.steps_done / p.steps));
  if (paced) {
    // An epoch after this one: as long as the one before, all told; in the first, this one's steps at its pace
    // (its wall time so far also holds the capture and other first-epoch costs).
    const double per_epoch = last_epoch_s_ > 0 ? last_epoch_s_ : p.ms_per_step * 1e-3 * static_cast<double>(p.steps);
    std::snprintf(line + n, sizeof line - static_cast<size_t>(n), "  %s left in the epoch, %s in the run",
                  format_duration(left).c_str(), format_duration(left + per_epoch * (epochs_ - epoch_)).c_str());
  }
  draw(line);
}

void ProgressLine::draw(const std::string& line) {
  // The padding erases what a longer line before left; no escape codes, so a log file (always) stays plain.
  std::fprintf(out_, "\r%s%*s", line.c_str(),
               static_cast<int>(drawn_width_ > line.size() ? drawn_width_ - line.size() : 0), "");
  std::fflush(out_);
  drawn_width_ = std::max(drawn_width_, line.size());
}

void ProgressLine::clear() {
  if (drawn_width_ == 0) return;
  std::fprintf(out_, "\r%*s\r", static_cast<int>(drawn_width_), "");
  std::fflush(out_);
  drawn_width_ = 0;
}

}  // namespace nt::app
