#include "profile/ceilings.h"
#include "profile/ceilings_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <system_error>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_messages.h"

namespace nt::profile {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // members in the order written: a person may read the file

constexpr int kVersion = 1;
constexpr const char* kFileName = "ceilings.json";

std::string quoted(const std::string& s) { return "'" + s + "'"; }

Error bad_file(const std::string& path, const std::string& what) {
  return Error(cat("ceilings cache ", quoted(path), ": ", what));
}

// The file's text; nullopt when there is no file.
std::optional<std::string> read_text(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || status.type() == fs::file_type::not_found) {
    if (!ec || ec == std::errc::no_such_file_or_directory) return std::nullopt;
    throw Error(cat("ceilings cache ", quoted(path), ": ", ec.message()));
  }
  if (fs::is_directory(status)) throw Error(cat("ceilings cache ", quoted(path), ": is a folder, not a file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(cat("ceilings cache ", quoted(path), ": cannot be read"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(cat("ceilings cache ", quoted(path), ": cannot be read"));
  return text;
}

std::string string_field(const std::string& path, const std::string& where, const Json& entry, const char* name) {
  const auto it = entry.find(name);
  if (it == entry.end()) throw bad_file(path, cat(where, " has no \"", name, "\""));
  if (!it->is_string()) throw bad_file(path, cat(where, ".", name, " is ", json_kind_name(*it), ", expected a string"));
  return it->get<std::string>();
}

double rate_field(const std::string& path, const std::string& where, const Json& entry, const char* name) {
  const auto it = entry.find(name);
  if (it == entry.end()) throw bad_file(path, cat(where, " has no \"", name, "\""));
  if (!it->is_number()) throw bad_file(path, cat(where, ".", name, " is ", json_kind_name(*it), ", expected a number"));
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < 0) throw bad_file(path, cat(where, ".", name, " is ", v, ", expected a rate >= 0"));
  return v;
}

Ceilings from_json(const std::string& path, const std::string& key, const Json& entry) {
  const std::string where = cat("devices.", key);
  if (!entry.is_object()) throw bad_file(path, cat(where, " is ", json_kind_name(entry), ", expected an object"));
  Ceilings c;
  c.uuid = string_field(path, where, entry, "uuid");
  if (c.uuid != key) throw bad_file(path, cat(where, ".uuid is '", c.uuid, "', expected its key"));
  c.device = string_field(path, where, entry, "device");
  c.copy_gb_per_s = rate_field(path, where, entry, "copy_gb_per_s");
  c.fp32_gflop_per_s = rate_field(path, where, entry, "fp32_gflop_per_s");
  c.tf32_gflop_per_s = rate_field(path, where, entry, "tf32_gflop_per_s");
  c.bf16_gflop_per_s = rate_field(path, where, entry, "bf16_gflop_per_s");
  c.measured_at = string_field(path, where, entry, "measured_at");
  c.method = string_field(path, where, entry, "method");
  return c;
}

// Every entry of the file, checked; an empty map when there is no file.
std::map<std::string, Ceilings> read_cache(const std::string& path) {
  std::map<std::string, Ceilings> out;
  const std::optional<std::string> text = read_text(path);
  if (!text) return out;
  Json root;
  try {
    root = Json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    throw bad_file(path, cat("not valid JSON: ", json_error_text(e.what(), /*with_location=*/true)));
  }
  if (!root.is_object()) throw bad_file(path, cat("the document is ", json_kind_name(root), ", expected an object"));
  const auto version = root.find("version");
  if (version == root.end()) throw bad_file(path, "no \"version\"");
  if (!version->is_number_integer() || version->get<int64_t>() != kVersion)
    throw bad_file(path, cat("version ", version->dump(), ", this build reads version ", kVersion));
  const auto devices = root.find("devices");
  if (devices == root.end()) throw bad_file(path, "no \"devices\"");
  if (!devices->is_object())
    throw bad_file(path, cat("\"devices\" is ", json_kind_name(*devices), ", expected an object"));
  for (const auto& [key, entry] : devices->items()) out.emplace(key, from_json(path, key, entry));
  return out;
}

// "61.2 TFLOP/s" from GFLOP/s.
std::string tflops_text(const char* name, double gflop_per_s) {
  if (gflop_per_s <= 0) return cat(name, " not measured");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s %.1f TFLOP/s", name, gflop_per_s / 1000);
  return buf;
}

}  // namespace

std::string ceilings_cache_path() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  if (const std::string dir = env("NT_CACHE_DIR"); !dir.empty()) return (fs::path(dir) / kFileName).string();
  if (const std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty() && fs::path(xdg).is_absolute())
    return (fs::path(xdg) / "nanotrain" / kFileName).string();
  if (const std::string home = env("HOME"); !home.empty())
    return (fs::path(home) / ".cache" / "nanotrain" / kFileName).string();
  throw Error("no folder for the ceilings cache: set NT_CACHE_DIR (or HOME)");
}

std::optional<Ceilings> load_ceilings(const std::string& path, const std::string& uuid) {
  auto all = read_cache(path);
  const auto it = all.find(uuid);
  if (it == all.end()) return std::nullopt;
  return it->second;
}

void store_ceilings(const std::string& path, const Ceilings& c) {
  NT_CHECK(!c.uuid.empty(), "ceilings without a device uuid cannot be cached");
  auto all = read_cache(path);
  all.insert_or_assign(c.uuid, c);
  Json devices = Json::object();
  for (const auto& [key, entry] : all) devices[key] = ceilings_json(entry);
  const Json root{{"version", kVersion}, {"devices", std::move(devices)}};
  const fs::path folder = fs::path(path).parent_path();
  if (!folder.empty()) {
    std::error_code ec;
    fs::create_directories(folder, ec);
    if (ec) throw Error(cat("ceilings cache ", quoted(path), ": cannot create its folder: ", ec.message()));
  }
  write_file_atomically(path, root.dump(2) + "\n", "ceilings cache");
}

std::string describe(const Ceilings& c) {
  char copy[64];
  if (c.copy_gb_per_s > 0)
    std::snprintf(copy, sizeof copy, "copy %.0f GB/s", c.copy_gb_per_s);
  else
    std::snprintf(copy, sizeof copy, "copy not measured");
  const std::string date = c.measured_at.substr(0, 10);  // "2026-11-26" of "2026-11-26T14:03:12Z"
  return cat(copy, ", ", tflops_text("fp32", c.fp32_gflop_per_s), ", ", tflops_text("tf32", c.tf32_gflop_per_s), ", ",
             tflops_text("bf16", c.bf16_gflop_per_s), date.empty() ? "" : cat(" (measured ", date, ")"));
}

Json ceilings_json(const Ceilings& c) {
  return Json{{"uuid", c.uuid},
              {"device", c.device},
              {"copy_gb_per_s", c.copy_gb_per_s},
              {"fp32_gflop_per_s", c.fp32_gflop_per_s},
              {"tf32_gflop_per_s", c.tf32_gflop_per_s},
              {"bf16_gflop_per_s", c.bf16_gflop_per_s},
              {"measured_at", c.measured_at},
              {"method", c.method}};
}

}  // namespace nt::profile
