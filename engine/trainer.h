// Trainer: epochs of seeded, shuffled mini-batches (drop_last), then evaluation.
//
// One training step, entirely enqueued on the execution stream:
//   gather -> forward -> loss (+ dlogits, totals) -> backward -> optimizer update
// On a single GPU (TrainOptions::gather_ahead), for a model whose first layer has work on its input alone
// (Model::prepare_input: the fused stem's patch moments), the gather of step s + 1 runs during step s instead, after
// its forward, on the weight gradients' side stream, into the other of the model's two input slots, followed by that
// work; step s + 1 then starts from its forward. The same kernels compute the same bits either way.
// When the loss absorbs the model's last layer (Loss::fuses: the classifier head), that layer's forward,
// the loss and that layer's backward are one op between the other layers' forward and backward passes.
// Loss and accuracy accumulate on the device and are read back once per epoch. On the GPU the
// whole epoch of steps (and the evaluation pass) is captured once as a CUDA graph and replayed,
// which removes per-kernel launch overhead; `use_graphs = false` enqueues the same steps eagerly.
//
// Data parallelism (TrainOptions::group of W ranks; docs/data-parallel.md): the global batch is W x batch. Every rank
// walks the single-process order of the epoch, global batch by global batch, and takes its slice: step s of rank r
// gathers examples [(s W + r) batch, (s W + r + 1) batch). After the backward pass the gradients are averaged over the
// ranks, then every rank applies the same update. The all-reduce may go in buckets that overlap the backward pass: once
// a layer's backward is enqueued, the gradients from it to the end of the block are final, and when at least
// bucket_bytes of them wait, a side stream reduces them while the main stream goes on with the earlier layers; what
// is left is reduced on the main stream after the backward pass, and the update waits for both. All of it is inside
// the step and so inside the epoch's graph. Each value is averaged on its own, so buckets change no bit on the CPU
// (MPI) or between two ranks. The default bucket, 25 MiB (PyTorch DDP's), holds each of the named models whole: one
// all-reduce after the backward pass, which measured fastest on two H100s (docs/data-parallel.md). BatchNorm statistics
// are each rank's own, as PyTorch's DDP does by default; before an evaluation every rank takes rank 0's running
// statistics (the model that rank 0 saves). Evaluation is sharded: rank r runs its W-th of the examples, and the totals
// are summed over the ranks.
#pragma once

#include <array>
#include <functional>

#include "engine/batch_source.h"
#include "engine/context.h"
#include "engine/loss.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "kernels/collective.h"

namespace nt {

// Where a training epoch is, as the device passed one of the marks recorded between its steps.
struct EpochProgress {
  int64_t steps_done = 0;
  int64_t steps = 0;       // in the epoch
  double ms_per_step = 0;  // since the epoch's first mark, on the device's clock; 0 at the first mark
};

struct TrainOptions {
  int batch = 64;
  bool use_graphs = true;
  bool fuse_head = true;  // let the loss absorb the model's last layer where it can (Loss::fuses)
  // Told a few times an epoch (kProgressMarks) as the device passes marks recorded between steps, in graph mode too
  // (kernels::StreamMarks): from the launching thread, in order, the last at the epoch's end. The host may learn of a
  // mark late (the first launch of a large graph blocks until much of it has run), so the pace is the device's.
  // Set or not, the steps compute the same bits.
  std::function<void(const EpochProgress&)> on_progress;
  // A learning-rate schedule: epoch (from 1) -> factor on the optimizer's lr, set before the epoch's
  // steps (the factor lives on the device, so a replayed graph follows it). Empty: constant.
  std::function<double(int epoch)> lr_factor;
  // The ranks of a data-parallel run (not owned); nullptr: this process alone. A group of one rank runs the same
  // collectives, which leave every value as it is.
  kernels::ProcessGroup* group = nullptr;
  size_t bucket_bytes = size_t{25} << 20;  // the smallest all-reduce that starts before the backward pass ends
  // A single GPU gathers (and prepares) each next batch beside the step before it where the model's first layer has
  // input-only work (above); off, every step gathers its own batch first. The same bits either way.
  bool gather_ahead = true;
  // Synchronized BatchNorm: with a group of world > 1, every BatchNorm's training statistics span all ranks' batches
  // (kernels/batchnorm.h); build the model with layers::BuildOptions::sync_batchnorm (no fused stem). Else each
  // rank's own batch, as PyTorch's DDP does by default.
  bool sync_batchnorm = false;
};

struct EvalResult {
  double loss = 0;      // mean over examples of the per-example loss
  double accuracy = 0;  // in [0, 1]
  double ms = 0;
  double capture_ms = 0;  // of ms: capturing and instantiating the pass's CUDA graph, when it was (re)captured
};

struct EpochMetrics {
  int epoch = 0;
  double train_loss = 0;  // mean per-example loss over the epoch's steps
  double train_acc = 0;
  double test_loss = 0;
  double test_acc = 0;
  double epoch_ms = 0;  // training steps only (evaluation excluded), wall clock to completion
  double eval_ms = 0;
  // Of epoch_ms and of eval_ms: capturing and instantiating the pass's CUDA graph (the first epoch, or after a
  // profiler came or went); 0 where the graphs were replayed as they were.
  double capture_ms = 0;
  double eval_capture_ms = 0;
  double samples_per_s = 0;
};

class Trainer {
 public:
  static constexpr int kProgressMarks = 50;  // per epoch, at most: a bar of 2% strides

