// Errors: one family for the whole project.
//
// nt::Error        something a user can cause (a file, a flag, a shape); its message is one line that
//                  names the file, flag or layer, and the CLI prints it as-is with a non-zero exit code.
// nt::OutOfMemory  an Error: memory could not be had.
// nt::InternalError a broken invariant or a failed CUDA call: a bug or a broken machine; the message
//                  carries the failing statement and file:line.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace nt {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Memory that could not be had (host or GPU); the message says how much. A caller that knows which file or flag
// asked for it adds that, so that the one line a user sees names the cause.
struct OutOfMemory : Error {
  using Error::Error;
};

struct InternalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Concatenate anything streamable into one string: cat("layer ", name, ": expected ", n).
template <class... Parts>
std::string cat(Parts&&... parts) {
  std::ostringstream s;
  (s << ... << std::forward<Parts>(parts));
  return s.str();
}

[[noreturn]] void throw_internal(const char* what, const char* file, int line, const std::string& detail);

}  // namespace nt

// Internal invariant; use nt::Error (with a message naming the culprit) for anything a user can cause.
#define NT_CHECK(cond, ...)                                                               \
  do {                                                                                    \
    if (!(cond)) ::nt::throw_internal(#cond, __FILE__, __LINE__, ::nt::cat(__VA_ARGS__)); \
  } while (0)
