// The readers under fuzzing take a path, as the engine's commands give them one: each input is written to an
// in-memory file (memfd) and the reader opens it by its /proc/self/fd path. The whole reader runs, its size checks
// against the file included, and nothing touches the disk.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace nt::fuzz {

class MemoryFile {
 public:
  MemoryFile() : fd_(::memfd_create("nanotrain-fuzz", 0)), path_("/proc/self/fd/" + std::to_string(fd_)) {
    if (fd_ < 0) std::abort();
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  // The file's contents become exactly `data`; returns its path.
  const std::string& hold(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

}  // namespace nt::fuzz
