#!/usr/bin/env python3
"""The PyTorch baseline: the engine's model, trained the same way, in every mode a PyTorch user could pick.

Same as `nanotrain train`:
  model        the same nn.Sequential (mlp: Linear(784,320) ReLU Linear(320,160) ReLU Linear(160,10) on
               flattened inputs; cnn: Conv2d BatchNorm2d ReLU MaxPool2d x2, Flatten, Linear ReLU Linear on
               NCHW inputs), starting from the engine's initial weights and buffers (--init, from --init-out)
  data         the same normalized float32 inputs (bench/nt_io.py) in the same per-epoch order
               (bench/nt_order.py re-implements the engine's shuffle), full batches only (drop_last)
  optimizer    torch.optim.SGD, Adam or AdamW with the same hyper-parameters (PyTorch's semantics are the
               engine's: SGD with dampening 0, no Nesterov). On CUDA each runs as PyTorch's fastest kernel,
               fused=True (one multi-tensor kernel per step; capturable in graph mode); --optimizer-impl single
               picks the single-tensor loops instead (the same update, one kernel per operation and tensor),
               which the CPU always runs
  layout       NCHW, as the engine, in every mode but graph-nhwc
  precision    fp32 everywhere by default: TF32 is off for matmuls (torch.backends.cuda.matmul.allow_tf32 =
               False, float32 matmul precision 'highest') and for cuDNN convolutions (cudnn.allow_tf32 =
               False), so the convolutions are true fp32 as well. --tf32 (the engine's --tf32) turns it on for
               the convolutions only, PyTorch's own default; matmuls stay fp32 either way. --bf16 (the engine's
               --bf16, exclusive with --tf32) is PyTorch's mixed precision: the forward and the loss of every step,
               and evaluation, run under torch.autocast(dtype=torch.bfloat16) in every mode (in graph modes inside
               the captured region, so the graph is still the whole step). The convolutions and Linear layers then
               take bf16 operands and sum in fp32; the parameters, their gradients, the optimizer (fused as above),
               BatchNorm's statistics and the loss stay fp32, and TF32 stays off, with no fp32 product left for
               it. cuDNN picks its algorithms freely (benchmark mode off, non-deterministic algorithms allowed),
               which favours speed.
  timing       per epoch, wall clock from the start of the epoch (order upload included) to its end, with
               one synchronization per epoch (reading the epoch's loss and accuracy totals, accumulated on
               the device); evaluation after each epoch is timed separately. The summary is the median of
               epochs 2..N (epoch 1 carries warm-up: cuBLAS handles, graph capture, worker start-up).

Modes:
  dataloader   the usual tutorial loop: a TensorDataset over host tensors, a DataLoader with a sampler that
               yields the engine's order, num_workers=4 and pin_memory (on CUDA), .to(device) per batch.
               (Tutorials apply ToTensor/Normalize per sample; here the inputs are normalized once up front,
               which only makes this mode faster than the tutorial.)
  resident     the data set on the device, each batch gathered with index_select by the epoch's order
               (uploaded once per epoch), eager forward/backward/step.
  graph        resident data, and the whole step captured once as one CUDA graph: gather by a step counter
               on the device, forward, loss, backward, optimizer step, loss/accuracy totals, counter + 1.
               Each step is one graph replay: the fastest plain PyTorch can run this loop (CUDA only).
  graph-nhwc   the graph mode with the model in channels-last layout (torch.channels_last: the 4-d weights, and so
               the convolutions' activations, NHWC), the layout cuDNN's tensor-core kernels prefer: PyTorch's fastest
               for convolutions with TF32 or bf16 (CUDA only; models with convolutions only, skipped for the others).

Examples:
  python3 bench/pytorch_baseline.py --init init.safetensors --mode all --epochs 5 --json torch.json
  python3 bench/pytorch_baseline.py --eval-only model.safetensors        # test loss/accuracy of a checkpoint
"""
import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nt_io  # noqa: E402
import nt_order  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

