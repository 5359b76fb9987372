// safetensors checkpoints and .npy arrays (see checkpoint.h for the formats and the guarantees).
//
// The header is parsed by a small recursive-descent JSON parser (RFC 8259: any member order, any
// whitespace, string escapes including \u surrogate pairs) rather than a library: the header is a few
// hundred bytes of one fixed shape, and a parser we own reports each fault with its byte offset.
#include "engine/checkpoint.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <span>
#include <string_view>
#include <tuple>
#include <utility>

#include "core/atomic_file.h"
#include "kernels/runtime.h"

namespace nt {

static_assert(std::endian::native == std::endian::little,
              "safetensors and .npy data are little-endian; this build writes host byte order");

namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit
constexpr int kMaxJsonDepth = 32;                  // a safetensors header nests 3 deep

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// ---- JSON ------------------------------------------------------------------------------------------

struct JsonMember;
struct Json {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  std::string text;  // a string's value, or a number's literal text
  std::vector<Json> items;
  std::vector<JsonMember> members;  // in document order, keys unique
};
// A struct, not a std::pair: a pair's traits need Json complete inside Json's own definition (clang says so).
struct JsonMember {
  std::string key;
  Json value;
};

const char* kind_name(Json::Kind k) {
  switch (k) {
    case Json::Kind::null: return "null";
    case Json::Kind::boolean: return "a boolean";
    case Json::Kind::number: return "a number";
    case Json::Kind::string: return "a string";
    case Json::Kind::array: return "an array";
    case Json::Kind::object: return "an object";
  }
  return "?";
}

struct JsonError {
  size_t offset;
  std::string what;
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : s_(text) {}

  // One value, then nothing but whitespace (safetensors pads the header with spaces).
  Json document() {
    skip_space();
    Json v = value(0);
    skip_space();
    if (pos_ != s_.size()) fail("unexpected characters after the JSON object");
    return v;
  }

 private:
  [[noreturn]] void fail(std::string what) const { throw JsonError{pos_, std::move(what)}; }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }
  void skip_space() {
    while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  void expect(char c) {
    if (peek() != c) fail(at_end() ? cat("expected '", c, "' but the header ended") : cat("expected '", c, "'"));
    ++pos_;
  }

  Json value(int depth) {
    if (depth > kMaxJsonDepth) fail("nested too deeply");
    switch (peek()) {
      case '{': return object(depth);
      case '[': return array(depth);
      case '"': {
        Json v;
        v.kind = Json::Kind::string;
        v.text = string();
        return v;
      }
      case 't': return literal("true", Json::Kind::boolean);
      case 'f': return literal("false", Json::Kind::boolean);
      case 'n': return literal("null", Json::Kind::null);
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return number();
        fail(at_end() ? "the header ended where a value was expected" : "expected a JSON value");
    }
  }

  Json object(int depth) {
    Json v;
    v.kind = Json::Kind::object;
    expect('{');
    skip_space();
    if (peek() == '}') return ++pos_, v;
    std::set<std::string> seen;
    for (;;) {
      skip_space();
      if (peek() != '"') fail("expected a member name in double quotes");
      const size_t key_at = pos_;
      std::string key = string();
      if (!seen.insert(key).second) {
        pos_ = key_at;
        fail(cat("duplicate member '", key, "'"));
      }
      skip_space();
      expect(':');
      skip_space();
      v.members.push_back({std::move(key), value(depth + 1)});
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      return v;
    }
  }

  Json array(int depth) {
    Json v;
    v.kind = Json::Kind::array;
    expect('[');
    skip_space();
    if (peek() == ']') return ++pos_, v;
    for (;;) {
      skip_space();
      v.items.push_back(value(depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return v;
    }
  }

  Json literal(std::string_view word, Json::Kind kind) {
    if (s_.substr(pos_, word.size()) != word) fail("expected a JSON value");
    pos_ += word.size();
    Json v;
    v.kind = kind;
    v.text = std::string(word);
    return v;
  }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?   kept as text; the caller decides what it may be.
  Json number() {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (!at_end() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (pos_ == from) fail("malformed number");
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') ++pos_;
    else digits();
    if (peek() == '.') ++pos_, digits();
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      digits();
    }
    Json v;
    v.kind = Json::Kind::number;
    v.text = std::string(s_.substr(start, pos_ - start));
    return v;
  }

  unsigned hex4() {
    unsigned u = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      const char c = peek();
      u <<= 4;
      if (c >= '0' && c <= '9') u |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') u |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') u |= unsigned(c - 'A' + 10);
      else fail("malformed \\u escape");
    }
    return u;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6)), out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) {
        --pos_;
        fail("control character inside a string");
      }
      if (c != '\\') {
        out += c;
        continue;
      }
      const char e = peek();
      ++pos_;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a high surrogate: its low half must follow
            if (s_.substr(pos_, 2) != "\\u") fail("unpaired UTF-16 surrogate in \\u escape");
            pos_ += 2;
            const unsigned low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("unpaired UTF-16 surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("unpaired UTF-16 surrogate in \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          fail("invalid escape in a string");
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

std::string json_escaped(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// ---- files -----------------------------------------------------------------------------------------

// A checkpoint file read in the order it is validated: its size, the 8-byte header length, the JSON header, and
// only once those agree with the size, the data block. A damaged or hostile file (a 100 GB sparse one, a header
// length of 2^60) is refused before anything of its size is allocated.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& path) : path_(path) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) throw Error(cat("checkpoint ", quoted(path), ": is a folder, not a file"));
    in_.open(path, std::ios::binary);
    if (!in_) throw Error(cat("checkpoint ", quoted(path), ": cannot open: ", std::strerror(errno)));
    size_ = fs::file_size(path, ec);
    if (ec) throw Error(cat("checkpoint ", quoted(path), ": cannot tell its size: ", ec.message()));
  }
  uint64_t size() const { return size_; }
  // The next `n` bytes, which the caller has checked lie within the file.
  std::vector<uint8_t> next(uint64_t n) {
    std::vector<uint8_t> bytes;
    try {
      bytes.resize(static_cast<size_t>(n));
    } catch (const std::bad_alloc&) {
      throw OutOfMemory(cat("checkpoint ", quoted(path_), ": out of memory holding ", n, " bytes at offset ", offset_));
    }
    if (n > 0 && !in_.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(n)))
      throw Error(cat("checkpoint ", quoted(path_), ": read error after ", in_.gcount(), " of ", n, " bytes at offset ",
                      offset_));
    offset_ += n;
    return bytes;
  }

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0, offset_ = 0;
};

