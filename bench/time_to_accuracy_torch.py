#!/usr/bin/env python3
"""PyTorch's time to a test accuracy from a cold start, on the recipe `nanotrain train --target-acc` runs: the
same flags, the same model, each epoch followed by a test evaluation, stopping at the first that reaches the target.
bench/time_to_accuracy.py --torch runs it once per seed in a fresh process, as it runs the engine.

    python3 bench/time_to_accuracy_torch.py --model cnn --epochs 4 --optimizer adam --lr 2e-3 --batch 128 \\
        --lr-schedule cosine --shift 1 --seed 1 --target-acc 0.99 [--data DIR]

PyTorch at its fastest for this loop (CUDA): the data set resident on the device, the whole training step (batch
gather by a device-side step counter, random shift, forward, loss, backward, fused capturable Adam, totals) one CUDA
graph replayed once per step; evaluation in batches of 1,000 without a graph. Its own initial weights (PyTorch's
defaults) and its own data order (torch.randperm per epoch): the recipe is the engine's, the random streams are not.

What the flags mean, as in `nanotrain train`:
  --shift k           each training example translated by (dy, dx), each uniform in [-k, k], per step; pixels
                      shifted in from outside are black (0 before normalization)
  --lr-schedule cosine epoch e (from 1) trains at lr * (1 + cos(pi * (e - 1) / epochs)) / 2
  --lr-schedule one-cycle, warmup-cosine (--warmup w): per step; the step's rate is read inside the captured step
                      from a table indexed by a device-side step counter. one-cycle's table is what
                      torch.optim.lr_scheduler.OneCycleLR(max_lr=lr, total_steps=T, pct_start=w,
                      cycle_momentum=False) gives step by step; warmup-cosine's is kernels/lr_schedule.h's formula
  --optimizer         adam (Adam), adamw (AdamW) or sgd (SGD with --momentum), with --weight-decay

It prints the engine's line, so bench/time_to_accuracy.py parses both:
  reached A% test accuracy (target T%) after epoch N: S s from the process's start: start-up ., data load .,
  planning and capture ., training ., evaluation ., other .
where the process's start is the kernel's record of it (/proc/self/stat), start-up ends once torch is imported
and CUDA is initialized, and planning and capture covers the model, optimizer, warm-up steps and graph capture.
Exit status 4 when no epoch reaches the target, as the engine's.
"""
import os
import time


def process_age_s():
    """Seconds since this process started, by the kernel's clock (10 ms resolution)."""
    with open("/proc/self/stat") as f:
        started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - started_ticks / os.sysconf("SC_CLK_TCK")


AGE_AT_IMPORT = process_age_s()
CLOCK_AT_IMPORT = time.perf_counter()


def since_start():
    return AGE_AT_IMPORT + time.perf_counter() - CLOCK_AT_IMPORT


import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import nt_io  # noqa: E402
from pytorch_baseline import build_model, set_precision  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="cnn")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="adam")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--lr-schedule", choices=["constant", "cosine", "warmup-cosine", "one-cycle"], default="constant")
    p.add_argument("--warmup", type=float, help="per-step schedules' rising fraction (0.3 one-cycle, 0.1 warmup-cosine)")
    p.add_argument("--shift", type=int, default=0)
    p.add_argument("--tf32", action="store_true", help="TF32 convolutions (the engine's --tf32)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--target-acc", type=float, required=True)
    p.add_argument("--data", default=os.environ.get("NT_DATA_DIR", "data/mnist"))
    p.add_argument("--dataset", default="mnist")
    a = p.parse_args(argv)
    if not 0 < a.target_acc <= 1:
        p.error(f"--target-acc: must be in (0, 1], got {a.target_acc}")
    if a.epochs < 1 or a.batch < 1 or a.shift < 0:
        p.error("--epochs and --batch must be positive, --shift non-negative")
    return a


def step_rates(a, total_steps):
    """The learning rate of every step of the run under a per-step schedule (see above)."""
    warmup = a.warmup if a.warmup is not None else (0.3 if a.lr_schedule == "one-cycle" else 0.1)
    if a.lr_schedule == "one-cycle":
        dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=a.lr)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(dummy, max_lr=a.lr, total_steps=total_steps,
                                                        pct_start=warmup, cycle_momentum=False)
        rates = [scheduler.get_last_lr()[0]]
        for _ in range(total_steps - 1):
            dummy.step()
            scheduler.step()
            rates.append(scheduler.get_last_lr()[0])
        return rates
    warm = min(total_steps, max(1, round(warmup * total_steps)))
    return [a.lr * ((s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / (total_steps - warm))))
            for s in range(total_steps)]


def make_optimizer(model, a, device):
    # A tensor lr lets the schedule change it between replays of the captured step.
    lr = torch.tensor(a.lr, device=device)
    if a.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=a.momentum, weight_decay=a.weight_decay,
                               fused=True)
    cls = torch.optim.Adam if a.optimizer == "adam" else torch.optim.AdamW
    return cls(model.parameters(), lr=lr, weight_decay=a.weight_decay, fused=True, capturable=True)