MODES = ("dataloader", "resident", "graph", "graph-nhwc")
GRAPH_MODES = ("graph", "graph-nhwc")
NAMED_MODELS = {
    "mlp": "linear:320,relu,linear:160,relu,linear:10",
    "cnn": "conv:32:3,bn,relu,maxpool:2,conv:64:3,bn,relu,maxpool:2,flatten,linear:128,relu,linear:10",
    "cnn-cifar": "conv:64:3,bn,relu,maxpool:2,conv:128:3,bn,relu,maxpool:2,conv:256:3,bn,relu,maxpool:2,flatten,"
                 "linear:10",
}


def model_spec(name_or_spec):
    return NAMED_MODELS.get(name_or_spec, name_or_spec)


def has_convolutions(name_or_spec):
    return any(item.startswith("conv:") for item in model_spec(name_or_spec).split(","))


def flat_input(name_or_spec):
    """The engine flattens each sample when the model starts with linear (layers/builder.cpp)."""
    return model_spec(name_or_spec).split(",")[0].startswith("linear")


# ---- set-up ----------------------------------------------------------------------------------------

def set_precision(tf32_convolutions):
    """fp32 matmuls always; convolutions in fp32, or on TF32 tensor cores (PyTorch's default) when asked."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = tf32_convolutions
    torch.set_float32_matmul_precision("highest")


def autocast(device, bf16):
    """The forward's precision: fp32, or with --bf16 PyTorch's autocast to bf16, the engine's --bf16 (convolution and
    Linear operands bf16, fp32 sums; autocast keeps BatchNorm and the parameters fp32)."""
    if not bf16:
        return contextlib.nullcontext()
    # No cache of the weights' bf16 copies: each weight is read once a forward, so it would save nothing, and off
    # (as torch.cuda.make_graphed_callables has it) no cached tensor outlives the graph modes' captured step.
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=False)


def build_model(name_or_spec, sample_shape, classes):
    """nn.Sequential of the engine's spec (layers/builder.cpp): one module per spec item, so the
    parameter and buffer names match the engine's ("0.weight", "1.running_mean", ...). sample_shape is
    (C, H, W)."""
    items = model_spec(name_or_spec).split(",")
    shape = [int(np.prod(sample_shape))] if flat_input(name_or_spec) else list(sample_shape)
    modules = []
    for i, item in enumerate(items):
        fields = item.split(":")
        kind, args = fields[0], [int(f) for f in fields[1:]] if fields[0] != "dropout" else []
        following = items[i + 1] if i + 1 < len(items) else ""
        if kind == "linear" and len(fields) == 2:
            modules.append(nn.Linear(shape[0], args[0]))
            shape = [args[0]]
        elif kind == "conv" and 3 <= len(fields) <= 5:
            k, r = args[0], args[1]
            stride = args[2] if len(args) > 2 else 1
            pad = args[3] if len(args) > 3 else r // 2
            modules.append(nn.Conv2d(shape[0], k, r, stride=stride, padding=pad, bias=following != "bn"))
            shape = [k, (shape[1] + 2 * pad - r) // stride + 1, (shape[2] + 2 * pad - r) // stride + 1]
        elif item == "bn":
            modules.append(nn.BatchNorm2d(shape[0]) if len(shape) == 3 else nn.BatchNorm1d(shape[0]))
        elif kind == "maxpool" and len(fields) in (2, 3):
            w = args[0]
            stride = args[1] if len(args) > 1 else w
            modules.append(nn.MaxPool2d(w, stride))
            shape = [shape[0], (shape[1] - w) // stride + 1, (shape[2] - w) // stride + 1]
        elif item == "flatten":
            modules.append(nn.Flatten())
            shape = [int(np.prod(shape))]
        elif kind == "dropout" and len(fields) == 2:
            modules.append(nn.Dropout(float(fields[1])))
        elif item == "relu":
            modules.append(nn.ReLU())
        else:
            raise SystemExit(f"--model: '{item}' is not a layer of the engine's specs")
    if shape != [classes]:
        raise SystemExit(f"--model: ends in {shape}, the data has {classes} classes")
    return nn.Sequential(*modules)


def optimizer_impl(args, device):
    """fused on CUDA unless --optimizer-impl says single; the CPU has only the single-tensor loops here."""
    return "fused" if device.type == "cuda" and args.optimizer_impl == "fused" else "single"


def make_optimizer(model, args, device, capturable=False):
    """The engine's --optimizer with PyTorch's semantics, as optimizer_impl picks: fused (PyTorch's fastest on CUDA)
    or single-tensor."""
    params = model.parameters()
    impl = dict(fused=True) if optimizer_impl(args, device) == "fused" else dict(foreach=False)
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay, **impl)
    cls = torch.optim.Adam if args.optimizer == "adam" else torch.optim.AdamW
    # capturable keeps the step count on the device, which graph capture needs; the update is the same.
    return cls(params, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps, weight_decay=args.weight_decay,
               capturable=capturable, **impl)


def load_init(model, path):
    state, metadata, reader = nt_io.load_checkpoint(path)
    # strict: a missing or unexpected tensor, or a shape mismatch, is an error naming it.
    model.load_state_dict(state, strict=True)
    for name, t in state.items():
        want = torch.int64 if name.endswith("num_batches_tracked") else torch.float32
        if t.dtype != want:
            raise SystemExit(f"{path}: tensor '{name}' is {t.dtype}, expected {want}")
    return metadata, reader


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} threads)"
    except OSError:
        pass
    return platform.processor() or "cpu"


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Data:
    """Host and (lazily) device copies of the normalized data, and the engine's order per epoch."""

    def __init__(self, args, device):
        x_tr, y_tr, x_te, y_te = nt_io.load_dataset(args.data, args.dataset, args.train_limit)
        self.sample_shape = nt_io.sample_shape(args.dataset)
        # A conv model takes NCHW samples; the engine's NCHW input has the same bytes as the flat one.
        view = (-1, int(np.prod(self.sample_shape))) if flat_input(args.model) else (-1, *self.sample_shape)
        self.x_train, self.y_train = torch.from_numpy(x_tr).view(view), torch.from_numpy(y_tr)
        self.x_test, self.y_test = torch.from_numpy(x_te).view(view), torch.from_numpy(y_te)
        self.device = device
        self.seed = args.seed
        self.n = self.x_train.shape[0]
        self._dev = None
        # The orders are computed before any timing (pure Python Fisher-Yates takes ~0.1 s per epoch).
        self.orders = {e: np.asarray(nt_order.epoch_order(args.seed, e, self.n), dtype=np.int64)
                       for e in range(1, args.epochs + 1)}

    def on_device(self):
        if self._dev is None:
            self._dev = tuple(t.to(self.device) for t in (self.x_train, self.y_train, self.x_test, self.y_test))
        return self._dev


# ---- evaluation ------------------------------------------------------------------------------------

@torch.no_grad()
def evaluate(model, x_test, y_test, bf16=False, batch=1000):
    """(mean loss, accuracy) over the test set; x_test/y_test already on the model's device. bf16: under autocast, as
    the model trained."""
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=x_test.device)
    correct = torch.zeros((), dtype=torch.int64, device=x_test.device)
    for first in range(0, x_test.shape[0], batch):
        x, y = x_test[first:first + batch], y_test[first:first + batch]
        with autocast(x.device, bf16):
            out = model(x)
            loss_sum += F.cross_entropy(out.float(), y, reduction="sum").double()
        correct += (out.argmax(1) == y).sum()
    model.train()
    n = x_test.shape[0]
    return loss_sum.item() / n, correct.item() / n


