#include "engine/trainer.h"

#include <chrono>

#include "profile/nvtx.h"
#include "profile/scope.h"

namespace nt {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// A profiler that cannot time the kernels of a replayed graph (CUDA events) gets eager launches
// (docs/profiler.md, "CUDA graphs").
bool replay_graphs(const Context& ctx, const TrainOptions& options) {
  const profile::LaunchObserver* observer = ctx.exec().observer;
  return ctx.on_cuda() && options.use_graphs && (observer == nullptr || observer->times_graph_replays());
}

// A graph is replayed under the observer that saw its capture (or none, unless its kernels stamp for that observer);
// another one needs a new capture.
bool stale(const kernels::Graph& graph, const kernels::Exec& exec) {
  const bool needs_its_observer = exec.observer != nullptr || graph.bound_to_observer();
  return graph.empty() || (needs_its_observer && graph.observed_by() != exec.observer);
}
}  // namespace

Trainer::Trainer(const Context& ctx, Model& model, Loss& loss, Optimizer& optimizer, BatchSource& train,
                 const TrainOptions& options)
    : ctx_(ctx), model_(model), loss_(loss), optimizer_(optimizer), train_(train), options_(options) {
  if (options.batch <= 0) throw Error(cat("--batch: must be positive, got ", options.batch));
  const int64_t global_batch = int64_t(options.batch) * (options.group ? options.group->world() : 1);
  if (train.examples() < global_batch)
    throw Error(cat("--batch: ", options.batch,
                    global_batch == options.batch ? "" : cat(" on each of ", options.group->world(), " ranks"),
                    " is larger than the training set (", train.examples(), " examples)"));
  try {  // all the memory of a model and batch size, planned once
    kernels::ProcessGroup* statistics =
        options.sync_batchnorm && options.group && options.group->world() > 1 ? options.group : nullptr;
    // Two input slots where the next batch is gathered ahead: a single GPU (the CPU has no side stream to hide it on),
    // and a first layer with work on its input alone (the fused stem's moments), whose time the side stream hides.
    const int input_slots = options.gather_ahead && ctx.on_cuda() && !options.group && model.prepares_input() ? 2 : 1;
    if (model.batch() != options.batch || model.batch_statistics() != statistics || model.input_slots() != input_slots)
      model.compile(ctx, options.batch, statistics, input_slots);
    ArenaPlan plan;
    for (int slot = 0; slot < input_slots; ++slot)
      plan.request(&labels_[size_t(slot)], Shape{options.batch}, DType::i32);
    plan.request(&train_totals_.loss_sum, Shape{1}, DType::f64);
    plan.request(&train_totals_.correct, Shape{1}, DType::i64);
    plan.request(&eval_totals_.loss_sum, Shape{1}, DType::f64);
    plan.request(&eval_totals_.correct, Shape{1}, DType::i64);
    arena_ = plan.commit(ctx.exec());
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(
        cat("--batch ", options.batch, ": the ", model.name(), " model's buffers do not fit in host memory"));
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(
        cat("--batch ", options.batch, ": the ", model.name(), " model's buffers do not fit: ", e.what()));
  }
  fused_head_ = options.fuse_head && loss.fuses(*model.layers().back());
  if (options.group)
    reduce_stream_ = kernels::SideStream(ctx.exec());
  else
    weight_stream_ = kernels::SideStream(ctx.exec());
  if (options.on_progress)
    progress_marks_ = kernels::StreamMarks(ctx.exec().backend,
                                           static_cast<int>(std::min<int64_t>(steps_per_epoch(), kProgressMarks)));
}

int64_t Trainer::steps_per_epoch() const { return train_.examples() / (int64_t(options_.batch) * world()); }

void Trainer::broadcast_from_rank0(bool parameters) {
  kernels::ProcessGroup* group = options_.group;
  if (!group || group->world() == 1) return;
  const auto& exec = ctx_.exec();
  ParamStore& store = model_.params();
  if (parameters) group->broadcast(exec, store.values().raw(), store.values().bytes());
  for (const Buffer& b : store.buffers()) group->broadcast(exec, b.value.raw(), b.value.bytes());
}

size_t Trainer::body_layers() const { return model_.layers().size() - (fused_head_ ? 1 : 0); }

