// A training run's progress on one line of a terminal, redrawn in place ('\r') as the trainer passes the marks it
// records between steps (engine/trainer.h, on_progress; graph mode included):
//
//   epoch   3/10 [###########                   ]  37%  1.2 s left in the epoch, 14.0 s in the run
//
// --progress auto (the default) draws it on a terminal only, and only for an epoch that will take longer than
// kLongEpoch: a 30 ms epoch would flash a bar nobody can read. always draws it for every epoch, wherever stdout goes;
// never draws nothing. The line is erased before the epoch's result is printed.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "engine/trainer.h"

namespace nt::app {

enum class ProgressMode { automatic, always, never };
ProgressMode parse_progress_mode(const std::string& flag_value);  // "auto", "always", "never"; throws UsageError

// "0.4 s", "42.0 s", "3 min 07 s", "2 h 05 min"
std::string format_duration(double seconds);

class ProgressLine {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kLongEpoch{2};

  // `terminal`: whether `out` is one (auto draws only there).
  ProgressLine(ProgressMode mode, int epochs, std::FILE* out, bool terminal);

  bool wanted() const;  // whether a line may be drawn at all: otherwise the trainer need not record marks
  void begin_epoch(int epoch, Clock::time_point now = Clock::now());
  void update(const EpochProgress& p, Clock::time_point now = Clock::now());
  void clear();  // erases a drawn line

 private:
  void draw(const std::string& line);

  ProgressMode mode_;
  bool terminal_;
  int epochs_;
  std::FILE* out_;
  int epoch_ = 0;
  Clock::time_point epoch_start_{};
  double last_epoch_s_ = 0;  // the whole of the epoch before (training, evaluation, output), 0 before one
  size_t drawn_width_ = 0;   // of the line drawn this epoch; 0: none (clear() erases it)
};

}  // namespace nt::app
