// safetensors checkpoints and .npy arrays (see checkpoint.h for the formats and the guarantees).
//
// The header is JSON, read and written with nlohmann/json (the distribution's nlohmann-json3-dev) rather than by a
// parser of our own: a well-kept library, fuzzed by others, that follows RFC 8259 (any member order, any whitespace,
// string escapes including \u surrogate pairs, UTF-8 validated) and escapes what it writes. The kernels are this
// project's product; the plumbing around them is not. What the format asks beyond JSON (each entry's members, the
// dtypes, shapes and offsets, offsets that tile the data block, string metadata) is checked here.
#include "engine/checkpoint.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/json_messages.h"
#include "kernels/runtime.h"

namespace nt {

static_assert(std::endian::native == std::endian::little,
              "safetensors and .npy data are little-endian; this build writes host byte order");

namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// ---- JSON ------------------------------------------------------------------------------------------

// Members in document order: tensors() lists the header's tensors as the file does.
using Json = nlohmann::ordered_json;

// A first pass over the header with nlohmann's SAX parser, before any value is built. It stops at the first syntax
// error (the lexer validates RFC 8259 and UTF-8), and at what a DOM would let pass:
//  - a member name repeated within an object: a DOM keeps one of the two silently, and which tensor or metadata
//    value a file holds must not depend on that;
//  - nesting deeper than kMaxJsonDepth. nlohmann's parser and its destructor are iterative, so depth does not
//    overflow the stack (10 million nested '[' parse and free with an 8 MB stack), but a DOM costs about 80 bytes a
//    level: the 100 MB a header may hold would build gigabytes of empty arrays. A safetensors header nests 3 deep.
class HeaderCheck : public nlohmann::json_sax<Json> {
 public:
  static constexpr int kMaxJsonDepth = 32;

  std::string error;         // what stopped the pass; empty while the header is fine
  std::optional<size_t> at;  // the byte of the header where, for syntax errors

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return deeper();
  }
  bool key(string_t& name) override {
    if (keys_.back().insert(name).second) return true;
    error = cat("duplicate member '", name, "'");
    return false;
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return deeper(); }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::json::exception& e) override {
    at = position > 0 ? position - 1 : 0;  // characters read, the offending one included
    error = json_error_text(e.what(), /*with_location=*/false);
    return false;
  }

 private:
  bool deeper() {
    if (++depth_ <= kMaxJsonDepth) return true;
    error = cat("nested more than ", kMaxJsonDepth, " deep");
    return false;
  }
  int depth_ = 0;
  std::vector<std::set<std::string>> keys_;  // of each object open
};