// ---- safetensors validation ------------------------------------------------------------------------

// Bytes per element of the safetensors dtypes; 0 for an unknown name.
size_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes{
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string shape_str(const std::vector<int64_t>& shape) { return Shape(shape).str(); }

// Whether `v` is a non-negative integer literal no larger than `limit` (stored in *out).
bool to_uint(const Json& v, uint64_t limit, uint64_t* out) {
  if (v.kind != Json::Kind::number) return false;
  const char* first = v.text.data();
  const char* last = first + v.text.size();
  auto [end, ec] = std::from_chars(first, last, *out);
  return ec == std::errc{} && end == last && *out <= limit;
}

class TensorEntryReader {
 public:
  TensorEntryReader(const std::string& path, const std::string& name) : path_(path), name_(name) {}

  SafetensorsTensor read(const Json& entry, uint64_t data_bytes) const {
    if (entry.kind != Json::Kind::object) fail(cat("its entry is ", kind_name(entry.kind), ", expected an object"));
    const Json* dtype = nullptr;
    const Json* shape = nullptr;
    const Json* offsets = nullptr;
    for (const auto& [key, v] : entry.members) {
      if (key == "dtype") dtype = &v;
      else if (key == "shape") shape = &v;
      else if (key == "data_offsets") offsets = &v;
      else fail(cat("unexpected member '", key, "' (expected dtype, shape, data_offsets)"));
    }
    if (!dtype || !shape || !offsets)
      fail(cat("missing \"", !dtype ? "dtype" : !shape ? "shape" : "data_offsets", "\""));

    SafetensorsTensor t;
    t.name = name_;
    if (dtype->kind != Json::Kind::string) fail("\"dtype\" is not a string");
    t.dtype = dtype->text;
    const size_t element = dtype_bytes(t.dtype);
    if (element == 0) fail(cat("unknown dtype '", t.dtype, "'"));

    if (shape->kind != Json::Kind::array) fail("\"shape\" is not an array");
    uint64_t numel = 1;
    for (const auto& d : shape->items) {
      uint64_t dim = 0;
      if (!to_uint(d, uint64_t(std::numeric_limits<int64_t>::max()), &dim))
        fail(cat("\"shape\" holds '", d.text, "', expected non-negative integers"));
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim / element)
        fail("\"shape\" is too large");
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }

    if (offsets->kind != Json::Kind::array || offsets->items.size() != 2)
      fail("\"data_offsets\" must be an array [begin, end]");
    if (!to_uint(offsets->items[0], std::numeric_limits<uint64_t>::max(), &t.begin) ||
        !to_uint(offsets->items[1], std::numeric_limits<uint64_t>::max(), &t.end))
      fail("\"data_offsets\" must hold two non-negative integers");
    if (t.begin > t.end) fail(cat("data_offsets [", t.begin, ", ", t.end, "] run backwards"));
    if (t.end > data_bytes)
      fail(cat("data_offsets [", t.begin, ", ", t.end, "] lie outside the data block of ", data_bytes,
               " bytes (file truncated?)"));
    if (t.end - t.begin != numel * element)
      fail(cat("data_offsets [", t.begin, ", ", t.end, "] hold ", t.end - t.begin, " bytes but ", t.dtype, " ",
               shape_str(t.shape), " needs ", numel * element));
    return t;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(cat("checkpoint ", quoted(path_), ": tensor ", quoted(name_), ": ", what));
  }
  const std::string& path_;
  const std::string& name_;
};

