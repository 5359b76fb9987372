#include "core/error.h"

namespace nt {

void throw_internal(const char* what, const char* file, int line, const std::string& detail) {
  std::string msg = cat("internal error: ", what, " failed at ", file, ":", line);
  if (!detail.empty()) msg += cat(" (", detail, ")");
  throw InternalError(msg);
}

}  // namespace nt
