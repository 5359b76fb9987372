#include "apps/inference.h"

#include <algorithm>

#include "data/batcher.h"
#include "engine/optimizer.h"
#include "layers/softmax_xent.h"

namespace nt::app {

Inference run_inference(const Context& ctx, Model& model, const data::Dataset& examples, int batch,
                        const CommonOptions& common, bool want_logits) {
  // A Trainer evaluates; its optimizer is never stepped and its training source is the examples themselves (in
  // order), so nothing but the evaluation runs.
  data::DeviceBatcher source(ctx, examples, /*shuffle=*/false, 0);
  layers::SoftmaxCrossEntropy loss;
  Sgd unused(ctx.exec(), model.params(), {1.f, 0.f, 0.f});
  TrainOptions options;
  options.fuse_head = !common.no_fused_head;
  options.batch = static_cast<int>(std::min<int64_t>(batch, examples.count));
  options.use_graphs = !common.debug_sync;
  Trainer trainer(ctx, model, loss, unused, source, options);
  Inference out;
  out.result = want_logits ? trainer.evaluate(source, out.logits) : trainer.evaluate(source);
  return out;
}

}  // namespace nt::app
