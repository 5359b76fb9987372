// Checkpoints (engine/checkpoint.h): safetensors files that round-trip bit for bit, carry PyTorch's names
// and shapes, reject every malformed or mismatched file with a message naming the file and the tensor,
// never destroy the previous file when a save fails, and resume training exactly. Also the CLI flags
// built on them (--init-out, --init-from, --save, --order-out, `nanotrain eval`).
#include "test_support.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "engine/checkpoint.h"
#include "rig.h"

using namespace nt;
namespace fs = std::filesystem;

namespace {

using test::read_file;
using test::TempDir;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// The mlp on MNIST's sample shape, with the parameters of `seed`, on the CPU.
struct MlpOnCpu {
  explicit MlpOnCpu(uint64_t seed, const std::string& spec = "mlp")
      : ctx({"cpu", 1, false}), model(layers::build_model(spec, Shape{1, 28, 28}, 10)) {
    model->init_params(ctx, seed);
  }
  std::vector<float> weights() const { return model->params().values().to_host<float>(ctx.exec()); }
  void save(const std::string& path) const { save_safetensors(path, *model, ctx.exec()); }
  void load(const std::string& path) { load_safetensors(path, *model, ctx.exec()); }
  Context ctx;
  std::unique_ptr<Model> model;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A file's header text, and the file rebuilt around an edited header (the data block kept).
std::string header_of(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  return bytes.substr(8, n);
}
std::string with_header(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((uint64_t(header.size()) >> (8 * i)) & 0xFF);
  return out + header + data;
}
std::string data_of(const std::string& bytes) { return bytes.substr(8 + header_of(bytes).size()); }

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  REQUIRE(at != std::string::npos);  // the edit must apply, or the case tests nothing
  return s.replace(at, from.size(), to);
}

// The message of the nt::Error that `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The repository's root, from this file's path (tests/cpu/test_checkpoint.cpp).
fs::path repo_root() { return fs::path(__FILE__).parent_path().parent_path().parent_path(); }

test::CommandResult nanotrain(const std::string& args) {
  return test::run_command(test::cli_path() + " " + args + " --device cpu --data " + test::mnist_dir());
}

}  // namespace

TEST_CASE("save then load restores every parameter bit for bit", "[cpu][checkpoint]") {
  TempDir dir;
  MlpOnCpu a(3), b(4);
  REQUIRE(!same_bits(a.weights(), b.weights()));  // different seeds: the load must do the work
  save_safetensors(dir.file("m.safetensors"), *a.model, a.ctx.exec(), {{"note", "round \"trip\"\n"}});
  const CheckpointMetadata meta = load_safetensors(dir.file("m.safetensors"), *b.model, b.ctx.exec());
  CHECK(same_bits(a.weights(), b.weights()));
  CHECK(meta.at("model") == "mlp");
  CHECK(meta.at("format") == "pt");
  CHECK(meta.at("note") == "round \"trip\"\n");  // escaped on the way out, unescaped on the way in
}

TEST_CASE("tensors carry PyTorch's names, shapes and dtype, in order, tiling the data block", "[cpu][checkpoint]") {
  TempDir dir;
  MlpOnCpu m(1);
  m.save(dir.file("m.safetensors"));
  const auto file = SafetensorsFile::read(dir.file("m.safetensors"));
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want{{"0.weight", {320, 784}}, {"0.bias", {320}},
                                                                       {"2.weight", {160, 320}}, {"2.bias", {160}},
                                                                       {"4.weight", {10, 160}},  {"4.bias", {10}}};
  REQUIRE(file.tensors().size() == want.size());
  uint64_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& t = file.tensors()[i];
    INFO(t.name);
    CHECK(t.name == want[i].first);
    CHECK(t.shape == want[i].second);
    CHECK(t.dtype == "F32");
    CHECK(t.begin == at);
    at = t.end;
    CHECK(file.floats(t.name) == m.model->params().find(t.name).value.to_host<float>(m.ctx.exec()));
  }
  const std::string bytes = read_file(dir.file("m.safetensors"));
  CHECK(header_of(bytes).size() % 8 == 0);  // the data block starts 8-byte aligned, as safetensors writes it
  CHECK(data_of(bytes).size() == at);
}

