#!/usr/bin/env python3
"""Time to a test accuracy from a cold start: `nanotrain train --target-acc` run once per seed, each a fresh
process, timed from outside (fork to exit: the whole process, loader and CUDA start-up included) and from inside
(the run's own split: start-up, data load, planning and capture, training, evaluation). Reports each run, then the
median and the worst of the time at which each run reports the target reached (its own clock from the process's
start), of the whole processes' times (exit and its teardown included), and of the epochs it took.

    python3 bench/time_to_accuracy.py --nanotrain build/nanotrain --recipe bench/recipes/time-to-99.txt \\
        --seeds 1,2,3,4,5 [--target 0.99] [--data DIR] [--json out.json] [--torch]

--torch runs PyTorch on the same recipe instead (bench/time_to_accuracy_torch.py: the whole step one CUDA graph,
fused Adam), each seed a fresh Python process timed the same way.

The recipe file holds one line of `train` flags (comments with #): the first line that is not a comment. A run that
misses the target (exit code 4) counts as a miss and is reported; it is not in the median.
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

SPLIT = re.compile(
    r"reached ([0-9.]+)% test accuracy \(target [0-9.]+%\) after epoch (\d+): ([0-9.]+) s from the process's start: "
    r"start-up ([0-9.]+), data load ([0-9.]+), planning and capture ([0-9.]+), training ([0-9.]+), "
    r"evaluation ([0-9.]+), other (-?[0-9.]+)")
TORCH_SCRIPT = str(Path(__file__).resolve().parent / "time_to_accuracy_torch.py")
PARTS = ["startup", "data", "planning", "training", "evaluation", "other"]


def recipe_flags(path):
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                return line.split()
    sys.exit(f"time_to_accuracy: {path}: no line of flags")


def one_run(command):
    start = time.perf_counter()
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - start
    match = SPLIT.search(proc.stdout)
    run = {"exit": proc.returncode, "wall_s": wall}
    if match:
        run.update(accuracy=float(match[1]) / 100, epochs=int(match[2]), inside_s=float(match[3]))
        run.update({part: float(v) for part, v in zip(PARTS, match.groups()[3:])})
    elif proc.returncode not in (0, 4):
        sys.exit(f"time_to_accuracy: {' '.join(command)} exited {proc.returncode}:\n{proc.stdout[-2000:]}")
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nanotrain", default="build/nanotrain")
    p.add_argument("--recipe", required=True, help="a file with one line of train flags")
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument("--target", type=float, default=0.99)
    p.add_argument("--data", help="--data for train (default: its own search)")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", help="write the runs and the summary here")
    p.add_argument("--torch", action="store_true", help="run PyTorch's script of the recipe instead of the engine")
    a = p.parse_args()
    flags = recipe_flags(a.recipe)
    runs = []
    for seed in [int(s) for s in a.seeds.split(",")]:
        if a.torch:
            command = [sys.executable, TORCH_SCRIPT, *flags, "--seed", str(seed), "--target-acc", str(a.target)]
        else:
            command = [a.nanotrain, "train", "--device", a.device, *flags, "--seed", str(seed), "--target-acc",
                       str(a.target), "--log-level", "warn", "--progress", "never"]
        if a.data:
            command += ["--data", a.data]
        run = one_run(command)
        run["seed"] = seed
        runs.append(run)
        if "inside_s" in run:
            parts = ", ".join(f"{part} {run[part]:.3f}" for part in PARTS)
            print(f"seed {seed}: {100 * run['accuracy']:.2f}% after {run['epochs']} epoch(s), {run['wall_s']:.3f} s "
                  f"(inside {run['inside_s']:.3f}: {parts})", flush=True)
        else:
            print(f"seed {seed}: target missed (exit {run['exit']}), {run['wall_s']:.3f} s", flush=True)
    hits = [r for r in runs if "inside_s" in r]
    summary = {"target": a.target, "runs": len(runs), "reached": len(hits), "recipe": " ".join(flags),
               "trainer": "pytorch" if a.torch else "nanotrain"}
    if hits:
        walls, reached = [r["wall_s"] for r in hits], [r["inside_s"] for r in hits]
        summary.update(median_s=statistics.median(walls), worst_s=max(walls),
                       median_reached_s=statistics.median(reached), worst_reached_s=max(reached),
                       median_epochs=statistics.median(r["epochs"] for r in hits),
                       worst_epochs=max(r["epochs"] for r in hits))
        print(f"time to {100 * a.target:.1f}% from process start: median {summary['median_reached_s']:.3f} s, worst "
              f"{summary['worst_reached_s']:.3f} s when the run reports it; whole processes (exit included) median "
              f"{summary['median_s']:.3f} s, worst {summary['worst_s']:.3f} s; over {len(hits)} of {len(runs)} runs "
              f"(epochs: median {summary['median_epochs']}, worst {summary['worst_epochs']})")
    else:
        print(f"time to {100 * a.target:.1f}%: no run reached it")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary, "runs": runs}, f, indent=1)
    return 0 if len(hits) == len(runs) else 4


if __name__ == "__main__":
    sys.exit(main())