# ---- the three training loops ----------------------------------------------------------------------
# Each epoch function runs the epoch's steps and leaves the totals (Σ loss over examples, correct) in
# `totals` on the device; the caller times it and reads the totals once.

class Totals:
    def __init__(self, device):
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.correct = torch.zeros((), dtype=torch.int64, device=device)

    def zero(self):
        self.loss_sum.zero_()
        self.correct.zero_()

    def add(self, out, y, loss):
        self.loss_sum.add_(loss.detach().double() * y.shape[0])
        self.correct.add_((out.detach().argmax(1) == y).sum())

    def read(self, examples):
        return self.loss_sum.item() / examples, self.correct.item() / examples


def train_step(model, opt, x, y, totals, bf16):
    opt.zero_grad(set_to_none=True)
    with autocast(x.device, bf16):
        out = model(x)
        # Autocast's logits are bf16; the loss is fp32, as the engine's head.
        loss = F.cross_entropy(out.float(), y)
    loss.backward()
    opt.step()
    totals.add(out, y, loss)


class OrderSampler(torch.utils.data.Sampler):
    """Yields the engine's order of the current epoch (set before each epoch)."""

    def __init__(self, n):
        self.n = n
        self.order = None

    def __iter__(self):
        return iter(self.order.tolist())

    def __len__(self):
        return self.n


