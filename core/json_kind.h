// How an error message names a JSON value's kind ("the header is an array, expected a JSON object"): one wording for
// every file the engine reads as JSON (checkpoint headers, the ceilings cache). A template over nlohmann's json types,
// header-only: the including file brings nlohmann/json.
#pragma once

namespace nt {

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
