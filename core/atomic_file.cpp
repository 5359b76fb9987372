#include "core/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace nt {

namespace fs = std::filesystem;

namespace {

// "NAME.tmp.PID.": the prefix of every temporary file this process writes for NAME. The pid lets a later save
// tell a temporary left by a killed writer (its process is gone) from one that a live writer is filling.
std::string temporary_prefix(const fs::path& target, long pid) {
  return cat(target.filename().string(), ".tmp.", pid, ".");
}

// Removes the temporaries of `target` whose writer no longer runs (a kill -9 mid-save leaves one behind).
void remove_stale_temporaries(const fs::path& target) {
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string stem = target.filename().string() + ".tmp.";
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, stem.size(), stem) != 0) continue;
    char* after = nullptr;
    const long pid = std::strtol(name.c_str() + stem.size(), &after, 10);
    if (pid <= 0 || *after != '.') continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove(it->path(), ec);
  }
}

}  // namespace

void write_file_atomically(const std::string& path, std::span<const std::string_view> parts, const std::string& what) {
  const std::string prefix = what.empty() ? "" : what + ": ";
  // A link is followed: the file it names is replaced and the link stays (a rename over PATH would replace the
  // link itself with a file).
  std::error_code ec;
  fs::path target = path;
  if (fs::is_symlink(path, ec)) {  // (a missing PATH is no link: ec then says so, and is no error here)
    target = fs::weakly_canonical(path, ec);
    if (ec) throw Error(cat(prefix, "cannot write '", path, "': cannot follow the link: ", ec.message()));
  }

  std::string tmp =
      (target.parent_path() / temporary_prefix(target, static_cast<long>(::getpid()))).string() + "XXXXXX";
  std::vector<char> name(tmp.begin(), tmp.end());
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());  // unique: concurrent writers never share a temporary
  if (fd < 0)
    throw Error(
        cat(prefix, "cannot write '", path, "': cannot create a temporary file in its folder: ", std::strerror(errno)));
  tmp = name.data();
  auto fail = [&](const char* step, int err, bool close_fd) {
    if (close_fd) ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(cat(prefix, "cannot write '", path, "': ", step, " '", tmp, "' failed: ", std::strerror(err),
                    "; the previous file, if any, is unchanged"));
  };
  if (::fchmod(fd, 0644) != 0) fail("setting the mode of", errno, true);  // mkstemp's 0600 would hide it from others
  for (const auto part : parts) {
    size_t done = 0;
    while (done < part.size()) {
      const ssize_t n = ::write(fd, part.data() + done, part.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("writing", n < 0 ? errno : EIO, true);
      done += static_cast<size_t>(n);
    }
  }
  struct stat written {};
  if (::fsync(fd) != 0) fail("flushing", errno, true);
  if (::fstat(fd, &written) != 0) fail("reading back", errno, true);
  if (::close(fd) != 0) fail("closing", errno, false);
  if (::rename(tmp.c_str(), target.c_str()) != 0) fail("renaming", errno, false);
  // The rename is durable once the folder's entry is on disk; failing to sync a folder (some file systems
  // refuse) leaves a complete file, so it is not an error.
  const fs::path parent = target.parent_path();
  const int dir = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
  // Another process saving to the same path at the same moment may have renamed its own file over this one:
  // each writer says whether the file that stands is its own.
  struct stat standing {};
  if (::stat(target.c_str(), &standing) != 0 || standing.st_ino != written.st_ino || standing.st_dev != written.st_dev)
    throw Error(cat(prefix, "'", path, "' was written, then replaced by another writer saving to it at the same time"));
  remove_stale_temporaries(target);
}

}  // namespace nt