class DataloaderLoop:
    def __init__(self, model, opt, data, args):
        self.model, self.opt, self.device, self.bf16 = model, opt, data.device, args.bf16
        self.sampler = OrderSampler(data.n)
        pin = data.device.type == "cuda"
        self.loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(data.x_train, data.y_train), batch_size=args.batch,
            sampler=self.sampler, drop_last=True, num_workers=args.workers, pin_memory=pin)
        self.non_blocking = pin

    def epoch(self, order, totals):
        self.sampler.order = order
        for x, y in self.loader:
            x = x.to(self.device, non_blocking=self.non_blocking)
            y = y.to(self.device, non_blocking=self.non_blocking)
            train_step(self.model, self.opt, x, y, totals, self.bf16)


class ResidentLoop:
    def __init__(self, model, opt, data, args):
        self.model, self.opt, self.device, self.batch, self.bf16 = model, opt, data.device, args.batch, args.bf16
        self.x, self.y = data.on_device()[:2]
        self.steps = data.n // args.batch

    def epoch(self, order, totals):
        perm = torch.from_numpy(order).to(self.device)   # one upload per epoch, as the engine
        b = self.batch
        for s in range(self.steps):
            idx = perm[s * b:(s + 1) * b]
            train_step(self.model, self.opt, self.x.index_select(0, idx), self.y.index_select(0, idx), totals,
                       self.bf16)


class GraphLoop:
    """One CUDA graph per step; the step reads its batch indices through a device-side step counter, so
    a replay needs no host work at all: per epoch, one copy of the order into a static buffer."""

    WARMUP_STEPS = 3

    def __init__(self, model, opt, data, args, totals):
        if data.device.type != "cuda":
            raise RuntimeError("graph mode needs CUDA")
        self.model, self.opt, self.device, self.batch, self.bf16 = model, opt, data.device, args.batch, args.bf16
        self.x, self.y = data.on_device()[:2]
        self.steps = data.n // args.batch
        self.order_steps = torch.zeros((self.steps, args.batch), dtype=torch.int64, device=self.device)
        self.counter = torch.zeros((1,), dtype=torch.int64, device=self.device)
        self.totals = totals
        self.order_steps.copy_(torch.arange(self.steps * args.batch, device=self.device).view(self.steps, -1))
        self._capture()

    def _step(self):
        idx = self.order_steps.index_select(0, self.counter).view(-1)   # (batch,) indices of this step
        x, y = self.x.index_select(0, idx), self.y.index_select(0, idx)
        # Autocast is entered here, inside the capture, so that its casts are kernels of the graph too.
        with autocast(self.device, self.bf16):
            out = self.model(x)
            loss = F.cross_entropy(out.float(), y)
        loss.backward()
        self.opt.step()
        self.totals.add(out, y, loss)
        self.counter.add_(1)

    def _capture(self):
        # Warm-up on a side stream (as torch.cuda.graphs documents): creates the gradients, cuBLAS
        # handles and optimizer state outside the capture. It changes the weights, so they are saved
        # before and restored after, and the momentum buffers zeroed (v = 0 gives v = g on the first
        # step, as PyTorch's first step does).
        saved = [t.detach().clone() for t in self.model.state_dict().values()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.WARMUP_STEPS):
                self.opt.zero_grad(set_to_none=True)
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        self.opt.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()
        torch.cuda.synchronize()
        with torch.no_grad():
            for t, s in zip(self.model.state_dict().values(), saved):   # parameters and BN buffers
                t.copy_(s)
            for state in self.opt.state.values():   # momentum buffers, Adam moments and step counts
                for value in state.values():
                    if torch.is_tensor(value):
                        value.zero_()
        self.counter.zero_()
        self.totals.zero()

    def epoch(self, order, totals):
        assert totals is self.totals
        self.order_steps.copy_(torch.from_numpy(order[:self.steps * self.batch]).view(self.steps, self.batch))
        self.counter.zero_()
        for _ in range(self.steps):
            self.graph.replay()


