// The model-spec parser (layers/builder.h, --model) on any text, for MNIST's and CIFAR-10's input shapes: a bad spec
// must end in nt::Error; anything else (an overflowed shape, a crash, a sanitizer report) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "layers/builder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  for (const nt::Shape& sample : {nt::Shape{1, 28, 28}, nt::Shape{3, 32, 32}}) {
    try {
      const auto model = nt::layers::build_model(spec, sample, 10);
      (void)model->summary();
    } catch (const nt::Error&) {
    }
  }
  return 0;
}
