#!/usr/bin/env python3
"""PyTorch's (cuDNN) conv2d passes at the cnn's shapes, timed like bench_conv, and the joined table.

  bench_conv OUT_DIR                         writes OUT_DIR/conv.csv (nanotrain)
  python3 bench/conv_torch.py OUT_DIR        writes OUT_DIR/conv_torch.csv and prints
                                             shape | pass | math | nanotrain us | cuDNN us | ratio
                                             (joined with OUT_DIR/conv.csv when it is there)

Shapes and passes as bench/bench_conv.cu: conv1 x(N,1,28,28) w(32,1,3,3) pad 1, conv2 x(N,32,14,14)
w(64,32,3,3) pad 1, N = 64 and 256, no bias; forward F.conv2d, backward_data torch.nn.grad.conv2d_input,
backward_weight torch.nn.grad.conv2d_weight.
Precision: each pass twice, as bench_conv: math fp32 with torch.backends.cudnn.allow_tf32 = False (true fp32),
and math tf32 with it True (PyTorch's default for convolutions: TF32 tensor cores, as nanotrain's Exec::tf32);
matmul TF32 stays off either way.
cuDNN picks its algorithms with benchmark mode on and non-deterministic algorithms allowed (its fastest;
--deterministic restricts it to deterministic ones, as nanotrain's kernels are).
Timing (the same method as bench_conv): inputs uniform in [-1, 1]; the median of 50 repetitions of an
event-timed loop of 100 back-to-back calls after warm-up, divided by 100 ("us"), and the same for a CUDA graph
holding 100 calls ("us graph": no Python or launch overhead). The joined table compares graph timings (the
kernels' own cost, what a captured training step pays) and shows the eager ones beside them.
"""
import argparse
import csv
import os
import statistics
import sys

import torch
import torch.nn.functional as F

REPS = 50
CALLS = 100

CASES = [
    ("conv1 b64", 64, 1, 28, 32),
    ("conv2 b64", 64, 32, 14, 64),
    ("conv1 b256", 256, 1, 28, 32),
    ("conv2 b256", 256, 32, 14, 64),
]


def time_loop(call, calls):
    """Median microseconds per call of `calls` back-to-back calls, events around the loop."""
    for _ in range(max(3, calls)):
        call()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPS):
        start.record()
        for _ in range(calls):
            call()
        stop.record()
        stop.synchronize()
        times.append(1e3 * start.elapsed_time(stop) / calls)
    return statistics.median(times)


def time_graph(call):
    """Median microseconds per call from a CUDA graph of CALLS calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (cuDNN benchmark, workspace) outside the capture
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            call()
    graph.replay()
    return time_loop(graph.replay, 1) / CALLS


def measure(deterministic, tf32):
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = deterministic
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(7)
    rows = []
    for name, n, c, hw, k in CASES:
        x = torch.rand(n, c, hw, hw, device=dev, generator=gen) * 2 - 1
        w = torch.rand(k, c, 3, 3, device=dev, generator=gen) * 2 - 1
        dy = torch.rand(n, k, hw, hw, device=dev, generator=gen) * 2 - 1
        passes = [
            ("forward", lambda: F.conv2d(x, w, None, 1, 1)),
            ("backward_data", lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, stride=1, padding=1)),
            ("backward_weight", lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, stride=1, padding=1)),
        ]
        flops = 2.0 * n * k * hw * hw * c * 9
        for pass_name, call in passes:
            us = time_loop(call, CALLS)
            us_graph = time_graph(call)
            rows.append({"shape": name, "pass": pass_name, "math": "tf32" if tf32 else "fp32", "us": us,
                         "us_graph": us_graph,
                         "gflops": flops / (us_graph * 1e3)})
    return rows


def read_ours(path):
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as f:
        return {(r["shape"], r["pass"], r.get("math", "fp32")): r for r in csv.DictReader(f)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", help="folder with bench_conv's conv.csv; conv_torch.csv is written there")
    parser.add_argument("--deterministic", action="store_true", help="cuDNN deterministic algorithms only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("conv_torch.py: no CUDA device")
    os.makedirs(args.out_dir, exist_ok=True)

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"benchmark on, deterministic {'on' if args.deterministic else 'off'}")
    rows = measure(args.deterministic, False) + measure(args.deterministic, True)
    shapes, passes = [c[0] for c in CASES], ["forward", "backward_data", "backward_weight"]
    rows.sort(key=lambda r: (shapes.index(r["shape"]), passes.index(r["pass"]), r["math"]))
    out_csv = os.path.join(args.out_dir, "conv_torch.csv")
    with open(out_csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["shape", "pass", "math", "us", "us_graph", "gflops"])
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()})

    ours = read_ours(os.path.join(args.out_dir, "conv.csv"))
    print()
    header = (f"{'shape':<11} | {'pass':<16} | {'math':<4} | {'nanotrain us':>12} | {'cuDNN us':>9} | {'ratio':>6} | "
              f"{'nt eager us':>11} | {'cuDNN eager us':>14}")
    print(header)
    print("-" * len(header))
    for r in rows:
        mine = ours.get((r["shape"], r["pass"], r["math"]))
        nt_graph = float(mine["us_graph"]) if mine else float("nan")
        nt_eager = float(mine["us"]) if mine else float("nan")
        ratio = nt_graph / r["us_graph"]
        print(f"{r['shape']:<11} | {r['pass']:<16} | {r['math']:<4} | {nt_graph:12.2f} | {r['us_graph']:9.2f} | {ratio:6.2f} | "
              f"{nt_eager:11.2f} | {r['us']:14.2f}")
    print("\nratio = nanotrain / cuDNN on graph timings (below 1: nanotrain is faster)")
    if not ours:
        print(f"(no {os.path.join(args.out_dir, 'conv.csv')}: run bench_conv {args.out_dir} first)")
    print(f"wrote {out_csv}")


if __name__ == "__main__":
    main()
