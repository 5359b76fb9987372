// Atomic file replacement (core/atomic_file.h): concurrent writers, links, and temporaries left by killed writers.
#include "test_support.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "core/atomic_file.h"
#include "core/error.h"

using namespace nt;
namespace fs = std::filesystem;

using nt::test::read_file;

TEST_CASE("two writers saving to one path at once leave one whole file, and each says whether it is its own",
          "[cpu][atomic]") {
  test::TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const std::string payload[2] = {std::string(3 << 20, 'a'), std::string(2 << 20, 'b')};  // sizes differ too
  for (int round = 0; round < 20; ++round) {
    INFO("round " << round);
    std::atomic<int> ready{0};
    bool ok[2] = {false, false};
    std::string error[2];
    auto writer = [&](int w) {
      ++ready;
      while (ready < 2) std::this_thread::yield();  // start together
      try {
        write_file_atomically(path, payload[w], "--save");
        ok[w] = true;
      } catch (const Error& e) {
        error[w] = e.what();
      }
    };
    std::thread a(writer, 0), b(writer, 1);
    a.join(), b.join();
    const std::string standing = read_file(path);
    INFO(error[0] << " | " << error[1]);
    const int own = standing == payload[0] ? 0 : standing == payload[1] ? 1 : -1;
    REQUIRE(own >= 0);  // one writer's bytes, whole
    CHECK(ok[own]);     // the writer whose file stands succeeded
    if (!ok[1 - own]) CHECK(error[1 - own].find("replaced by another writer") != std::string::npos);
    CHECK(test::temporaries_of(path).empty());
  }
}

TEST_CASE("a save through a symbolic link replaces the file it names and keeps the link", "[cpu][atomic]") {
  test::TempDir dir;
  const std::string target = dir.file("real.safetensors"), link = dir.file("link.safetensors");
  write_file_atomically(target, "old");
  fs::create_symlink(target, link);
  write_file_atomically(link, "new");
  CHECK(fs::is_symlink(link));
  CHECK(read_file(target) == "new");
  CHECK(test::temporaries_of(target).empty());
}

TEST_CASE("a successful save removes the temporaries of killed writers, not those of live ones", "[cpu][atomic]") {
  test::TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const std::string dead = path + ".tmp.999999999.AbCdEf";  // above any pid Linux hands out
  const std::string live = cat(path, ".tmp.", ::getpid(), ".GhIjKl");
  const std::string other = dir.file("other.safetensors.tmp.999999999.MnOpQr");  // another file's: not touched
  for (const auto& p : {dead, live, other}) std::ofstream(p) << "partial";
  write_file_atomically(path, "complete");
  CHECK(read_file(path) == "complete");
  CHECK(!fs::exists(dead));
  CHECK(fs::exists(live));
  CHECK(fs::exists(other));
}