void Trainer::enqueue_loss(int rows, bool train, const LossTotals& totals) {
  const auto& exec = ctx_.exec();
  const Tensor labels = labels_[size_t(model_.input_slot())].rows(rows);
  const Tensor dlogits = model_.output_grad().rows(rows);
  if (!fused_head_) return loss_.apply(exec, model_.output().rows(rows), labels, train ? &dlogits : nullptr, totals);
  const size_t last = model_.layers().size() - 1;
  profile::LayerScope scope(model_.layer_label(last));
  // No input gradient when the head is the first layer, as Model::backward.
  const bool wants_dx = train && last > 0 && model_.activation_grad(last).defined();
  const Tensor dx = wants_dx ? model_.activation_grad(last).rows(rows) : Tensor{};
  loss_.apply_fused(exec, *model_.layers()[last], model_.activation(last).rows(rows), model_.output().rows(rows),
                    labels, train ? &dlogits : nullptr, wants_dx ? &dx : nullptr, totals);
}

void Trainer::gather_step(const kernels::Exec& exec, int64_t step, int slot, bool beside_previous) {
  const int rows = options_.batch;
  const int64_t first = (step * world() + rank()) * rows;  // this rank's slice of the global batch
  train_.gather(exec, first, rows, model_.input(slot), labels_[size_t(slot)], beside_previous);
}

void Trainer::enqueue_train_step(int64_t step) {
  const auto& exec = ctx_.exec();
  const int rows = options_.batch;
  profile::StepScope step_scope("train_step");  // the phases label the profiler's table and NVTX ranges
  profile::PhaseScope phase("data");
  const bool gathered = ahead_step_ == step;  // during the step before, into the slot it did not use
  const int slot = gathered ? 1 - model_.input_slot() : 0;
  ahead_step_ = -1;
  // After the first step the kernel just before is the previous step's optimizer update, which touches no batch or
  // data: the gather runs beside it.
  if (!gathered) gather_step(exec, step, slot, step > 0);
  model_.use_input(slot, gathered);
  phase.next("forward");
  model_.forward(exec, rows, Mode::train, body_layers());
  phase.next("loss");
  // The next batch into the other slot, and the first layer's work on it, beside the rest of this step on the weight
  // gradients' side stream, which Model::backward joins before the update (a join of its own, before the next step's
  // first kernel, cost that kernel its early launch: the cnn gained nothing, the mlp lost 3.4 ms an epoch, which is
  // why a model without input-only work keeps one slot). From here rather than the step's start: the
  // classifier head next runs on a few blocks and leaves most SMs free, where at the start the moments' blocks took
  // SMs from the stem's pooled pass (the cnn at batch 64 on an H200: 3.1 ms an epoch saved against 1.7;
  // docs/batchnorm.md). In the step's stream under a profiler, as the weight gradients (weight_stream_).
  const bool ahead = model_.input_slots() > 1 && step + 1 < steps_per_epoch();
  if (ahead) {
    const kernels::Exec side = exec.observer ? exec : weight_stream_.beside(exec);
    if (!exec.observer) weight_stream_.fork();
    phase.next("data");
    gather_step(side, step + 1, 1 - slot, /*beside_previous=*/false);
    phase.next("forward");
    model_.prepare_input(side, rows, 1 - slot);
    phase.next("loss");
    ahead_step_ = step + 1;
  }
  enqueue_loss(rows, true, train_totals_);
  phase.next("backward");
  if (options_.group)
    enqueue_backward_and_all_reduce(rows);
  else
    model_.backward(exec, rows, body_layers(), {}, exec.observer ? nullptr : &weight_stream_);
  phase.next("update");
  optimizer_.step(exec);
}

