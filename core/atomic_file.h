// Atomic file replacement: every file the project writes for a user (checkpoints, metrics, profiles)
// goes through here, so an interrupted or failed write never leaves a half-written file behind.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace nt {

// Writes `parts` to PATH.tmp, fsyncs it, renames it over PATH and fsyncs the folder. On any failure the
// temporary file is removed, PATH is untouched, and an nt::Error names `what` (a flag such as
// "--metrics", or empty) and the file.
void write_file_atomically(const std::string& path, std::span<const std::string_view> parts,
                           const std::string& what = "");

inline void write_file_atomically(const std::string& path, std::string_view text, const std::string& what = "") {
  write_file_atomically(path, std::span<const std::string_view>(&text, 1), what);
}

}  // namespace nt