// The tensors must tile the data block: sorted by offset, each starts where the previous ended, the
// first at 0, the last at the end (the reference implementation's rule).
void check_tiling(const std::string& path, std::vector<SafetensorsTensor> sorted, uint64_t data_bytes) {
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t at = 0;
  const SafetensorsTensor* previous = nullptr;
  for (const auto& t : sorted) {
    if (t.begin < at)
      throw Error(cat("checkpoint ", quoted(path), ": tensor ", quoted(t.name), " [", t.begin, ", ", t.end,
                      ") overlaps tensor ", quoted(previous->name), " [", previous->begin, ", ", previous->end, ")"));
    if (t.begin > at)
      throw Error(cat("checkpoint ", quoted(path), ": tensor ", quoted(t.name), " starts at byte ", t.begin,
                      " of the data block, leaving a gap after ", previous ? quoted(previous->name) : "the start",
                      " (which ends at ", at, ")"));
    at = t.end;
    previous = &t;
  }
  if (at != data_bytes)
    throw Error(cat("checkpoint ", quoted(path), ": the data block has ", data_bytes - at,
                    " bytes after the last tensor (", data_bytes, " in all)"));
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// ---- model <-> tensors -----------------------------------------------------------------------------

// The safetensors dtype a model tensor is stored as (f32 models only: checked by the callers).
const char* file_dtype(const Tensor& t) { return t.dtype() == DType::i64 ? "I64" : "F32"; }

NamedTensor host_tensor(const std::string& name, const Tensor& t, const kernels::Exec& exec) {
  NamedTensor out{name, file_dtype(t), t.shape().dims(), std::vector<uint8_t>(t.bytes())};
  kernels::copy_device_to_host(exec, out.bytes.data(), t.raw(), out.bytes.size());
  return out;
}

std::vector<NamedTensor> host_tensors(const ParamStore& params, const kernels::Exec& exec) {
  std::vector<NamedTensor> out;
  for (const auto& p : params.params()) out.push_back(host_tensor(p.name, p.value, exec));
  for (const auto& b : params.buffers()) out.push_back(host_tensor(b.name, b.value, exec));
  kernels::synchronize(exec);  // every copy has landed
  return out;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
  return s;
}

}  // namespace