# ---- one run ---------------------------------------------------------------------------------------

def median_epoch_ms(epochs):
    times = [e["epoch_ms"] for e in epochs]
    return statistics.median(times[1:] if len(times) > 1 else times)


def run_mode(mode, args, data):
    device = data.device
    torch.manual_seed(args.seed)
    model = build_model(args.model, data.sample_shape, 10).to(device)
    init_reader = None
    if args.init:
        _, init_reader = load_init(model, args.init)
    if mode == "graph-nhwc":  # before the optimizer: it keeps the parameters it is given
        model = model.to(memory_format=torch.channels_last)
    opt = make_optimizer(model, args, device, capturable=mode in GRAPH_MODES)
    totals = Totals(device)
    if mode == "dataloader":
        loop = DataloaderLoop(model, opt, data, args)
    elif mode == "resident":
        loop = ResidentLoop(model, opt, data, args)
    else:
        loop = GraphLoop(model, opt, data, args, totals)
    x_test, y_test = data.on_device()[2:] if device.type == "cuda" else (data.x_test, data.y_test)
    steps = data.n // args.batch
    examples = steps * args.batch

    epochs = []
    for epoch in range(1, args.epochs + 1):
        order = data.orders[epoch]
        sync(device)
        t0 = time.perf_counter()
        totals.zero()
        loop.epoch(order, totals)
        train_loss, train_acc = totals.read(examples)   # the epoch's one synchronization
        epoch_ms = (time.perf_counter() - t0) * 1e3
        t1 = time.perf_counter()
        test_loss, test_acc = evaluate(model, x_test, y_test, args.bf16)
        eval_ms = (time.perf_counter() - t1) * 1e3
        m = dict(epoch=epoch, train_loss=train_loss, train_acc=train_acc, test_loss=test_loss, test_acc=test_acc,
                 epoch_ms=epoch_ms, eval_ms=eval_ms, samples_per_s=examples / (epoch_ms / 1e3))
        epochs.append(m)
        print(f"[{mode:>10}] epoch {epoch:3d} | train loss {train_loss:.4f} acc {100 * train_acc:6.2f}% | "
              f"test loss {test_loss:.4f} acc {100 * test_acc:6.2f}% | {epoch_ms:9.1f} ms | "
              f"{m['samples_per_s']:8.0f} samples/s", flush=True)
    return dict(framework="pytorch", mode=mode, median_epoch_ms=median_epoch_ms(epochs), epochs=epochs,
                steps_per_epoch=steps, init_reader=init_reader)


def settings(args, device):
    return dict(model=args.model, dataset=args.dataset, batch=args.batch, optimizer=args.optimizer,
                optimizer_impl=optimizer_impl(args, device), lr=args.lr,
                momentum=args.momentum, beta1=args.beta1, beta2=args.beta2, eps=args.eps,
                weight_decay=args.weight_decay, seed=args.seed, train_limit=args.train_limit,
                init=args.init, workers=args.workers, device=device.type, device_name=device_name(device),
                torch=torch.__version__, cuda=torch.version.cuda, threads=torch.get_num_threads(),
                tf32_matmul=torch.backends.cuda.matmul.allow_tf32, tf32_cudnn=torch.backends.cudnn.allow_tf32,
                autocast_dtype="bfloat16" if args.bf16 else None)


def write_json(path, payload):
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)