TEST_CASE("a header in any member order, with any whitespace and escapes, loads", "[cpu][checkpoint]") {
  TempDir dir;
  MlpOnCpu a(5), b(6);
  a.save(dir.file("m.safetensors"));
  const std::string bytes = read_file(dir.file("m.safetensors"));
  const auto file = SafetensorsFile::read(dir.file("m.safetensors"));
  // The same tensors, listed last to first, members reversed, metadata last, JSON whitespace everywhere,
  // and a name spelled with \u escapes ("0.weight" as "\u0030.weight").
  std::string header = "\r\n{ ";
  for (auto it = file.tensors().rbegin(); it != file.tensors().rend(); ++it) {
    const std::string name = it->name == "0.weight" ? "\\u0030.weight" : it->name;
    std::string shape;
    for (auto d : it->shape) shape += cat(shape.empty() ? "" : " ,\t", d);
    header += cat("\"", name, "\"\t:\n { \"data_offsets\" : [ ", it->begin, " , ", it->end, " ] ,\n \"shape\":[", shape,
                  "], \"dtype\" : \"F32\" } ,\n");
  }
  header += "\"__metadata__\": {\"k\\u00e9y\": \"caf\\u00e9 \\ud83d\\ude00\", \"a\\/b\": \"\\\\\"} }   ";
  write_bytes(dir.file("edited.safetensors"), with_header(header, data_of(bytes)));
  const CheckpointMetadata meta = load_safetensors(dir.file("edited.safetensors"), *b.model, b.ctx.exec());
  CHECK(same_bits(a.weights(), b.weights()));
  CHECK(meta.at("k\xC3\xA9y") == "caf\xC3\xA9 \xF0\x9F\x98\x80");  // UTF-8, surrogate pair joined
  CHECK(meta.at("a/b") == "\\");
}

