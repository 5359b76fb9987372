#include "core/shared_library.h"

#include "core/error.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

namespace nt {

LibrarySearch library_search(const char* env_variable, std::string toolkit_dir) {
  LibrarySearch s;
  if (const char* env = std::getenv(env_variable)) s.env_library = env;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) s.exe_dir = exe.parent_path().string();
  s.toolkit_dir = std::move(toolkit_dir);
  return s;
}

std::vector<std::string> library_candidates(const LibrarySearch& s, const std::vector<std::string>& names) {
  if (!s.env_library.empty()) {
    if (s.env_library == "none") return {};
    return {s.env_library};
  }
  std::vector<std::string> out;
  if (!s.exe_dir.empty())
    for (const std::string& dir : {s.exe_dir, s.exe_dir + "/../lib"})
      for (const auto& name : names) out.push_back(dir + "/" + name);
  for (const auto& name : names) out.push_back(name);  // the loader's search path
  if (!s.toolkit_dir.empty())
    for (const auto& name : names) out.push_back(s.toolkit_dir + "/" + name);
  return out;
}

void* open_library(const std::string& path, std::string& error) {
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* e = dlerror();
    error = e ? e : "dlopen failed";
  }
  return handle;
}

bool resolve_symbol(void* handle, const char* name, void*& symbol, std::string& missing) {
  symbol = dlsym(handle, name);
  if (!symbol) missing = name;
  return symbol != nullptr;
}

void close_library(void* handle) noexcept {
  if (handle) dlclose(handle);
}

OpenedLibrary open_first_library(const char* what, const char* env_variable, const LibrarySearch& search,
                                 const std::vector<std::string>& names,
                                 const std::function<bool(void* handle, std::string& missing)>& bind,
                                 const char* install) {
  OpenedLibrary out;
  const auto candidates = library_candidates(search, names);
  if (candidates.empty()) {
    out.error = cat(what, " turned off (", env_variable, "=none)");
    return out;
  }
  std::string last_error;
  for (const auto& path : candidates) {
    void* handle = open_library(path, last_error);
    if (!handle) continue;
    std::string missing;
    if (bind(handle, missing)) {
      out.handle = handle;
      out.path = path;
      return out;
    }
    last_error = cat(path, " has no ", missing);
    close_library(handle);  // nothing of it was called
  }
  if (!search.env_library.empty()) {
    out.error = cat(what, " not loaded from ", env_variable, "=", search.env_library, ": ", last_error);
  } else {
    std::string listed;
    for (const auto& name : names) listed += (listed.empty() ? "" : " or ") + name;
    out.error = cat(what, " not found: no ", listed, " next to the executable, in its ../lib, on the loader's path",
                    search.toolkit_dir.empty() ? "" : " or in " + search.toolkit_dir, " (", install, "set ",
                    env_variable, " to its file)");
  }
  return out;
}

}  // namespace nt
