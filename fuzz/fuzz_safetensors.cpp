// The safetensors reader (engine/checkpoint.h) on any bytes: the container is read and validated, every tensor's
// values are taken, and the file is loaded into a small model on the CPU, whose names, dtypes and shapes it must
// match. A bad file must end in nt::Error; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/error.h"
#include "engine/checkpoint.h"
#include "engine/context.h"
#include "layers/builder.h"
#include "memory_file.h"

namespace {

// The model of the seed corpus (scripts/fuzz-seeds): a BatchNorm between two Linears holds every kind of tensor a
// checkpoint has (weights, biases, running statistics, an I64 counter).
struct Target {
  nt::Context ctx{nt::ContextOptions{.device = "cpu", .threads = 1}};
  std::unique_ptr<nt::Model> model = nt::layers::build_model("linear:2,bn,relu,linear:10", nt::Shape{1, 28, 28}, 10);
  Target() { model->init_params(ctx, 1); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static nt::fuzz::MemoryFile file;
  static Target target;
  const std::string& path = file.hold(data, size);
  try {
    const auto checkpoint = nt::SafetensorsFile::read(path);
    for (const auto& t : checkpoint.tensors())
      if (t.dtype == "F32") (void)checkpoint.floats(t.name);
    nt::load_safetensors(path, *target.model, target.ctx.exec());
  } catch (const nt::Error&) {
  }
  return 0;
}