TEST_CASE("every malformed or mismatched file is an error naming the file and the tensor", "[cpu][checkpoint]") {
  TempDir dir;
  MlpOnCpu m(1);
  const std::string good_path = dir.file("good.safetensors");
  m.save(good_path);
  const std::string good = read_file(good_path), header = header_of(good), data = data_of(good);
  const auto file = SafetensorsFile::read(good_path);
  auto range = [&](const std::string& name) {
    const auto* t = file.find(name);
    REQUIRE(t);
    return cat("[", t->begin, ",", t->end, "]");
  };
  // 4.bias moved 20 bytes back, into the end of 4.weight (same length, still inside the data block).
  const auto* b4 = file.find("4.bias");
  REQUIRE(b4);
  const std::string overlap_4_weight = cat("[", b4->begin - 20, ",", b4->end - 20, "]");
  const std::string bias4 = "\"4.bias\":{\"dtype\":\"F32\",\"shape\":[10],\"data_offsets\":" + range("4.bias") + "}";

  struct Case {
    const char* what;
    std::string bytes;                  // the file's content
    std::vector<std::string> expected;  // substrings of the message
  };
  const Case cases[] = {
      {"empty file", "", {"fewer than the 8-byte header length"}},
      {"truncated header length", good.substr(0, 5), {"5 bytes", "fewer than the 8-byte header length"}},
      {"header length larger than the file", good.substr(0, 8 + header.size() / 2), {"header length", "larger than"}},
      {"data cut short", good.substr(0, good.size() - 100), {"'4.weight'", "outside the data block"}},
      {"bad JSON",
       with_header(replaced(header, "\"shape\":[320,784]", "\"shape\" [320,784]"), data),
       {"bad JSON header at byte", "expected ':'"}},
      {"JSON cut short", with_header(header.substr(0, 40), ""), {"bad JSON header"}},
      {"header not an object", with_header("[1, 2]  ", data), {"expected a JSON object"}},
      {"duplicate tensor",
       with_header(replaced(header, "\"2.bias\"", "\"2.weight\""), data),
       {"duplicate member '2.weight'"}},
      {"unknown dtype",
       with_header(replaced(header, "\"dtype\":\"F32\",\"shape\":[10]", "\"dtype\":\"Q7\",\"shape\":[10]"), data),
       {"'4.bias'", "unknown dtype 'Q7'"}},
      {"wrong dtype",
       with_header(replaced(header, "\"dtype\":\"F32\",\"shape\":[10]", "\"dtype\":\"I32\",\"shape\":[10]"), data),
       {"'4.bias'", "dtype I32", "F32"}},
      {"bytes do not match the shape",
       with_header(replaced(header, "\"shape\":[10]", "\"shape\":[11]"), data),
       {"'4.bias'", "needs 44"}},
      {"shape mismatch",
       with_header(replaced(header, "\"shape\":[160,320]", "\"shape\":[320,160]"), data),
       {"'2.weight'", "(320, 160)", "expects (160, 320)"}},
      {"missing tensor",
       with_header(replaced(header, "," + bias4, ""), data.substr(0, data.size() - 40)),
       {"missing tensor '4.bias'"}},
      {"unexpected tensor",
       with_header(replaced(header, bias4,
                            bias4 + ",\"6.bias\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" +
                                std::to_string(data.size()) + "," + std::to_string(data.size() + 4) + "]}"),
                   data + std::string(4, '\0')),
       {"unexpected tensor '6.bias'"}},
      {"offsets out of range",
       with_header(replaced(header, range("4.bias"), cat("[", data.size(), ",", data.size() + 40, "]")), data),
       {"'4.bias'", "outside the data block"}},
      {"offsets overlap",
       with_header(replaced(header, range("4.bias"), overlap_4_weight), data),
       {"'4.bias'", "overlaps tensor '4.weight'"}},
      {"trailing bytes", good + "junk", {"after the last tensor"}},
      {"negative offset",
       with_header(replaced(header, range("0.weight"), "[-1,1003519]"), data),
       {"'0.weight'", "data_offsets"}},
      {"extra member in an entry",
       with_header(replaced(header, "\"shape\":[10],", "\"shape\":[10],\"scale\":2,"), data),
       {"'4.bias'", "unexpected member 'scale'"}},
      {"a dimension that is not an integer",
       with_header(replaced(header, "\"shape\":[10]", "\"shape\":[10.0]"), data),
       {"'4.bias'", "\"shape\" holds '10.0', expected non-negative integers"}},
      {"a dimension that is a string",
       with_header(replaced(header, "\"shape\":[10]", "\"shape\":[\"10\"]"), data),
       {"'4.bias'", "\"shape\" holds a string"}},
      {"metadata not a string",
       with_header(replaced(header, "\"format\":\"pt\"", "\"format\":1"), data),
       {"metadata 'format' is a number, expected a string"}},
      {"metadata not an object",
       with_header(replaced(header, "{\"format\":\"pt\",\"model\":\"mlp\",\"producer\":\"nanotrain\"}", "[]"), data),
       {"\"__metadata__\" is an array, expected an object"}},
      {"duplicate metadata key",
       with_header(replaced(header, "\"format\":\"pt\"", "\"format\":\"pt\",\"format\":\"np\""), data),
       {"duplicate member 'format'"}},
      {"a string that is not UTF-8",
       with_header(replaced(header, "\"nanotrain\"", "\"nano\xFFtrain\""), data),
       {"bad JSON header at byte", "UTF-8"}},
      {"a byte order mark",
       with_header(replaced(header, "{", "\xEF\xBB\xBF{"), data),
       {"bad JSON header", "byte order mark"}},
      {"a long string cut short",
       with_header("{\"__metadata__\":{\"k\":\"" + std::string(100000, 'x'), data),
       {"bad JSON header at byte 100030", "missing closing quote"}},  // and not the 100000 bytes of the string
  };
  for (const auto& c : cases) {
    SECTION(c.what) {
      const std::string path = dir.file("bad.safetensors");
      write_bytes(path, c.bytes);
      const auto before = m.weights();
      const std::string message = error_of([&] { m.load(path); });
      INFO(message);
      CHECK(message.find(path) != std::string::npos);
      for (const auto& s : c.expected) CHECK(message.find(s) != std::string::npos);
      CHECK(message.find('\n') == std::string::npos);  // one line
      CHECK(message.size() < 500);                     // and a short one, whatever the input
      CHECK(same_bits(m.weights(), before));           // a failed load changes nothing
    }
  }
  SECTION("missing file") {
    const std::string message = error_of([&] { m.load(dir.file("absent.safetensors")); });
    INFO(message);
    CHECK(message.find("absent.safetensors") != std::string::npos);
    CHECK(message.find("cannot open") != std::string::npos);
  }
  SECTION("another model's file names the first tensor that differs") {
    MlpOnCpu small(1, "linear:100,relu,linear:10");
    const std::string message = error_of([&] { small.load(good_path); });
    INFO(message);
    CHECK(message.find("'0.weight'") != std::string::npos);
    CHECK(message.find("(320, 784)") != std::string::npos);
  }
}

