// Divergence, found after the fact. A training epoch already reads its loss total back once (Trainer); a row
// loss that is NaN or infinite makes that double sum non-finite, so the check costs nothing inside a step. Only
// when an epoch's loss is not finite does the engine look for where: the first tensor of the model, in layer
// order, whose values are not all finite (parameters, then their gradients, then buffers), counted on the device
// (kernels/nonfinite.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/context.h"
#include "engine/model.h"

namespace nt {

struct NonfiniteTensor {
  std::string name;              // "0.weight", "0.weight (gradient)", "1.running_var"
  int64_t count = 0;             // non-finite values
  int64_t size = 0;              // values in the tensor
  std::string describe() const;  // "0.weight: 12 of 250880 values are NaN or infinite"
};

// The first tensor holding a NaN or an infinity, or none. Synchronizes (one read-back per tensor): for use
// between epochs and on loaded checkpoints, never in a step.
std::optional<NonfiniteTensor> first_nonfinite_tensor(const Context& ctx, const Model& model);

}  // namespace nt
