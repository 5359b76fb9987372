// The measured ceilings' cache (profile/ceilings.h), where it lives, how it reads, and the devices command without a
// GPU (no GPU needed; tests/cuda/test_ceilings_cuda.cpp measures one).
#include "test_support.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "kernels/ceilings.h"
#include "kernels/runtime.h"
#include "profile/ceilings.h"

using namespace nt;
using test::ScopedEnv;
namespace fs = std::filesystem;

namespace {

profile::Ceilings h100() {
  return {.uuid = "GPU-5f8a1c2e-0b3d-4e6f-8a9b-0c1d2e3f4a5b",
          .device = "NVIDIA H100 80GB HBM3",
          .copy_gb_per_s = 2951.3,
          .fp32_gflop_per_s = 61234.5,
          .tf32_gflop_per_s = 247100.25,
          .bf16_gflop_per_s = 494200.5,
          .measured_at = "2026-11-26T14:03:12Z",
          .method = "copy: cudaMemcpyAsync device to device of 512 MiB; fp32: ...; each the median of 11 runs"};
}

profile::Ceilings t4() {
  return {.uuid = "GPU-00000000-1111-2222-3333-444444444444",
          .device = "Tesla T4",
          .copy_gb_per_s = 240,
          .fp32_gflop_per_s = 7900,
          .measured_at = "2026-11-27T09:00:00Z",
          .method = "copy: ...; tf32, bf16: not measured (compute_75 code)"};
}

void require_same(const profile::Ceilings& got, const profile::Ceilings& want) {
  CHECK(got.uuid == want.uuid);
  CHECK(got.device == want.device);
  CHECK(got.copy_gb_per_s == want.copy_gb_per_s);  // written with full precision: exact
  CHECK(got.fp32_gflop_per_s == want.fp32_gflop_per_s);
  CHECK(got.tf32_gflop_per_s == want.tf32_gflop_per_s);
  CHECK(got.bf16_gflop_per_s == want.bf16_gflop_per_s);
  CHECK(got.measured_at == want.measured_at);
  CHECK(got.method == want.method);
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

size_t line_count(const std::string& s) {
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')) + (!s.empty() && s.back() != '\n');
}

}  // namespace

TEST_CASE("ceilings stored in the cache read back field for field", "[cpu][ceilings]") {
  test::TempDir dir;
  const std::string path = dir.file("nested/folder/ceilings.json");  // the folders are made
  profile::store_ceilings(path, h100());
  const auto got = profile::load_ceilings(path, h100().uuid);
  REQUIRE(got.has_value());
  require_same(*got, h100());
  CHECK(test::temporaries_of(path).empty());  // written atomically, nothing left beside it

  const std::string text = test::read_file(path);
  INFO(text);
  CHECK(text.find("\"version\": 1") != std::string::npos);
  CHECK(text.find("\"devices\": {") != std::string::npos);
  CHECK(text.find(cat("\"", h100().uuid, "\": {")) != std::string::npos);
}

TEST_CASE("storing one GPU's ceilings keeps the other GPUs' and replaces its own", "[cpu][ceilings]") {
  test::TempDir dir;
  const std::string path = dir.file("ceilings.json");
  profile::store_ceilings(path, h100());
  profile::store_ceilings(path, t4());
  auto newer = h100();
  newer.copy_gb_per_s = 3001;
  newer.measured_at = "2026-12-01T10:00:00Z";
  profile::store_ceilings(path, newer);

  const auto a = profile::load_ceilings(path, h100().uuid);
  const auto b = profile::load_ceilings(path, t4().uuid);
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  require_same(*a, newer);
  require_same(*b, t4());
  const std::string text = test::read_file(path);
  size_t mentions = 0;  // the key and the field, once each: no second entry
  for (size_t at = text.find(h100().uuid); at != std::string::npos; at = text.find(h100().uuid, at + 1)) ++mentions;
  CHECK(mentions == 2);
}

TEST_CASE("a missing cache file or a GPU not in it reads as not measured", "[cpu][ceilings]") {
  test::TempDir dir;
  CHECK_FALSE(profile::load_ceilings(dir.file("none.json"), h100().uuid).has_value());
  CHECK_FALSE(profile::load_ceilings(dir.file("no/such/folder/ceilings.json"), h100().uuid).has_value());
  const std::string path = dir.file("ceilings.json");
  profile::store_ceilings(path, t4());
  CHECK_FALSE(profile::load_ceilings(path, h100().uuid).has_value());
  CHECK(profile::load_ceilings(path, "").has_value() == false);  // "" checks the file, finds nothing
}

TEST_CASE("a cache that is not valid JSON or has the wrong shape is one error naming the file", "[cpu][ceilings]") {
  test::TempDir dir;
  const std::string path = dir.file("ceilings.json");
  const std::string entry =
      R"({"uuid": "GPU-1", "device": "X", "copy_gb_per_s": 1, "fp32_gflop_per_s": 2, "tf32_gflop_per_s": 0,)"
      R"( "bf16_gflop_per_s": 0, "measured_at": "2026-01-01T00:00:00Z", "method": "m"})";
  struct Case {
    const char* name;
    std::string text;
    const char* phrase;
  };
  const auto with_entry = [&](const std::string& from, const std::string& to) {
    std::string e = entry;
    e.replace(e.find(from), from.size(), to);
    return R"({"version": 1, "devices": {"GPU-1": )" + e + "}}";
  };
  const Case cases[] = {
      {"not JSON", "{\"version\": 1, \"devices\": {", "not valid JSON"},
      {"empty", "", "not valid JSON"},
      {"an array", "[1, 2]", "expected an object"},
      {"no version", R"({"devices": {}})", "no \"version\""},
      {"a newer version", R"({"version": 2, "devices": {}})", "version 2, this build reads version 1"},
      {"a version that is a string", R"({"version": "1", "devices": {}})", "version \"1\""},
      {"no devices", R"({"version": 1})", "no \"devices\""},
      {"devices an array", R"({"version": 1, "devices": []})", "\"devices\" is an array"},
      {"an entry that is a number", R"({"version": 1, "devices": {"GPU-1": 3}})", "devices.GPU-1 is a number"},
      {"a missing field", with_entry(R"("method": "m")", R"("methods": "m")"), "has no \"method\""},
      {"a rate that is a string", with_entry(R"("copy_gb_per_s": 1)", R"("copy_gb_per_s": "1")"),
       "copy_gb_per_s is a string, expected a number"},
      {"a negative rate", with_entry(R"("fp32_gflop_per_s": 2)", R"("fp32_gflop_per_s": -2)"), "expected a rate >= 0"},
      {"a uuid unlike its key", with_entry(R"("uuid": "GPU-1")", R"("uuid": "GPU-2")"), "expected its key"},
  };
  for (const auto& c : cases) {
    SECTION(c.name) {
      write(path, c.text);
      // Whatever uuid is asked for: the file as a whole is refused, one line naming it.
      REQUIRE_THROWS_AS(profile::load_ceilings(path, "GPU-1"), Error);
      REQUIRE_THROWS_WITH(profile::load_ceilings(path, "GPU-1"), test::names(path, c.phrase));
      REQUIRE_THROWS_WITH(profile::load_ceilings(path, "GPU-other"), test::names(path, c.phrase));
      // Storing does not overwrite what it could not read.
      REQUIRE_THROWS_AS(profile::store_ceilings(path, h100()), Error);
      REQUIRE_THROWS_WITH(profile::store_ceilings(path, h100()), test::names(path, c.phrase));
      CHECK(test::read_file(path) == c.text);
    }
  }
  SECTION("a folder where the file should be") {
    fs::create_directories(path);
    REQUIRE_THROWS_AS(profile::load_ceilings(path, "GPU-1"), Error);
    REQUIRE_THROWS_WITH(profile::load_ceilings(path, "GPU-1"), test::names(path, "is a folder"));
  }
  SECTION("a well-formed file reads") {
    write(path, R"({"version": 1, "devices": {"GPU-1": )" + entry + "}}");
    const auto got = profile::load_ceilings(path, "GPU-1");
    REQUIRE(got.has_value());
    CHECK(got->copy_gb_per_s == 1);
    CHECK(got->fp32_gflop_per_s == 2);
  }
}

TEST_CASE("the cache lives in NT_CACHE_DIR, else XDG_CACHE_HOME/nanotrain, else ~/.cache/nanotrain",
          "[cpu][ceilings]") {
  SECTION("NT_CACHE_DIR first") {
    ScopedEnv nt_dir("NT_CACHE_DIR", "/tmp/nt-cache"), xdg("XDG_CACHE_HOME", "/tmp/xdg"), home("HOME", "/tmp/home");
    CHECK(profile::ceilings_cache_path() == "/tmp/nt-cache/ceilings.json");
  }
  SECTION("then XDG_CACHE_HOME") {
    ScopedEnv nt_dir("NT_CACHE_DIR", ""), xdg("XDG_CACHE_HOME", "/tmp/xdg"), home("HOME", "/tmp/home");
    CHECK(profile::ceilings_cache_path() == "/tmp/xdg/nanotrain/ceilings.json");
  }
  SECTION("then HOME, also when XDG_CACHE_HOME is relative (the XDG specification says to ignore it)") {
    ScopedEnv nt_dir("NT_CACHE_DIR", nullptr), xdg("XDG_CACHE_HOME", "relative/cache"), home("HOME", "/tmp/home");
    CHECK(profile::ceilings_cache_path() == "/tmp/home/.cache/nanotrain/ceilings.json");
  }
  SECTION("none of them: an error that names the fix") {
    ScopedEnv nt_dir("NT_CACHE_DIR", nullptr), xdg("XDG_CACHE_HOME", nullptr), home("HOME", nullptr);
    REQUIRE_THROWS_AS(profile::ceilings_cache_path(), Error);
    REQUIRE_THROWS_WITH(profile::ceilings_cache_path(), test::Contains("NT_CACHE_DIR"));
  }
  SECTION("a store and a load through NT_CACHE_DIR") {
    test::TempDir dir;
    ScopedEnv nt_dir("NT_CACHE_DIR", dir.path.c_str());
    profile::store_ceilings(profile::ceilings_cache_path(), t4());
    CHECK(fs::exists(dir.file("ceilings.json")));
    CHECK(profile::load_ceilings(profile::ceilings_cache_path(), t4().uuid).has_value());
  }
}

TEST_CASE("describe says every ceiling on one line, and which were not measured", "[cpu][ceilings]") {
  CHECK(profile::describe(h100()) ==
        "copy 2951 GB/s, fp32 61.2 TFLOP/s, tf32 247.1 TFLOP/s, bf16 494.2 TFLOP/s (measured 2026-11-26)");
  CHECK(profile::describe(t4()) ==
        "copy 240 GB/s, fp32 7.9 TFLOP/s, tf32 not measured, bf16 not measured (measured 2026-11-27)");
}

TEST_CASE("a GPU's UUID is written as nvidia-smi writes it", "[cpu][ceilings]") {
  const uint8_t bytes[16] = {0x5f, 0x8a, 0x1c, 0x2e, 0x0b, 0x3d, 0x4e, 0x6f,
                             0x8a, 0x9b, 0x0c, 0x1d, 0x2e, 0x3f, 0xa4, 0xff};
  CHECK(kernels::gpu_uuid_text(bytes) == "GPU-5f8a1c2e-0b3d-4e6f-8a9b-0c1d2e3fa4ff");
}

TEST_CASE("measuring ceilings without a GPU is one clear error", "[cpu][ceilings][cli]") {
  const kernels::Exec cpu;
  REQUIRE_THROWS_AS(kernels::measure_ceilings(cpu), Error);
  if (kernels::cuda_device_count() > 0) return;  // this machine has a GPU: the CLI case cannot arise
  test::TempDir dir;
  const std::string env = "NT_CACHE_DIR=" + dir.path + " ";
  auto r = test::run_command(env + test::cli_path() + " devices --measure");
  INFO(r.out);
  CHECK(r.exit_code == 1);
  CHECK(line_count(r.out) == 1);
  CHECK(r.out.find("nanotrain: devices --measure: no GPU to measure: ") == 0);
  CHECK_FALSE(fs::exists(dir.file("ceilings.json")));

  // The listing still works, and says nothing of ceilings with no GPU to have them.
  auto d = test::run_command(env + test::cli_path() + " devices");
  INFO(d.out);
  CHECK(d.exit_code == 0);
  CHECK(d.out.find("ceilings") == std::string::npos);
}
