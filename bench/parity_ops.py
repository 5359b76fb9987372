#!/usr/bin/env python3
"""Where the engine and PyTorch part: each op of the mlp's training step, recomputed from the engine's own inputs.

Reads bench/parity_trace's file (the engine's tensors of chosen steps) and, for every op of each traced step,
computes the op three ways from the same inputs: the engine's result (from the trace), PyTorch's in fp32 (TF32 off),
and a float64 reference. It prints, per op, each side's error against float64 (relative, in the norm) and its mean
signed error along the float64 result (a bias: an error that does not average out over the elements accumulates
step after step, where rounding noise does not). Last come the free-running runs' losses, the engine's against each
--reference (bench/parity_reference.py's files, e.g. PyTorch on the GPU and on the CPU) and those against each other.

  python3 bench/parity_ops.py --trace trace.safetensors [--reference parity_ref.safetensors]... [--device cuda]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nt_io  # noqa: E402
import pytorch_baseline as base  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def errors(value, ref):
    """(||value - ref|| / ||ref||, mean((value - ref) * sign(ref)) / mean|ref|): noise and bias."""
    value, ref = np.asarray(value, np.float64), np.asarray(ref, np.float64)
    scale = np.abs(ref).mean() or 1.0
    return (np.linalg.norm(value - ref) / (np.linalg.norm(ref) or 1.0),
            float(np.mean((value - ref) * np.sign(ref)) / scale))


def step_ops(t, s, lr, device):
    """[(op, engine, torch fp32, float64)] for traced step s of a linear-relu-linear-relu-linear mlp."""
    p = f"s{s}."
    names = sorted({k[len(p) + 2:] for k in t if k.startswith(p + "w.")}, key=lambda n: (int(n.split(".")[0]), n))
    layers = sorted({int(n.split(".")[0]) for n in names})
    x, labels = t[p + "x"], t[p + "labels"]
    ins = [x] + [t[f"{p}in{i}"] for i in range(1, len(layers))]
    rows = []

    def run(fn, *arrays):
        """fn over the engine's arrays in torch fp32 on `device` and in float64 on the CPU."""
        f32 = fn(*[torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays])
        f64 = fn(*[torch.from_numpy(np.asarray(a, np.float64)) if a.dtype != np.int64 else torch.from_numpy(a)
                   for a in arrays])
        return f32.detach().cpu().numpy(), f64.numpy()

    # Forward: each Linear (+ ReLU but the last) from the engine's input of that layer.
    for k, layer in enumerate(layers):
        w, b = t[f"{p}w.{layer}.weight"], t[f"{p}w.{layer}.bias"]
        last = k == len(layers) - 1
        engine_out = t[p + "logits"] if last else ins[k + 1]
        fn = (lambda a, w_, b_: a @ w_.T + b_) if last else (lambda a, w_, b_: torch.relu(a @ w_.T + b_))
        rows.append((f"forward {layer} linear{'' if last else '+relu'}", engine_out, *run(fn, ins[k], w, b)))
    logits = t[p + "logits"]
    # The loss and its gradient, from the engine's logits.
    rows.append(("loss (mean cross-entropy)", np.float64(t["loss"][s - 1]),
                 *run(lambda z, y: F.cross_entropy(z, y), logits, labels)))

    def dlogits_of(z, y):
        z = z.clone().requires_grad_(True)
        F.cross_entropy(z, y).backward()
        return z.grad
    rows.append(("loss gradient dlogits", t[p + "dlogits"], *run(dlogits_of, logits, labels)))
    # Backward, layer by layer from the engine's incoming gradient: weight and bias gradients and the input gradient.
    grad_out = t[p + "dlogits"]
    for k in reversed(range(len(layers))):
        layer, a = layers[k], ins[k]
        w = t[f"{p}w.{layer}.weight"]
        rows.append((f"backward {layer} weight gradient", t[f"{p}g.{layer}.weight"], *run(lambda g, a_: g.T @ a_, grad_out, a)))
        rows.append((f"backward {layer} bias gradient", t[f"{p}g.{layer}.bias"], *run(lambda g: g.sum(0), grad_out)))
        if k == 0:
            break
        # The gradient at this layer's input, already through the ReLU of the layer before (its output is `a`): the
        # engine masks it where it is made.
        din = t[f"{p}din{k}"]
        rows.append((f"backward {layer} input gradient (+relu mask)", din,
                     *run(lambda g, w_, a_: (g @ w_) * (a_ > 0), grad_out, w, a)))
        grad_out = din
    # The SGD update w - lr * g, from the engine's weights and gradients.
    for name in names:
        w, g = t[f"{p}w.{name}"], t[f"{p}g.{name}"]
        rows.append((f"sgd update {name}", t[f"{p}w_after.{name}"],
                     *run(lambda w_, g_: w_.add(g_, alpha=-lr) if w_.dtype == torch.float32 else w_ - lr * g_, w, g)))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", required=True, help="bench/parity_trace's file")
    ap.add_argument("--reference", action="append", default=[],
                    help="bench/parity_reference.py's file: free-running PyTorch losses (repeatable)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    args = ap.parse_args()
    base.set_precision(False)
    t, meta = nt_io.read_safetensors(args.trace)
    lr = float(meta["lr"])
    steps = sorted({int(k[1:k.index(".")]) for k in t if k.startswith("s") and "." in k})
    print(f"engine: {meta['device']}; PyTorch {torch.__version__} fp32 on {base.device_name(torch.device(args.device))}; "
          f"lr {lr}; traced steps {steps}")
    table = {}
    for s in steps:
        for op, engine, torch32, ref in step_ops(t, s, lr, args.device):
            table.setdefault(op, []).append((errors(engine, ref), errors(torch32, ref), errors(engine, torch32)))
    print(f"\n{'op':36} {'engine vs f64':>14} {'torch vs f64':>14} {'engine bias':>12} {'torch bias':>12} "
          f"{'engine vs torch':>16}")
    for op, rows in table.items():
        e = np.array([r[0] for r in rows]); tt = np.array([r[1] for r in rows]); d = np.array([r[2][0] for r in rows])
        print(f"{op:36} {e[:, 0].max():14.2e} {tt[:, 0].max():14.2e} {e[:, 1].mean():12.2e} {tt[:, 1].mean():12.2e} "
              f"{d.max():16.2e}")
    # The free-running runs: the engine's losses against each reference's, and the references against each other.
    runs = [(f"engine on {meta['device']}", t["loss"])]
    for path in args.reference:
        ref, ref_meta = nt_io.read_safetensors(path)
        runs.append((f"PyTorch {ref_meta.get('torch', '?')} on {ref_meta.get('device', '?')}",
                     ref["loss"].astype(np.float64)))
    if len(runs) > 1:
        print("\nfree-running losses (relative difference: largest, at step; at steps 1, 10, 50, 100, 200)")
    for i in range(len(runs)):
        for j in range(i + 1, len(runs)):
            (name_a, a), (name_b, b) = runs[i], runs[j]
            n = min(len(a), len(b))
            rel = np.abs(a[:n] - b[:n]) / np.abs(b[:n])
            print(f"  {name_a} vs {name_b}: {rel.max():.2e} at step {int(rel.argmax()) + 1}; "
                  + ", ".join(f"{rel[k - 1]:.1e}" for k in (1, 10, 50, 100, 200) if k <= n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
