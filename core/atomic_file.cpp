#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace nt {

void write_file_atomically(const std::string& path, std::span<const std::string_view> parts, const std::string& what) {
  const std::string prefix = what.empty() ? "" : what + ": ";
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error(cat(prefix, "cannot write '", path, "': cannot create '", tmp, "': ", std::strerror(errno)));
  auto fail = [&](const char* step, int err, bool close_fd) {
    if (close_fd) ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(cat(prefix, "cannot write '", path, "': ", step, " '", tmp, "' failed: ", std::strerror(err),
                    "; the previous file, if any, is unchanged"));
  };
  for (const auto part : parts) {
    size_t done = 0;
    while (done < part.size()) {
      const ssize_t n = ::write(fd, part.data() + done, part.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("writing", n < 0 ? errno : EIO, true);
      done += static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0) fail("flushing", errno, true);
  if (::close(fd) != 0) fail("closing", errno, false);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("renaming", errno, false);
  // The rename is durable once the folder's entry is on disk; failing to sync a folder (some file
  // systems refuse) leaves a complete file, so it is not an error.
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const int dir = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
}

}  // namespace nt