TEST_CASE("a header nested 100000 deep is refused in one short line, without recursion or a huge document",
          "[cpu][checkpoint]") {
  // nlohmann's parser is iterative (no stack overflow), and the reader refuses nesting past 32 levels before it
  // builds any value: a safetensors header nests 3 deep, and a DOM of 100000 levels would take megabytes.
  TempDir dir;
  const std::string path = dir.file("deep.safetensors");
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  for (const std::string& header : {std::string(100000, '['), std::string(100000, '[') + std::string(100000, ']'),
                                    objects, std::string(33, '[') + std::string(33, ']')}) {
    write_bytes(path, with_header(header, ""));
    const std::string message = error_of([&] { SafetensorsFile::read(path); });
    INFO(message);
    CHECK(message.find(path) != std::string::npos);
    CHECK(message.find("bad JSON header: nested more than 32 deep") != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
    CHECK(message.size() < 200 + path.size());
  }
  // 32 deep is JSON that the reader takes, and then refuses for what it is.
  write_bytes(path, with_header(std::string(32, '[') + std::string(32, ']'), ""));
  const std::string message = error_of([&] { SafetensorsFile::read(path); });
  INFO(message);
  CHECK(message.find("the header is an array, expected a JSON object") != std::string::npos);
}

TEST_CASE("a name or metadata that is not UTF-8 is refused when saving, and the previous file kept",
          "[cpu][checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  MlpOnCpu m(1);
  m.save(path);
  const std::string before = read_file(path);
  const std::string message = error_of([&] {
    save_safetensors(path, *m.model, m.ctx.exec(), {{"note", "caf\xE9"}});
  });  // Latin-1
  INFO(message);
  CHECK(message.find(path) != std::string::npos);
  CHECK(message.find("UTF-8") != std::string::npos);
  CHECK(message.find('\n') == std::string::npos);
  CHECK(read_file(path) == before);
}

TEST_CASE("a checkpoint is refused by its header and size before its data block is read", "[cpu][checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("huge.safetensors");
  MlpOnCpu(1).save(path);
  fs::resize_file(path, uint64_t(100) << 30);  // 100 GB, sparse: the tensors cover its first megabyte only
  const std::string message = error_of([&] { SafetensorsFile::read(path); });
  INFO(message);
  CHECK(message.find(path) != std::string::npos);
  CHECK(message.find("after the last tensor") != std::string::npos);
  // Through the CLI, in a process that may map 1 GiB at most: the same one line, no bad_alloc.
  const auto r = test::run_command(test::with_memory_limit(
      1024, test::cli_path() + " eval --device cpu --threads 1 --load " + path + " --data " + test::mnist_dir()));
  INFO(r.out);
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("after the last tensor") != std::string::npos);
  CHECK(r.out.find("bad_alloc") == std::string::npos);
}

