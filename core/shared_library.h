// Libraries opened at run time with dlopen, so that the binaries start on machines without them: CUPTI for the
// profiler (profile/cupti_tracer.h), NCCL for data-parallel training (kernels/collective.h). Only the functions
// used are resolved, with dlsym.
//
// Search order (library_candidates): the library named by an environment variable when it is set (then it is the
// only candidate: a named library is never silently replaced by another one; "none" turns the library off), each
// name in the executable's folder and in its ../lib, each name through the loader's search path (LD_LIBRARY_PATH,
// rpath, ld.so.cache), then each name in the CUDA toolkit's library folder that the build was configured with.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace nt {

struct LibrarySearch {
  std::string env_library;  // the environment variable's value; when non-empty, the only candidate ("none": off)
  std::string exe_dir;      // the running executable's folder ("" if unknown)
  std::string toolkit_dir;  // the CUDA toolkit's library folder known at build time ("" if none)
};

// The search for a library named by `env_variable`, from the environment and /proc/self/exe.
LibrarySearch library_search(const char* env_variable, std::string toolkit_dir);
std::vector<std::string> library_candidates(const LibrarySearch& s, const std::vector<std::string>& names);

// dlopen(path) with RTLD_NOW | RTLD_LOCAL; nullptr and dlerror's words in `error` when it fails.
void* open_library(const std::string& path, std::string& error);
// Looks `name` up in `handle`; false, with `missing` = name, when the library has no such symbol.
bool resolve_symbol(void* handle, const char* name, void*& symbol, std::string& missing);
template <class Fn>
bool resolve(void* handle, const char* name, Fn& fn, std::string& missing) {
  void* symbol = nullptr;
  const bool found = resolve_symbol(handle, name, symbol, missing);
  fn = reinterpret_cast<Fn>(symbol);
  return found;
}
void close_library(void* handle) noexcept;

// The first candidate of library_candidates(search, names) that opens and whose functions `bind` resolves (bind
// returns false with the missing symbol's name; that library is closed again). When none does, handle is null and
// error says why in one line, naming `what` ("CUPTI") and `env_variable`; `install` ("install libnccl2, or ") leads
// the advice at its end.
struct OpenedLibrary {
  void* handle = nullptr;
  std::string path;
  std::string error;
};
OpenedLibrary open_first_library(const char* what, const char* env_variable, const LibrarySearch& search,
                                 const std::vector<std::string>& names,
                                 const std::function<bool(void* handle, std::string& missing)>& bind,
                                 const char* install = "");

}  // namespace nt