def eval_only(args, device):
    x_tr, y_tr, x_te, y_te = nt_io.load_dataset(args.data, args.dataset)
    model = build_model(args.model, (1, 28, 28), 10).to(device)
    metadata, reader = load_init(model, args.eval_only)
    view = (-1, 784) if flat_input(args.model) else (-1, 1, 28, 28)
    x_test, y_test = torch.from_numpy(x_te).view(view).to(device), torch.from_numpy(y_te).to(device)
    loss, acc = evaluate(model, x_test, y_test, args.bf16)
    correct = round(acc * x_test.shape[0])
    print(f"pytorch: {args.eval_only} (read with {reader}): test loss {loss:.6f} | test acc {100 * acc:.2f}% "
          f"({correct}/{x_test.shape[0]})")
    write_json(args.json, dict(checkpoint=args.eval_only, reader=reader, metadata=metadata, test_loss=loss,
                               test_acc=acc, correct=correct, examples=int(x_test.shape[0]),
                               settings=settings(args, device)))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp", help="mlp, cnn, or the engine's spec (conv:K:R,bn,relu,...)")
    ap.add_argument("--dataset", default="mnist", choices=["mnist", "fashion-mnist", "cifar10"])
    ap.add_argument("--data", help="folder of IDX files, raw or .gz (default: $NT_DATA_DIR, ./.data/<dataset>)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "adamw"])
    ap.add_argument("--optimizer-impl", default="fused", choices=["fused", "single"],
                    help="fused: PyTorch's one-kernel optimizers (CUDA; its fastest); single: the single-tensor "
                         "loops (the CPU always)")
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1, help="seed of the data order (the engine's --seed)")
    ap.add_argument("--train-limit", type=int, default=0, help="train on the first N examples only (0 = all)")
    ap.add_argument("--init", help="initial weights from `nanotrain train --init-out` (else PyTorch's own init)")
    ap.add_argument("--mode", action="append", help="dataloader, resident, graph or all (repeatable; default all)")
    ap.add_argument("--device", default=None, choices=["cuda", "cpu"], help="default: cuda when available")
    ap.add_argument("--workers", type=int, default=4, help="DataLoader workers in dataloader mode (tutorial: 4)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for PyTorch (0 = its default)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--eval-only", metavar="CHECKPOINT", help="only evaluate this safetensors model on the test set")
    ap.add_argument("--tf32", action="store_true",
                    help="convolutions on TF32 tensor cores (cudnn.allow_tf32, PyTorch's default); else fp32")
    ap.add_argument("--bf16", action="store_true",
                    help="mixed precision: forward and loss under torch.autocast to bfloat16 (the engine's --bf16)")
    args = ap.parse_args(argv)
    if args.tf32 and args.bf16:
        ap.error("--tf32 and --bf16 are exclusive, as in the engine: pick one precision")
    modes = []
    for m in args.mode or ["all"]:
        for part in m.split(","):
            if part == "all":
                modes += list(MODES)
            elif part in MODES:
                modes.append(part)
            else:
                ap.error(f"--mode: unknown mode '{part}' ({', '.join(MODES)}, all)")
    args.modes = list(dict.fromkeys(modes))
    if args.batch < 1 or args.epochs < 1 or args.lr <= 0:
        ap.error("--batch and --epochs must be >= 1 and --lr > 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: PyTorch sees no usable GPU")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    args.data = nt_io.find_data_dir(args.data, args.dataset)
    set_precision(args.tf32)
    if args.eval_only:
        return eval_only(args, device)
    if not args.init:
        print("warning: no --init: PyTorch's own initialization, not the engine's weights", file=sys.stderr)

    data = Data(args, device)
    if args.batch > data.n:
        raise SystemExit(f"--batch {args.batch} is larger than the training set ({data.n})")
    print(f"pytorch {torch.__version__} on {device_name(device)}: {args.model}, batch {args.batch}, "
          f"{args.epochs} epochs, {args.optimizer} ({optimizer_impl(args, device)}), lr {args.lr}, momentum {args.momentum}, "
          f"weight decay {args.weight_decay}, "
          f"seed {args.seed}, {data.n} train examples{', bf16 autocast' if args.bf16 else ''}", flush=True)
    runs = []
    for mode in args.modes:
        if mode in GRAPH_MODES and device.type != "cuda":
            print(f"[{mode:>10}] skipped: CUDA graphs need --device cuda", flush=True)
            continue
        if mode == "graph-nhwc" and not has_convolutions(args.model):
            print(f"[{mode:>10}] skipped: the model has no convolutions to lay out", flush=True)
            continue
        runs.append(run_mode(mode, args, data))
        print(f"[{mode:>10}] median epoch (epochs 2..N): {runs[-1]['median_epoch_ms']:.1f} ms", flush=True)
    write_json(args.json, dict(settings=settings(args, device), runs=runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
