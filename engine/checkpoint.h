// Files exchanged with PyTorch: safetensors checkpoints and .npy arrays.
//
// safetensors (https://github.com/huggingface/safetensors), the layout PyTorch's tools read:
//   bytes 0..7   N, the header length, unsigned 64-bit little-endian
//   bytes 8..8+N a JSON object, padded with spaces to a multiple of 8 bytes:
//                {"__metadata__": {"key": "value", ...},
//                 "0.weight": {"dtype": "F32", "shape": [320, 784], "data_offsets": [begin, end]}, ...}
//   the rest     the data block; each tensor's bytes are [begin, end) of it, row-major, little-endian,
//                and the tensors tile the block exactly (no gap, no overlap, nothing after the last).
// A model's tensors carry the names and shapes of the equivalent PyTorch nn.Sequential ("0.weight" is
// (out, in)), so `model.load_state_dict(safetensors.torch.load_file(path))` works on the other side.
//
// Reading validates the whole container before anything is used, and loading into a model validates
// every name, dtype and shape before any value is copied: a failed load leaves the model as it was.
// Every failure is an nt::Error naming the file and, where there is one, the tensor.
// Writing is atomic (core/atomic_file.h): the bytes go to a temporary file of their own in the same folder, are
// flushed to disk (fsync), and the file is renamed over PATH, so an interrupted save never destroys the previous
// checkpoint, and two runs saving to one path leave one of their files whole.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/params.h"

namespace nt {

// "__metadata__": free-form string pairs (producer, model name, seed, ...).
using CheckpointMetadata = std::map<std::string, std::string>;

// A training run's state beside the model's tensors (optimizer moments, dropout counters), by name in the file:
// Optimizer::state and Model::run_state. Resumable checkpoints (train --checkpoint-dir) hold it; names start with
// "optimizer." or "train_state.", which loading a model alone skips, so such a file evaluates like any other.
using StateTensors = std::vector<std::pair<std::string, Tensor>>;
bool is_run_state(const std::string& tensor_name);

// ---- whole models ----------------------------------------------------------------------------------
// Every parameter (F32) and every buffer (BatchNorm's running statistics F32, num_batches_tracked I64),
// in the model's order. The values are read back from the device (this synchronizes).
void save_safetensors(const std::string& path, const Model& model, const kernels::Exec& exec,
                      CheckpointMetadata metadata = {});
void save_safetensors(const std::string& path, const ParamStore& params, const kernels::Exec& exec,
                      CheckpointMetadata metadata = {});

// Replaces every parameter and buffer of `model` (which must have its parameters, i.e. init_params()
// was called) with the file's values. The file must hold exactly the model's tensors: a missing tensor,
// an unexpected one, another dtype (F32; I64 for counters) or another shape is an error naming the tensor.
// Tensors of a run's state in the file (is_run_state) are skipped, unless `state` asks for them: then each of
// those must be there too, with its dtype and shape, and nothing else may be. Returns the file's metadata.
CheckpointMetadata load_safetensors(const std::string& path, Model& model, const kernels::Exec& exec,
                                    const StateTensors& state = {});

// ---- the container, for tools and tests ------------------------------------------------------------
struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // as written: "F32", "F64", "I64", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data block
};

class SafetensorsFile {
 public:
  // Reads and validates the container (sizes, JSON, dtypes, offsets); throws nt::Error naming `path`.
  static SafetensorsFile read(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // in header order
  const CheckpointMetadata& metadata() const { return metadata_; }
  const SafetensorsTensor* find(const std::string& name) const;  // nullptr when absent
  // The values of an F32 tensor; throws nt::Error naming the tensor when it is absent or not F32.
  std::vector<float> floats(const std::string& name) const;
  const uint8_t* bytes(const SafetensorsTensor& t) const { return data_.data() + t.begin; }

 private:
  std::string path_;
  std::vector<SafetensorsTensor> tensors_;
  CheckpointMetadata metadata_;
  std::vector<uint8_t> data_;  // the data block
};

// load_safetensors from a file read already (train --resume reads its metadata first: one read, one file).
CheckpointMetadata load_safetensors(const SafetensorsFile& file, Model& model, const kernels::Exec& exec,
                                    const StateTensors& state = {});

// A host tensor to write: F32 parameters and running statistics, I64 counters.
struct NamedTensor {
  std::string name;
  std::string dtype;  // "F32" or "I64"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // row-major, little-endian, shape's element count times the dtype's size
};
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const CheckpointMetadata& metadata);

// What save_safetensors writes (with `state` after the model's tensors), read back to the host now and written
// later: the last good weights of a run (train --save-on-divergence), a resumable checkpoint. Taking one
// synchronizes: between epochs only, never in a step.
struct CheckpointImage {
  std::vector<NamedTensor> tensors;
  CheckpointMetadata metadata;
};
CheckpointImage checkpoint_image(const Model& model, const kernels::Exec& exec, CheckpointMetadata metadata = {},
                                 const StateTensors& state = {});
CheckpointImage checkpoint_image(const ParamStore& params, const kernels::Exec& exec, CheckpointMetadata metadata = {});
void write_checkpoint(const std::string& path, const CheckpointImage& image);

// ---- .npy ------------------------------------------------------------------------------------------
// A NumPy .npy file (format 1.0, '<i4', C order) of `shape`, written atomically like a checkpoint;
// numpy.load() reads it. Used for the per-epoch data order that the PyTorch baseline cross-checks.
void write_npy_i32(const std::string& path, const std::vector<int32_t>& values, const std::vector<int64_t>& shape);

}  // namespace nt
