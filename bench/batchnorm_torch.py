#!/usr/bin/env python3
"""PyTorch's BatchNorm2d (cuDNN) next to nanotrain's BatchNorm kernels, and PyTorch reference cases.

(1) Timing. torch.nn.BatchNorm2d in fp32 on the GPU, timed as bench/bench_batchnorm.cu times nanotrain:
    the median of 60 repetitions of an event-timed loop of back-to-back calls (10 for the 102.8 MB shape,
    100 for the cnn's small shapes) after warm-up, divided by the calls. NHWC is channels_last memory.
      train     bn.train(), forward under no_grad (batch statistics, running statistics updated)
      eval      bn.eval(), forward under no_grad
      backward  torch.autograd.grad of one recorded training forward w.r.t. x, weight and bias
                (retain_graph), i.e. cuDNN's batch-norm backward
      +relu     the same followed by torch.relu (PyTorch runs it as a separate kernel)
    With --nanotrain CSV (bench_batchnorm's batchnorm.csv) the two are joined into one table:
      layout | shape | pass | nanotrain ms | floor ms | % of floor | PyTorch ms

(2) --references DIR writes reference cases computed by PyTorch on the GPU (fp32 BatchNorm2d training
    forward, backward, updated running statistics, and the eval forward with the updated statistics) for
    N,C,H,W = 64,128,56,56 and 3,5,7,7 (the latter also with a ReLU after the batch norm). Read by
    tests/cuda/test_batchnorm_cuda.cpp when NT_BN_REFERENCES names DIR. One file per case,
    bn_<N>x<C>x<H>x<W>[_relu].bin, little-endian:
      8 bytes   magic b"NTBNREF1"
      int64     N, C, H, W
      float64   eps, momentum
      int64     relu (0 or 1: y = relu(bn(x)) and dx through the ReLU)
      float32   x (N,C,H,W), gamma (C), beta (C), running_mean_in (C), running_var_in (C), dy (N,C,H,W),
                y (N,C,H,W), dx (N,C,H,W), dgamma (C), dbeta (C), running_mean_out (C), running_var_out (C),
                y_eval (N,C,H,W)
    4-D arrays are in NCHW order (the test transposes them for its NHWC run).

Examples:
  build/bench/bench_batchnorm results/                 # writes results/batchnorm.csv
  python3 bench/batchnorm_torch.py --nanotrain results/batchnorm.csv --out results/
  python3 bench/batchnorm_torch.py --references /tmp/bnref --no-timing
  NT_BN_REFERENCES=/tmp/bnref build/tests/nt_tests_cuda "[batchnorm]"
"""
import argparse
import csv
import os
import statistics
import struct
import sys

import torch

SHAPES = [(64, 128, 56, 56), (64, 32, 28, 28), (64, 64, 14, 14)]
REPS = 60
FLOOR_BYTES_PER_SECOND = 3.0e12  # the H100 anchor, used when no bench_batchnorm table is given
TENSOR_PASSES = {"train": 3, "eval": 2, "backward": 5, "train+relu": 3, "backward+relu": 7}


def time_loop(calls, fn):
    """Median ms per call of `calls` back-to-back calls, timed with CUDA events."""
    for _ in range(max(5, calls)):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPS):
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / calls)
    return statistics.median(times)


def time_torch(shape, layout):
    """{pass: ms} for one shape and layout."""
    n, c, h, w = shape
    gen = torch.Generator(device="cuda").manual_seed(1)
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    x = (torch.rand(n, c, h, w, device="cuda", generator=gen) * 5 - 2).to(memory_format=fmt)
    dy = (torch.rand(n, c, h, w, device="cuda", generator=gen) * 2 - 1).to(memory_format=fmt)
    bn = torch.nn.BatchNorm2d(c).cuda().to(memory_format=fmt)
    large = x.numel() * 4 > 50e6
    calls = 10 if large else 100
    results = {}

    def forward(relu, train):
        bn.train(train)
        with torch.no_grad():
            y = bn(x)
            return torch.relu(y) if relu else y

    def make_backward(relu):
        bn.train()
        xg = x.detach().requires_grad_(True)
        y = bn(xg)
        if relu:
            y = torch.relu(y)
        params = [xg, bn.weight, bn.bias]
        return lambda: torch.autograd.grad(y, params, dy, retain_graph=True)

    results["train"] = time_loop(calls, lambda: forward(False, True))
    results["eval"] = time_loop(calls, lambda: forward(False, False))
    results["backward"] = time_loop(calls, make_backward(False))
    if large:
        results["train+relu"] = time_loop(calls, lambda: forward(True, True))
        results["backward+relu"] = time_loop(calls, make_backward(True))
    return results


