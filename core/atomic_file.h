// Atomic file replacement: every file the project writes for a user (checkpoints, metrics, profiles)
// goes through here, so an interrupted or failed write never leaves a half-written file behind.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace nt {

// Writes `parts` to a temporary file of its own beside PATH (PATH.tmp.<pid>.XXXXXX, made by mkstemp, so that
// concurrent writers never share one), fsyncs it, renames it over PATH and fsyncs the folder. A symbolic link at
// PATH is followed: the file it names is replaced, the link stays. On any failure the temporary file is removed,
// PATH is untouched, and an nt::Error names `what` (a flag such as "--metrics", or empty) and the file. When another
// writer renamed its file over PATH in the meantime, that is an error too: the file that stands is not this one.
// After a successful write, temporaries of PATH whose writer no longer runs (killed mid-save) are removed.
void write_file_atomically(const std::string& path, std::span<const std::string_view> parts,
                           const std::string& what = "");

inline void write_file_atomically(const std::string& path, std::string_view text, const std::string& what = "") {
  write_file_atomically(path, std::span<const std::string_view>(&text, 1), what);
}

}  // namespace nt