  Trainer(const Context& ctx, Model& model, Loss& loss, Optimizer& optimizer, BatchSource& train,
          const TrainOptions& options);

  int64_t steps_per_epoch() const;  // full global batches only (drop_last)
  // Rank 0's weights (with `parameters`) and BatchNorm buffers on every rank: at the start of a data-parallel run
  // and before each evaluation. Nothing without a group.
  void broadcast_from_rank0(bool parameters);
  EpochMetrics train_epoch(int epoch);  // training only; test fields left 0
  EvalResult evaluate(BatchSource& data);
  // The same pass, eagerly, also copying each batch's logits to the host: (examples, classes) row-major, the very
  // values whose argmax the loss counts as correct (eval --confusion, predict). Synchronizes once per batch.
  EvalResult evaluate(BatchSource& data, std::vector<float>& logits);
  EpochMetrics run_epoch(int epoch, BatchSource* test);  // train_epoch then evaluate(test)

  // Enqueues step `step` of the current epoch: no allocation, no synchronization, no host copy. With gather_ahead it
  // also gathers step + 1's batch beside it, which the next call uses if it is step + 1 (else it gathers its own): the
  // work enqueued must run in the order it was enqueued (a step captured in a graph is launched before the next).
  void enqueue_train_step(int64_t step);
  // Reads the training totals accumulated so far this epoch (synchronizes): {mean loss, accuracy} over `steps` global
  // batches. In a data-parallel run they are every rank's once train_epoch has summed them, at the epoch's end.
  std::pair<double, double> read_train_totals(int64_t steps) const;

 private:
  // Eager: the steps run as enqueued (not captured), so progress is told from here.
  void enqueue_train_epoch(bool eager);
  int64_t marked_step(int mark) const;  // the steps done when progress mark `mark` is passed
  // Tells on_progress of the marks passed since mark `next` (waiting for them all with `wait`); returns the next.
  int report_progress(int next, int recorded, bool wait) const;
  // Both evaluate()s: replayed as a graph without `logits`, eagerly with them.
  EvalResult evaluate_pass(BatchSource& data, std::vector<float>* logits);
  // With `logits`, each batch's logits are copied to it after the batch (eager only).
  void enqueue_eval(BatchSource& data, std::vector<float>* logits = nullptr);
  // The totals become their sums over the ranks (an all-reduce where they are, on the device): once per pass.
  void sum_over_ranks(const LossTotals& totals) const;
  std::pair<double, int64_t> read_totals(const LossTotals& totals) const;  // synchronizes
  int world() const { return options_.group ? options_.group->world() : 1; }
  // The gradients' all-reduce, bucket by bucket as the backward pass makes them final (see above).
  void enqueue_backward_and_all_reduce(int rows);
  int rank() const { return options_.group ? options_.group->rank() : 0; }
  size_t body_layers() const;  // the layers that run outside the loss
  // The loss over the model's output for `rows` samples, with `dlogits` and the input gradients in training.
  void enqueue_loss(int rows, bool train, const LossTotals& totals);
  // Training step `step`'s batch into input slot `slot` (its images and labels_[slot]), on exec's stream.
  void gather_step(const kernels::Exec& exec, int64_t step, int slot, bool beside_previous);

  const Context& ctx_;
  Model& model_;
  Loss& loss_;
  Optimizer& optimizer_;
  BatchSource& train_;
  TrainOptions options_;
  bool fused_head_ = false;  // the loss runs the model's last layer (negotiated once, in the constructor)
  Arena arena_;
  std::array<Tensor, 2> labels_;  // per input slot of the model (one with a single slot)
  int64_t ahead_step_ = -1;       // the training step whose batch the other slot holds, gathered ahead; -1: none
  LossTotals train_totals_, eval_totals_;
  kernels::StreamMarks progress_marks_;  // none without on_progress
  kernels::SideStream reduce_stream_;    // a data-parallel step's all-reduce, beside the backward pass
  // A single GPU's weight gradients beside the rest of the backward (Model::backward), unless a profiler observes: a
  // replayed graph runs a side branch on streams of the driver's own, whose CUPTI records no longer tell which launch
  // they are (docs/profiler.md), so profiled steps keep them in the step's stream.
  kernels::SideStream weight_stream_;
  kernels::Graph train_graph_;
  kernels::Graph eval_graph_;
  BatchSource* eval_graph_source_ = nullptr;
};

}  // namespace nt