TEST_CASE("a failed save leaves the previous checkpoint intact", "[cpu][checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  MlpOnCpu first(1), second(2);
  first.save(path);
  const std::string before = read_file(path);

  SECTION("a successful save replaces the file and leaves no temporary file") {
    second.save(path);
    CHECK(read_file(path) != before);
    CHECK(test::temporaries_of(path).empty());
  }
  SECTION("the temporary file cannot be created") {
    write_bytes(dir.file("plain"), "a file, not a folder");  // mkstemp under it fails: ENOTDIR
    const std::string message = error_of([&] { second.save(dir.file("plain/m.safetensors")); });
    INFO(message);
    CHECK(message.find("plain/m.safetensors") != std::string::npos);
    CHECK(message.find("temporary") != std::string::npos);
    CHECK(read_file(path) == before);
  }
  SECTION("the disk fills up in the middle of the write") {
    // RLIMIT_FSIZE makes write() fail with EFBIG past 64 KB, like a full disk, inside this process only.
    rlimit old{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // else the kernel kills the process instead
    rlimit small = old;
    small.rlim_cur = 64 * 1024;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    const std::string message = error_of([&] { second.save(path); });
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    INFO(message);
    CHECK(message.find("writing") != std::string::npos);
    CHECK(message.find(path) != std::string::npos);
    CHECK(read_file(path) == before);
    CHECK(test::temporaries_of(path).empty());
  }
  SECTION("the folder does not exist") {
    const std::string message = error_of([&] { second.save(dir.file("no/such/folder/m.safetensors")); });
    CHECK(message.find("no/such/folder/m.safetensors") != std::string::npos);
  }
}

TEST_CASE("save, load and continue gives the same losses and weights as never stopping",
          "[cpu][checkpoint][training]") {
  TempDir dir;
  auto train = data::subset(test::mnist().train, 0, 960);
  test::RigOptions o;
  o.seed = 11;
  o.sgd = {0.05f, 0.f, 1e-3f};  // SGD without momentum keeps no state besides the weights
  test::Rig straight(train, o), resumed(train, o);
  straight.trainer.train_epoch(1);
  save_safetensors(dir.file("epoch1.safetensors"), *straight.model, straight.ctx.exec());
  const EpochMetrics want = straight.trainer.train_epoch(2);

  REQUIRE(!same_bits(resumed.weights(), straight.weights()));
  load_safetensors(dir.file("epoch1.safetensors"), *resumed.model, resumed.ctx.exec());
  const EpochMetrics got = resumed.trainer.train_epoch(2);
  CHECK(got.train_loss == want.train_loss);  // bit-identical: same weights, same order, same kernels
  CHECK(same_bits(resumed.weights(), straight.weights()));
  for (int64_t s = 0; s < 5; ++s) CHECK(resumed.step(s) == straight.step(s));
}

TEST_CASE("write_npy_i32 writes a .npy that numpy's format describes", "[cpu][checkpoint]") {
  TempDir dir;
  write_npy_i32(dir.file("a.npy"), {1, -2, 3, 4, 5, 6}, {2, 3});
  const std::string bytes = read_file(dir.file("a.npy"));
  REQUIRE(bytes.size() > 10);
  CHECK(bytes.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));  // magic, format 1.0
  const size_t header = static_cast<unsigned char>(bytes[8]) | size_t(static_cast<unsigned char>(bytes[9])) << 8;
  CHECK((10 + header) % 64 == 0);  // the format's alignment of the data
  REQUIRE(bytes.size() == 10 + header + 6 * sizeof(int32_t));
  CHECK(bytes.find("{'descr': '<i4', 'fortran_order': False, 'shape': (2,3), }") == 10);
  CHECK(bytes[10 + header - 1] == '\n');
  int32_t second = 0;
  std::memcpy(&second, bytes.data() + 10 + header + 4, 4);
  CHECK(second == -2);
}

// ---- the CLI ---------------------------------------------------------------------------------------------

TEST_CASE("train --order-out writes the order that bench/nt_order.py reproduces", "[cpu][checkpoint][cli]") {
  if (test::run_command("python3 --version").exit_code != 0) {
    WARN("python3 not found: cannot cross-check bench/nt_order.py against the engine (test skipped)");
    return;
  }
  TempDir dir;
  for (int seed : {1, 7}) {
    const std::string npy = dir.file(cat("order", seed, ".npy"));
    auto r = nanotrain(cat("train --epochs 2 --batch 100 --train-limit 1000 --seed ", seed, " --order-out ", npy));
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    auto check = test::run_command(
        cat("python3 ", (repo_root() / "bench" / "nt_order.py").string(), " --seed ", seed, " --n 1000 --check ", npy));
    INFO(check.out);
    CHECK(check.exit_code == 0);
    CHECK(check.out.find("2 epochs of 1000 indices identical") != std::string::npos);
  }
}