void Trainer::enqueue_backward_and_all_reduce(int rows) {
  float* grads = model_.params().grads().f32();
  const size_t total = model_.params().total(), bucket = options_.bucket_bytes / sizeof(float);
  size_t pending_end = total;  // [from, pending_end) is final and not reduced yet
  // Reduces [from, pending_end) on the side stream once it is a bucket's worth.
  auto reduce_from = [&](size_t from) {
    if (from >= pending_end || pending_end - from < bucket) return;
    profile::PhaseScope phase("all-reduce");
    reduce_stream_.fork();
    options_.group->all_reduce_mean(reduce_stream_.exec(), grads + from, pending_end - from);
    pending_end = from;
  };
  if (fused_head_) reduce_from(model_.grads_offset(model_.layers().size() - 1));  // the loss wrote the head's
  model_.backward(ctx_.exec(), rows, body_layers(), [&](size_t layer) { reduce_from(model_.grads_offset(layer)); });
  profile::PhaseScope phase("all-reduce");
  // The rest after the backward pass, on the main stream; then the update waits for the side stream, if it was used.
  if (pending_end > 0) options_.group->all_reduce_mean(ctx_.exec(), grads, pending_end);
  if (pending_end < total) reduce_stream_.join();
}

void Trainer::enqueue_train_epoch(bool eager) {
  const auto& exec = ctx_.exec();
  kernels::fill_zero(exec, train_totals_.loss_sum.raw(), train_totals_.loss_sum.bytes());
  kernels::fill_zero(exec, train_totals_.correct.raw(), train_totals_.correct.bytes());
  const int64_t steps = steps_per_epoch();
  ahead_step_ = -1;  // an epoch's order is new: nothing gathered before it is its batch
  // Eagerly, the marks passed are told as the steps are enqueued; in a capture nothing runs until the launch.
  int recorded = 0, reported = 0;
  for (int64_t s = 0; s < steps; ++s) {
    enqueue_train_step(s);
    if (recorded < progress_marks_.size() && s + 1 == marked_step(recorded)) {
      progress_marks_.record(exec, recorded++);
      if (eager) reported = report_progress(reported, recorded, /*wait=*/false);
    }
  }
  if (eager) report_progress(reported, recorded, /*wait=*/true);
}

int64_t Trainer::marked_step(int mark) const {
  return steps_per_epoch() * (mark + 1) / progress_marks_.size();  // the last mark after the last step
}

int Trainer::report_progress(int next, int recorded, bool wait) const {
  for (; next < recorded; ++next) {
    if (wait)
      progress_marks_.wait(next);
    else if (!progress_marks_.passed(next))
      break;
    EpochProgress p{marked_step(next), steps_per_epoch(), 0.0};
    if (next > 0)
      p.ms_per_step = progress_marks_.ms_between(0, next) / static_cast<double>(p.steps_done - marked_step(0));
    options_.on_progress(p);
  }
  return next;
}

void Trainer::sum_over_ranks(const LossTotals& totals) const {
  if (!options_.group) return;
  options_.group->all_reduce_sum(ctx_.exec(), totals.loss_sum.data<double>(), 1);
  options_.group->all_reduce_sum(ctx_.exec(), totals.correct.data<int64_t>(), 1);
}

std::pair<double, int64_t> Trainer::read_totals(const LossTotals& totals) const {
  double loss_sum = 0;
  int64_t correct = 0;
  kernels::copy_device_to_host(ctx_.exec(), &loss_sum, totals.loss_sum.raw(), sizeof loss_sum);
  kernels::copy_device_to_host(ctx_.exec(), &correct, totals.correct.raw(), sizeof correct);
  kernels::synchronize(ctx_.exec());
  return {loss_sum, correct};
}

std::pair<double, double> Trainer::read_train_totals(int64_t steps) const {
  auto [loss_sum, correct] = read_totals(train_totals_);
  const auto examples = static_cast<double>(steps * options_.batch * world());
  return {loss_sum / examples, static_cast<double>(correct) / examples};
}

EpochMetrics Trainer::train_epoch(int epoch) {
  profile::NvtxRange range("train_epoch");
  const auto& exec = ctx_.exec();
  EpochMetrics m;
  m.epoch = epoch;
  const int64_t steps = steps_per_epoch();

  auto t0 = Clock::now();
  train_.begin_epoch(exec, epoch);
  if (options_.lr_factor) optimizer_.set_lr_factor(exec, static_cast<float>(options_.lr_factor(epoch)));
  if (replay_graphs(ctx_, options_)) {
    if (stale(train_graph_, exec)) {
      const auto c0 = Clock::now();
      train_graph_ = kernels::Graph::capture(exec, [&] { enqueue_train_epoch(/*eager=*/false); });
      m.capture_ms = ms_since(c0);
    }
    train_graph_.launch(exec);
    report_progress(0, progress_marks_.size(), /*wait=*/true);
  } else {
    enqueue_train_epoch(/*eager=*/true);
  }
  sum_over_ranks(train_totals_);  // once, at the epoch's end: the totals are zeroed before the next one
  std::tie(m.train_loss, m.train_acc) = read_train_totals(steps);
  m.epoch_ms = ms_since(t0);
  m.samples_per_s = static_cast<double>(steps * options_.batch * world()) / (m.epoch_ms / 1000.0);
  return m;
}

