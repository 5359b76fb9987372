// A model run over a set of examples without training it: eval's test pass and predict's images, through the very
// code `train` evaluates with after each epoch (Trainer::evaluate), so that the numbers agree with training's.
#pragma once

#include <vector>

#include "apps/command.h"
#include "data/dataset.h"
#include "engine/trainer.h"

namespace nt::app {

struct Inference {
  EvalResult result;          // loss and accuracy against the examples' labels
  std::vector<float> logits;  // (examples, classes) row-major; empty unless asked for
};

// `examples` carries its normalization (mean, std) and labels; batch: at most this many examples at a time.
// With want_logits the pass runs eagerly and copies each batch's logits back; without, it replays as a graph.
Inference run_inference(const Context& ctx, Model& model, const data::Dataset& examples, int batch,
                        const CommonOptions& common, bool want_logits);

}  // namespace nt::app