// The header as a JSON document, checked by HeaderCheck first; throws nt::Error naming the file.
Json parse_header(const std::string& path, std::string_view header) {
  auto bad = [&](std::optional<size_t> at, const std::string& what) {
    return Error(
        cat("checkpoint ", quoted(path), ": bad JSON header", at ? cat(" at byte ", 8 + *at) : "", ": ", what));
  };
  // nlohmann skips a UTF-8 byte order mark, which RFC 8259 forbids writing: a header that starts with one is refused.
  if (header.starts_with("\xEF\xBB\xBF")) throw bad(0, "a UTF-8 byte order mark");
  HeaderCheck check;
  if (!Json::sax_parse(header, &check) || !check.error.empty()) throw bad(check.at, check.error);
  Json root = Json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) throw bad(std::nullopt, "not JSON");  // HeaderCheck has refused anything that is not
  return root;
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
  static const std::map<std::string, size_t> sizes{{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
                                                   {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                                                   {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string shape_str(const std::vector<int64_t>& shape) { return Shape(shape).str(); }

// Whether `v` is a non-negative integer no larger than `limit` (stored in *out). nlohmann holds every such literal
// up to 2^64 - 1 as number_unsigned; "-0", "1.0", "1e3" and larger integers are other kinds of number.
bool to_uint(const Json& v, uint64_t limit, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return *out <= limit;
}

class TensorEntryReader {
 public:
  TensorEntryReader(const std::string& path, const std::string& name) : path_(path), name_(name) {}

  SafetensorsTensor read(const Json& entry, uint64_t data_bytes) const {
    if (!entry.is_object()) fail(cat("its entry is ", json_kind_name(entry), ", expected an object"));
    const Json* dtype = nullptr;
    const Json* shape = nullptr;
    const Json* offsets = nullptr;
    for (auto it = entry.begin(); it != entry.end(); ++it) {
      if (it.key() == "dtype")
        dtype = &it.value();
      else if (it.key() == "shape")
        shape = &it.value();
      else if (it.key() == "data_offsets")
        offsets = &it.value();
      else
        fail(cat("unexpected member '", it.key(), "' (expected dtype, shape, data_offsets)"));
    }
    if (!dtype || !shape || !offsets)
      fail(cat("missing \"", !dtype ? "dtype" : !shape ? "shape" : "data_offsets", "\""));

    SafetensorsTensor t;
    t.name = name_;
    if (!dtype->is_string()) fail("\"dtype\" is not a string");
    t.dtype = dtype->get<std::string>();
    const size_t element = dtype_bytes(t.dtype);
    if (element == 0) fail(cat("unknown dtype '", t.dtype, "'"));

    if (!shape->is_array()) fail("\"shape\" is not an array");
    uint64_t numel = 1;
    for (const auto& d : *shape) {
      uint64_t dim = 0;
      if (!to_uint(d, uint64_t(std::numeric_limits<int64_t>::max()), &dim))
        fail(cat("\"shape\" holds ", d.is_number() ? "'" + d.dump() + "'" : json_kind_name(d),
                 ", expected non-negative integers"));
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim / element) fail("\"shape\" is too large");
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }

    if (!offsets->is_array() || offsets->size() != 2) fail("\"data_offsets\" must be an array [begin, end]");
    if (!to_uint((*offsets)[0], std::numeric_limits<uint64_t>::max(), &t.begin) ||
        !to_uint((*offsets)[1], std::numeric_limits<uint64_t>::max(), &t.end))
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
    throw Error(cat("checkpoint ", quoted(path), ": header length ", header_bytes, " is larger than the ", size - 8,
                    " bytes that follow it (truncated or not a safetensors file)"));
  if (header_bytes > kMaxHeaderBytes)
    throw Error(cat("checkpoint ", quoted(path), ": header length ", header_bytes, " exceeds the ", kMaxHeaderBytes,
                    "-byte limit of the format"));

  const std::vector<uint8_t> header_text = file.next(header_bytes);
  const std::string_view header(reinterpret_cast<const char*>(header_text.data()), header_bytes);
  const Json root = parse_header(path, header);
  if (!root.is_object())
    throw Error(cat("checkpoint ", quoted(path), ": the header is ", json_kind_name(root), ", expected a JSON object"));

  SafetensorsFile f;
  f.path_ = path;
  const uint64_t data_bytes = size - 8 - header_bytes;
  for (auto member = root.begin(); member != root.end(); ++member) {
    const std::string& name = member.key();
    const Json& entry = member.value();
    if (name == "__metadata__") {
      if (!entry.is_object())
        throw Error(
            cat("checkpoint ", quoted(path), ": \"__metadata__\" is ", json_kind_name(entry), ", expected an object"));
      for (auto it = entry.begin(); it != entry.end(); ++it) {
        if (!it.value().is_string())
          throw Error(cat("checkpoint ", quoted(path), ": metadata ", quoted(it.key()), " is ",
                          json_kind_name(it.value()), ", expected a string"));
        f.metadata_[it.key()] = it.value().get<std::string>();
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
    throw Error(
        cat("checkpoint ", quoted(path_), ": tensor ", quoted(name), " has dtype ", t->dtype, ", expected F32"));
  std::vector<float> out((t->end - t->begin) / sizeof(float));
  std::memcpy(out.data(), bytes(*t), t->end - t->begin);
  return out;
}

// ---- writing ---------------------------------------------------------------------------------------

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const CheckpointMetadata& metadata) {
  // {"__metadata__":{...},"NAME":{"dtype":"F32","shape":[320,784],"data_offsets":[0,1003520]},...}: no whitespace,
  // members in this order, metadata by key, tensors as given.
  Json json = Json::object();
  if (!metadata.empty()) {
    Json& members = json["__metadata__"] = Json::object();
    for (const auto& [key, value] : metadata) members[key] = value;
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    NT_CHECK(t.name != "__metadata__" && names.insert(t.name).second, "tensor name '", t.name,
             "' is reserved or repeated");
    const size_t element = dtype_bytes(t.dtype);
    NT_CHECK(element != 0 && t.bytes.size() == static_cast<size_t>(Shape(t.shape).numel()) * element, "tensor '",
             t.name, "': ", t.bytes.size(), " bytes of ", t.dtype, " for shape ", shape_str(t.shape));
    const uint64_t bytes = t.bytes.size();
    json[t.name] =
        Json{{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", Json::array({offset, offset + bytes})}};
    offset += bytes;
  }
  std::string header;
  try {
    header = json.dump();
  } catch (const nlohmann::json::exception& e) {  // type_error 316: a name or a metadata string that is not UTF-8
    throw Error(cat("checkpoint ", quoted(path), ": cannot write the header: its names and metadata must be UTF-8 (",
                    json_error_text(e.what(), /*with_location=*/false), ")"));
  }
  header.append((8 - header.size() % 8) % 8, ' ');  // the data block starts 8-byte aligned

  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((uint64_t(header.size()) >> (8 * i)) & 0xFF);
  std::vector<std::string_view> parts{std::string_view(length, 8), header};
  for (const auto& t : tensors) parts.emplace_back(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
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
  return load_safetensors(SafetensorsFile::read(path), model, exec, state);
}

CheckpointMetadata load_safetensors(const SafetensorsFile& file, Model& model, const kernels::Exec& exec,
                                    const StateTensors& state) {
  const std::string& path = file.path();
  NT_CHECK(!model.params().params().empty(), "loading into a model without parameters (call init_params first)");
  if (model.params().dtype() != DType::f32)
    throw Error(cat("checkpoint ", quoted(path), ": checkpoints hold f32 parameters, this model's are ",
                    dtype_name(model.params().dtype())));
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
                    join_names(unexpected), " (model ", quoted(model.name()), " has ",
                    join_names(std::vector<std::string>(expected.begin(), expected.end())), ")"));

  for (const auto& [name, value] : targets)
    kernels::copy_host_to_device(exec, value.raw(), file.bytes(*file.find(name)), value.bytes());
  kernels::synchronize(exec);  // the copies read the file's bytes, which the caller may free when we return
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
  char preamble[10] = {'\x93',
                       'N',
                       'U',
                       'M',
                       'P',
                       'Y',
                       1,
                       0,
                       static_cast<char>(header.size() & 0xFF),
                       static_cast<char>(header.size() >> 8)};
  const std::string_view parts[] = {
      std::string_view(preamble, 10), header,
      std::string_view(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int32_t))};
  write_file_atomically(path, parts);
}

}  // namespace nt