void Trainer::enqueue_eval(BatchSource& data, std::vector<float>* logits) {
  const auto& exec = ctx_.exec();
  kernels::fill_zero(exec, eval_totals_.loss_sum.raw(), eval_totals_.loss_sum.bytes());
  kernels::fill_zero(exec, eval_totals_.correct.raw(), eval_totals_.correct.bytes());
  const int batch = options_.batch;
  // Sharded over the ranks, unless the logits of every example are wanted here.
  const int shards = logits ? 1 : world(), shard = logits ? 0 : rank();
  const int64_t begin = data.examples() * shard / shards, end = data.examples() * (shard + 1) / shards;
  profile::PhaseScope phase("eval");
  ahead_step_ = -1;  // the evaluation gathers into slot 0, which may hold a batch gathered ahead
  model_.use_input(0, false);
  for (int64_t first = begin; first < end; first += batch) {
    profile::StepScope step_scope("eval_batch");
    const int rows = static_cast<int>(std::min<int64_t>(batch, end - first));
    data.gather(exec, first, rows, model_.input(), labels_[0], false);
    model_.forward(exec, rows, Mode::eval, body_layers());
    enqueue_loss(rows, false, eval_totals_);
    if (logits) {
      const Tensor out = model_.output().rows(rows);
      const auto classes = static_cast<size_t>(model_.output_shape().numel());
      kernels::copy_device_to_host(exec, logits->data() + static_cast<size_t>(first) * classes, out.raw(), out.bytes());
    }
  }
}

EvalResult Trainer::evaluate(BatchSource& data) { return evaluate_pass(data, nullptr); }

EvalResult Trainer::evaluate(BatchSource& data, std::vector<float>& logits) { return evaluate_pass(data, &logits); }

EvalResult Trainer::evaluate_pass(BatchSource& data, std::vector<float>* logits) {
  profile::NvtxRange range("evaluate");
  const auto& exec = ctx_.exec();
  EvalResult r;
  auto t0 = Clock::now();
  broadcast_from_rank0(/*parameters=*/false);  // every rank evaluates the model that rank 0 saves
  data.begin_epoch(exec, 0);
  if (logits) {  // eager: each batch's logits are copied back before the next batch overwrites them
    logits->assign(static_cast<size_t>(data.examples() * model_.output_shape().numel()), 0.f);
    enqueue_eval(data, logits);
  } else if (replay_graphs(ctx_, options_)) {
    if (stale(eval_graph_, exec) || eval_graph_source_ != &data) {
      const auto c0 = Clock::now();
      eval_graph_ = kernels::Graph::capture(exec, [&] { enqueue_eval(data); });
      eval_graph_source_ = &data;
      r.capture_ms = ms_since(c0);
    }
    eval_graph_.launch(exec);
  } else {
    enqueue_eval(data);
  }
  sum_over_ranks(eval_totals_);
  auto [loss_sum, correct] = read_totals(eval_totals_);  // synchronizes: every copy has landed
  r.ms = ms_since(t0);
  const auto n = static_cast<double>(data.examples());
  r.loss = loss_sum / n;
  r.accuracy = static_cast<double>(correct) / n;
  return r;
}

EpochMetrics Trainer::run_epoch(int epoch, BatchSource* test) {
  EpochMetrics m = train_epoch(epoch);
  if (test) {
    EvalResult e = evaluate(*test);
    m.test_loss = e.loss;
    m.test_acc = e.accuracy;
    m.eval_ms = e.ms;
    m.eval_capture_ms = e.capture_ms;
  }
  return m;
}

}  // namespace nt