class ShiftedBatches:
    """The step's batch from the resident set: indices by a device-side step counter, then each example shifted
    by (dy, dx) in [-k, k]^2 with black fill, chosen among the (2k + 1)^2 crops of the padded batch."""

    def __init__(self, x, y, batch, shift, black):
        self.x, self.y, self.batch, self.shift, self.black = x, y, batch, shift, black
        self.steps = x.shape[0] // batch
        self.order = torch.zeros((self.steps, batch), dtype=torch.int64, device=x.device)
        self.counter = torch.zeros((1,), dtype=torch.int64, device=x.device)
        self.rows = torch.arange(batch, device=x.device)

    def next(self):
        idx = self.order.index_select(0, self.counter).view(-1)
        x, y = self.x.index_select(0, idx), self.y.index_select(0, idx)
        self.counter.add_(1)
        k = self.shift
        if k == 0:
            return x, y
        h, w = x.shape[2], x.shape[3]
        padded = F.pad(x, (k, k, k, k), value=self.black)
        crops = torch.stack([padded[:, :, k + dy:k + dy + h, k + dx:k + dx + w]
                             for dy in range(-k, k + 1) for dx in range(-k, k + 1)])
        choice = torch.randint(0, (2 * k + 1) ** 2, (self.batch,), device=x.device)
        return crops[choice, self.rows], y


@torch.no_grad()
def test_accuracy(model, x, y, batch=1000):
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    for first in range(0, x.shape[0], batch):
        correct += (model(x[first:first + batch]).argmax(1) == y[first:first + batch]).sum()
    model.train()
    return correct.item() / x.shape[0]


def main(argv=None):
    a = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("time_to_accuracy_torch: needs a CUDA GPU (PyTorch sees none)")
    device = torch.device("cuda")
    torch.cuda.init()
    torch.zeros(1, device=device)  # the context
    set_precision(a.tf32)
    torch.manual_seed(a.seed)
    t_startup = since_start()

    images, labels, test_images, test_labels = nt_io.load_split(a.data, a.dataset)
    mean, std = nt_io.normalization(a.dataset, images)
    if a.shift and len(mean) != 1:
        sys.exit("time_to_accuracy_torch: --shift: one channel only here (black is one value)")
    black = float(nt_io.normalize(np.zeros((1, 1, 1, 1), np.uint8), mean, std)[0, 0])
    x_tr, x_te = nt_io.normalize(images, mean, std), nt_io.normalize(test_images, mean, std)
    y_tr, y_te = labels.astype(np.int64), test_labels.astype(np.int64)
    shape = nt_io.sample_shape(a.dataset)
    x_train = torch.from_numpy(x_tr).view(-1, *shape).to(device)
    y_train = torch.from_numpy(y_tr).to(device)
    x_test = torch.from_numpy(x_te).view(-1, *shape).to(device)
    y_test = torch.from_numpy(y_te).to(device)
    torch.cuda.synchronize()
    t_data = since_start()

    model = build_model(a.model, shape, 10).to(device)
    opt = make_optimizer(model, a, device)
    batches = ShiftedBatches(x_train, y_train, a.batch, a.shift, black)
    per_step = a.lr_schedule in ("one-cycle", "warmup-cosine")
    if per_step:
        rates = torch.tensor(step_rates(a, a.epochs * batches.steps), dtype=torch.float32, device=device)
        run_step = torch.zeros((1,), dtype=torch.int64, device=device)

    def step():
        if per_step:  # the step's rate, then the count on: both inside the captured graph
            opt.param_groups[0]["lr"].copy_(rates.index_select(0, run_step).view(()))
            run_step.add_(1)
        x, y = batches.next()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    # Warm-up on a side stream before capture (torch.cuda.graphs), then the weights, buffers and optimizer state
    # restored, so the captured run starts from the initial model.
    saved = [t.detach().clone() for t in model.state_dict().values()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    opt.zero_grad(set_to_none=True)  # backward inside the graph writes fresh gradients on every replay
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    with torch.no_grad():
        for t, s in zip(model.state_dict().values(), saved):
            t.copy_(s)
        for state in opt.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    value.zero_()
        if per_step:
            run_step.zero_()
    torch.cuda.synchronize()
    t_plan = since_start()

    training = evaluation = 0.0
    best = 0.0
    for epoch in range(1, a.epochs + 1):
        t0 = since_start()
        if not per_step:
            factor = 0.5 * (1 + math.cos(math.pi * (epoch - 1) / a.epochs)) if a.lr_schedule == "cosine" else 1.0
            opt.param_groups[0]["lr"].fill_(a.lr * factor)
        perm = torch.randperm(x_train.shape[0], device=device)[:batches.steps * a.batch]
        batches.order.copy_(perm.view(batches.steps, a.batch))
        batches.counter.zero_()
        for _ in range(batches.steps):
            graph.replay()
        torch.cuda.synchronize()
        t1 = since_start()
        accuracy = test_accuracy(model, x_test, y_test)
        t2 = since_start()
        training += t1 - t0
        evaluation += t2 - t1
        best = max(best, accuracy)
        print(f"epoch {epoch}: test accuracy {100 * accuracy:.2f}%, {1000 * (t1 - t0):.1f} ms training", flush=True)
        if accuracy >= a.target_acc:
            total = since_start()
            other = total - t_startup - (t_data - t_startup) - (t_plan - t_data) - training - evaluation
            print(f"reached {100 * accuracy:.2f}% test accuracy (target {100 * a.target_acc:.2f}%) after epoch "
                  f"{epoch}: {total:.3f} s from the process's start: start-up {t_startup:.3f}, data load "
                  f"{t_data - t_startup:.3f}, planning and capture {t_plan - t_data:.3f}, training {training:.3f}, "
                  f"evaluation {evaluation:.3f}, other {other:.3f}")
            return 0
    print(f"target {100 * a.target_acc:.2f}% not reached in {a.epochs} epochs (best {100 * best:.2f}%)")
    return 4


if __name__ == "__main__":
    sys.exit(main())
