// How error messages speak of JSON, in one wording for every file the engine reads as JSON (checkpoint headers, the
// ceilings cache). Header-only; json_kind_name is a template over nlohmann's json types, so the including file brings
// nlohmann/json.
#pragma once

#include <algorithm>
#include <string>

namespace nt {

// nlohmann's exception message as one short line: without its "[json.exception.…] " prefix and the token it quotes
// ("; last read: '…'", which can be megabytes, or bytes that are not UTF-8), line breaks as spaces. with_location:
// keep "parse error at line 1, column 6: " (a small file the user edits); without, the caller names the byte itself.
inline std::string json_error_text(std::string what, bool with_location) {
  if (what.starts_with("[json.exception.")) what.erase(0, std::min(what.size(), what.find("] ") + 2));
  if (!with_location && what.starts_with("parse error")) what.erase(0, std::min(what.size(), what.find(": ") + 2));
  if (const size_t at = what.find("; last read: "); at != std::string::npos) what.resize(at);
  std::replace(what.begin(), what.end(), '\n', ' ');
  std::replace(what.begin(), what.end(), '\r', ' ');
  return what;
}

template <class Json>
const char* json_kind_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      return "a number";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "?";
  }
}

}  // namespace nt