// ---- SafetensorsFile ---------------------------------------------------------------------------------

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  CheckpointReader file(path);
  const uint64_t size = file.size();
  if (size < 8)
    throw Error(cat("checkpoint ", quoted(path), ": truncated or not a safetensors file: ", size,
                    " bytes, fewer than the 8-byte header length"));
  const uint64_t header_bytes = read_u64_le(file.next(8).data());
  if (header_bytes > size - 8)
    throw Error(cat("checkpoint ", quoted(path), ": header length ", header_bytes, " is larger than the ",
                    size - 8, " bytes that follow it (truncated or not a safetensors file)"));
  if (header_bytes > kMaxHeaderBytes)
    throw Error(cat("checkpoint ", quoted(path), ": header length ", header_bytes, " exceeds the ",
                    kMaxHeaderBytes, "-byte limit of the format"));

  const std::vector<uint8_t> header_text = file.next(header_bytes);
  const std::string_view header(reinterpret_cast<const char*>(header_text.data()), header_bytes);
  Json root;
  try {
    root = JsonParser(header).document();
  } catch (const JsonError& e) {
    throw Error(cat("checkpoint ", quoted(path), ": bad JSON header at byte ", 8 + e.offset, ": ", e.what));
  }
  if (root.kind != Json::Kind::object)
    throw Error(cat("checkpoint ", quoted(path), ": the header is ", kind_name(root.kind), ", expected a JSON object"));

  SafetensorsFile f;
  f.path_ = path;
  const uint64_t data_bytes = size - 8 - header_bytes;
  for (const auto& [name, entry] : root.members) {
    if (name == "__metadata__") {
      if (entry.kind != Json::Kind::object)
        throw Error(cat("checkpoint ", quoted(path), ": \"__metadata__\" is ", kind_name(entry.kind), ", expected an object"));
      for (const auto& [key, v] : entry.members) {
        if (v.kind != Json::Kind::string)
          throw Error(cat("checkpoint ", quoted(path), ": metadata ", quoted(key), " is ", kind_name(v.kind),
                          ", expected a string"));
        f.metadata_[key] = v.text;
      }
      continue;
    }
    f.tensors_.push_back(TensorEntryReader(path, name).read(entry, data_bytes));
  }
  check_tiling(path, f.tensors_, data_bytes);
  f.data_ = file.next(data_bytes);  // its size now agrees with the header's tensors
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<float> SafetensorsFile::floats(const std::string& name) const {
  const SafetensorsTensor* t = find(name);
  if (!t) throw Error(cat("checkpoint ", quoted(path_), ": no tensor ", quoted(name)));
  if (t->dtype != "F32")
    throw Error(cat("checkpoint ", quoted(path_), ": tensor ", quoted(name), " has dtype ", t->dtype, ", expected F32"));
  std::vector<float> out((t->end - t->begin) / sizeof(float));
  std::memcpy(out.data(), bytes(*t), t->end - t->begin);
  return out;
}

// ---- writing ---------------------------------------------------------------------------------------

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const CheckpointMetadata& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      header += cat(first ? "" : ",", json_escaped(key), ":", json_escaped(value));
      first = false;
    }
    header += "}";
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    NT_CHECK(t.name != "__metadata__" && names.insert(t.name).second, "tensor name '", t.name, "' is reserved or repeated");
    const size_t element = dtype_bytes(t.dtype);
    NT_CHECK(element != 0 && t.bytes.size() == static_cast<size_t>(Shape(t.shape).numel()) * element, "tensor '",
             t.name, "': ", t.bytes.size(), " bytes of ", t.dtype, " for shape ", shape_str(t.shape));
    const uint64_t bytes = t.bytes.size();
    header += cat(header.size() > 1 ? "," : "", json_escaped(t.name), ":{\"dtype\":\"", t.dtype, "\",\"shape\":[");
    for (size_t i = 0; i < t.shape.size(); ++i) header += cat(i ? "," : "", t.shape[i]);
    header += cat("],\"data_offsets\":[", offset, ",", offset + bytes, "]}");
    offset += bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // the data block starts 8-byte aligned

  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((uint64_t(header.size()) >> (8 * i)) & 0xFF);
  std::vector<std::string_view> parts{std::string_view(length, 8), header};
  for (const auto& t : tensors)
    parts.emplace_back(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  write_file_atomically(path, parts);
}

CheckpointImage checkpoint_image(const ParamStore& params, const kernels::Exec& exec, CheckpointMetadata metadata) {
  NT_CHECK(!params.params().empty(), "saving a model without parameters (init_params not called)");
  if (params.dtype() != DType::f32)
    throw Error(cat("checkpoints hold f32 parameters, this model's are ", dtype_name(params.dtype())));
  metadata.try_emplace("format", "pt");  // what safetensors' PyTorch helpers write and check
  metadata.try_emplace("producer", "nanotrain");
  return {host_tensors(params, exec), std::move(metadata)};
}

bool is_run_state(const std::string& tensor_name) {
  return tensor_name.starts_with("optimizer.") || tensor_name.starts_with("train_state.");
}

CheckpointImage checkpoint_image(const Model& model, const kernels::Exec& exec, CheckpointMetadata metadata,
                                 const StateTensors& state) {
  metadata.try_emplace("model", model.name());
  CheckpointImage image = checkpoint_image(model.params(), exec, std::move(metadata));
  for (const auto& [name, tensor] : state) {
    NT_CHECK(is_run_state(name), "run state '", name, "' outside optimizer. and train_state.");
    image.tensors.push_back(host_tensor(name, tensor, exec));
  }
  kernels::synchronize(exec);  // every copy has landed
  return image;
}