def write_reference(folder, shape, relu, seed):
    n, c, h, w = shape
    eps, momentum = 1e-5, 0.1
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*size):
        return torch.randn(*size, device="cuda", generator=gen)

    x = randn(n, c, h, w) * 2 + 0.5
    gamma = torch.rand(c, device="cuda", generator=gen) + 0.5
    beta = randn(c) * 0.5
    rm_in = randn(c) * 0.1
    rv_in = torch.rand(c, device="cuda", generator=gen) + 0.5
    dy = randn(n, c, h, w)

    bn = torch.nn.BatchNorm2d(c, eps=eps, momentum=momentum).cuda()
    with torch.no_grad():
        bn.weight.copy_(gamma)
        bn.bias.copy_(beta)
        bn.running_mean.copy_(rm_in)
        bn.running_var.copy_(rv_in)
    bn.train()
    xg = x.clone().requires_grad_(True)
    y = bn(xg)
    if relu:
        y = torch.relu(y)
    y.backward(dy)
    bn.eval()
    with torch.no_grad():
        y_eval = bn(x)
        if relu:
            y_eval = torch.relu(y_eval)

    arrays = [x, gamma, beta, rm_in, rv_in, dy, y, xg.grad, bn.weight.grad, bn.bias.grad, bn.running_mean,
              bn.running_var, y_eval]
    name = f"bn_{n}x{c}x{h}x{w}{'_relu' if relu else ''}.bin"
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(struct.pack("<8sqqqqddq", b"NTBNREF1", n, c, h, w, eps, momentum, int(relu)))
        for a in arrays:
            f.write(a.detach().float().contiguous().cpu().numpy().astype("<f4").tobytes())
    print(f"wrote {path}")


def read_nanotrain(path):
    """{(layout, n, c, h, w, pass): row} from bench_batchnorm's batchnorm.csv."""
    rows = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            key = (r["layout"], int(r["n"]), int(r["c"]), int(r["h"]), int(r["w"]), r["pass"])
            rows[key] = r
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nanotrain", help="bench_batchnorm's batchnorm.csv, joined into the table")
    ap.add_argument("--out", help="folder for batchnorm_torch.csv")
    ap.add_argument("--references", help="write the PyTorch reference cases into this folder")
    ap.add_argument("--no-timing", action="store_true", help="only write the references")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("batchnorm_torch.py needs a CUDA GPU")
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")

    if args.references:
        os.makedirs(args.references, exist_ok=True)
        write_reference(args.references, (64, 128, 56, 56), False, 1)
        write_reference(args.references, (3, 5, 7, 7), False, 2)
        write_reference(args.references, (3, 5, 7, 7), True, 3)
    if args.no_timing:
        return

    ours = read_nanotrain(args.nanotrain) if args.nanotrain else {}
    lines = ["layout,n,c,h,w,pass,torch_ms"]
    header = f"{'layout':6} | {'shape':14} | {'pass':13} | {'nanotrain ms':>12} | {'floor ms':>9} | " \
             f"{'% of floor':>10} | {'PyTorch ms':>10}"
    print("\n" + header + "\n" + "-" * len(header))
    for shape in SHAPES:
        n, c, h, w = shape
        tensor_bytes = n * c * h * w * 4
        for layout in ("nchw", "nhwc"):
            torch_ms = time_torch(shape, layout)
            for name, t in torch_ms.items():
                row = ours.get((layout, n, c, h, w, name))
                # The engine's bench measured its floor on this GPU (a device-to-device copy); without its
                # table, the H100 anchor.
                floor_ms = float(row["floor_ms"]) if row and "floor_ms" in row else \
                    TENSOR_PASSES[name] * tensor_bytes / FLOOR_BYTES_PER_SECOND * 1e3
                if row:
                    ms = float(row["ms"])
                    ours_text = f"{ms:12.4f} | {floor_ms:9.4f} | {100 * floor_ms / ms:9.0f}%"
                else:
                    ours_text = f"{'-':>12} | {floor_ms:9.4f} | {'-':>10}"
                print(f"{layout:6} | {f'{n}x{c}x{h}x{w}':14} | {name:13} | {ours_text} | {t:10.4f}")
                lines.append(f"{layout},{n},{c},{h},{w},{name},{t}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "batchnorm_torch.csv")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