TEST_CASE("train --save then eval --load reports the last epoch's test loss and accuracy", "[cpu][checkpoint][cli]") {
  TempDir dir;
  const std::string model = dir.file("model.safetensors");
  auto trained = nanotrain("train --epochs 1 --batch 50 --train-limit 2000 --save " + model);
  INFO(trained.out);
  REQUIRE(trained.exit_code == 0);
  auto evaluated = nanotrain("eval --batch 50 --load " + model);
  INFO(evaluated.out);
  REQUIRE(evaluated.exit_code == 0);
  std::smatch t, e;
  REQUIRE(std::regex_search(trained.out, t, std::regex(R"(test loss ([0-9.]+) acc +([0-9.]+)%)")));
  REQUIRE(std::regex_search(evaluated.out, e, std::regex(R"(test loss ([0-9.]+) \| test acc ([0-9.]+)%)")));
  CHECK(e[2].str() == t[2].str());                                        // accuracy to 0.01 points: the same
  CHECK(std::abs(std::stod(e[1].str()) - std::stod(t[1].str())) < 1e-4);  // train prints 4 decimals
}

TEST_CASE("train --init-out saves the start, --init-from starts from a file", "[cpu][checkpoint][cli]") {
  TempDir dir;
  const std::string common = " --epochs 1 --batch 100 --train-limit 1000";
  auto a = nanotrain("train --seed 5" + common + " --init-out " + dir.file("init5.safetensors") + " --save " +
                     dir.file("a.safetensors"));
  INFO(a.out);
  REQUIRE(a.exit_code == 0);
  // The same seed from the saved start trains to the same bits.
  auto b = nanotrain("train --seed 5" + common + " --init-from " + dir.file("init5.safetensors") + " --save " +
                     dir.file("b.safetensors"));
  INFO(b.out);
  REQUIRE(b.exit_code == 0);
  CHECK(read_file(dir.file("a.safetensors")) == read_file(dir.file("b.safetensors")));
  // Another seed's run starting from the file saves the file's weights as its start, not its own.
  auto c = nanotrain("train --seed 9" + common + " --init-from " + dir.file("init5.safetensors") + " --init-out " +
                     dir.file("init9.safetensors"));
  INFO(c.out);
  REQUIRE(c.exit_code == 0);
  const auto init5 = SafetensorsFile::read(dir.file("init5.safetensors"));
  const auto init9 = SafetensorsFile::read(dir.file("init9.safetensors"));
  for (const auto& t : init5.tensors()) CHECK(init9.floats(t.name) == init5.floats(t.name));
  CHECK(init5.metadata().at("seed") == "5");
  CHECK(init9.metadata().at("seed") == "9");
}

TEST_CASE("checkpoint flags fail early with one line naming the flag, file or tensor", "[cpu][checkpoint][cli]") {
  TempDir dir;
  auto init = nanotrain("train --epochs 1 --batch 100 --train-limit 200 --init-out " + dir.file("init.safetensors"));
  REQUIRE(init.exit_code == 0);
  struct Case {
    const char* what;  // the section's name: fixed, while the temporary folder in args changes per run
    std::string args;
    int exit_code;
    std::vector<std::string> expected;
  };
  const Case cases[] = {
      {"--init-from another model's file",
       "train --model linear:64,relu,linear:10 --init-from " + dir.file("init.safetensors"),
       1,
       {"init.safetensors", "'0.weight'", "(320, 784)", "(64, 784)"}},
      {"--init-from a missing file",
       "train --init-from " + dir.file("absent.safetensors"),
       2,
       {"--init-from", "absent.safetensors"}},  // a usage error, as eval --load of a missing file
      {"--save into a missing folder", "train --save /no/such/folder/m.safetensors", 2, {"--save", "/no/such/folder"}},
      {"--init-out into a missing folder", "train --init-out /no/such/folder/m.safetensors", 2, {"--init-out"}},
      {"--order-out into a missing folder", "train --order-out /no/such/folder/o.npy", 2, {"--order-out"}},
      {"eval --load of a missing file",
       "eval --load " + dir.file("absent.safetensors"),
       2,
       {"--load", "absent.safetensors"}},
      {"eval --load of another model's file",
       "eval --model linear:10 --load " + dir.file("init.safetensors"),
       1,
       {"'0.weight'", "(320, 784)", "(10, 784)"}},
      {"eval without --load", "eval", 2, {"--load"}},
  };
  for (const auto& c : cases) {
    SECTION(c.what) {
      auto r = nanotrain(c.args);
      INFO(r.out);
      CHECK(r.exit_code == c.exit_code);
      CHECK(std::count(r.out.begin(), r.out.end(), '\n') <= 1);
      for (const auto& s : c.expected) CHECK(r.out.find(s) != std::string::npos);
    }
  }
}