void write_checkpoint(const std::string& path, const CheckpointImage& image) {
  write_safetensors(path, image.tensors, image.metadata);
}

void save_safetensors(const std::string& path, const ParamStore& params, const kernels::Exec& exec,
                      CheckpointMetadata metadata) {
  write_checkpoint(path, checkpoint_image(params, exec, std::move(metadata)));
}

void save_safetensors(const std::string& path, const Model& model, const kernels::Exec& exec,
                      CheckpointMetadata metadata) {
  write_checkpoint(path, checkpoint_image(model, exec, std::move(metadata)));
}

// ---- loading into a model --------------------------------------------------------------------------

CheckpointMetadata load_safetensors(const std::string& path, Model& model, const kernels::Exec& exec,
                                    const StateTensors& state) {
  NT_CHECK(!model.params().params().empty(), "loading into a model without parameters (call init_params first)");
  if (model.params().dtype() != DType::f32)
    throw Error(cat("checkpoint ", quoted(path), ": checkpoints hold f32 parameters, this model's are ",
                    dtype_name(model.params().dtype())));
  const SafetensorsFile file = SafetensorsFile::read(path);
  // Every tensor the model holds: parameters, then buffers.
  std::vector<std::pair<std::string, Tensor>> targets;
  for (const auto& p : model.params().params()) targets.emplace_back(p.name, p.value);
  for (const auto& b : model.params().buffers()) targets.emplace_back(b.name, b.value);
  targets.insert(targets.end(), state.begin(), state.end());

  // Validate everything before copying anything, so that a failed load leaves the model unchanged.
  std::vector<std::string> missing, unexpected;
  std::set<std::string> expected;
  for (const auto& [name, value] : targets) {
    expected.insert(name);
    const SafetensorsTensor* t = file.find(name);
    if (!t) {
      missing.push_back(name);
      continue;
    }
    if (t->dtype != file_dtype(value))
      throw Error(cat("checkpoint ", quoted(path), ": tensor ", quoted(name), " has dtype ", t->dtype,
                      ", the model needs ", file_dtype(value)));
    if (t->shape != value.shape().dims())
      throw Error(cat("checkpoint ", quoted(path), ": tensor ", quoted(name), " has shape ", shape_str(t->shape),
                      " but model ", quoted(model.name()), " expects ", value.shape().str()));
  }
  for (const auto& t : file.tensors())
    if (!expected.count(t.name) && (!state.empty() || !is_run_state(t.name))) unexpected.push_back(t.name);
  if (!missing.empty())
    throw Error(cat("checkpoint ", quoted(path), ": missing tensor", missing.size() > 1 ? "s " : " ",
                    join_names(missing), " of model ", quoted(model.name()),
                    unexpected.empty() ? "" : cat("; the file has ", join_names(unexpected), " instead")));
  if (!unexpected.empty())
    throw Error(cat("checkpoint ", quoted(path), ": unexpected tensor", unexpected.size() > 1 ? "s " : " ",
                    join_names(unexpected), " (model ", quoted(model.name()), " has ", join_names(std::vector<std::string>(
                        expected.begin(), expected.end())), ")"));

  for (const auto& [name, value] : targets)
    kernels::copy_host_to_device(exec, value.raw(), file.bytes(*file.find(name)), value.bytes());
  kernels::synchronize(exec);  // the file's bytes go out of scope when we return
  return file.metadata();
}

// ---- .npy --------------------------------------------------------------------------------------------

void write_npy_i32(const std::string& path, const std::vector<int32_t>& values, const std::vector<int64_t>& shape) {
  NT_CHECK(static_cast<int64_t>(values.size()) == Shape(shape).numel(), values.size(), " values for shape ",
           shape_str(shape));
  std::string dims;
  for (const auto d : shape) dims += cat(d, ",");
  if (shape.size() > 1) dims.pop_back();  // (N,) for one dimension, (A,B) for more
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + length (2) + header + '\n' is padded to a multiple of 64 bytes.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  char preamble[10] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<char>(header.size() & 0xFF),
                       static_cast<char>(header.size() >> 8)};
  const std::string_view parts[] = {std::string_view(preamble, 10), header,
                                    std::string_view(reinterpret_cast<const char*>(values.data()),
                                                     values.size() * sizeof(int32_t))};
  write_file_atomically(path, parts);
}

}  // namespace nt
