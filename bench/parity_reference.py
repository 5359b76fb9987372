#!/usr/bin/env python3
"""The reference of the engine's PyTorch parity test (tests/cuda/test_parity_cuda.cpp).

From the engine's initial weights (`nanotrain train --init-out INIT`) and the engine's data order
(bench/nt_order.py, epoch 1 of the full training set), runs STEPS steps of plain SGD in fp32 (TF32 off)
and writes OUT, a safetensors file holding:
  loss                (steps,) F32   the mean cross-entropy of each step's batch, before that step's update
  grad.<param name>   F32            every parameter's gradient of step 1 (PyTorch's shapes)
and in its metadata the settings the test must reproduce (seed, batch, lr, steps, model, dataset, ...).

  python3 bench/parity_reference.py --init init.safetensors --out parity_ref.safetensors
  NT_PARITY_INIT=init.safetensors NT_PARITY_REF=parity_ref.safetensors build/tests/nt_tests_cuda "[parity]"
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nt_io  # noqa: E402
import nt_order  # noqa: E402
import pytorch_baseline as base  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", required=True, help="safetensors from `nanotrain train --init-out`")
    ap.add_argument("--out", required=True, help="the reference file to write")
    ap.add_argument("--data", help="MNIST folder (default: $NT_DATA_DIR, ./.data/mnist)")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--seed", type=int, default=None, help="data-order seed (default: the init file's 'seed', else 1)")
    ap.add_argument("--device", default=None, choices=["cuda", "cpu"])
    args = ap.parse_args()

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    base.set_precision(False)
    data_dir = nt_io.find_data_dir(args.data, "mnist")
    x_train, y_train, _, _ = nt_io.load_dataset(data_dir, "mnist")
    n = x_train.shape[0]
    if args.steps * args.batch > n:
        raise SystemExit(f"--steps {args.steps} x --batch {args.batch} exceeds one epoch of {n} examples")

    model = base.build_model(args.model, x_train.shape[1], 10).to(device)
    metadata, reader = base.load_init(model, args.init)
    seed = args.seed if args.seed is not None else int(metadata.get("seed", 1))
    order = np.asarray(nt_order.epoch_order(seed, 1, n), dtype=np.int64)
    x_all, y_all = torch.from_numpy(x_train).to(device), torch.from_numpy(y_train).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    losses, grads = [], {}
    for s in range(args.steps):
        idx = torch.from_numpy(order[s * args.batch:(s + 1) * args.batch]).to(device)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        loss.backward()
        if s == 0:
            grads = {f"grad.{name}": p.grad.detach().cpu().numpy().copy() for name, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())

    tensors = {"loss": np.asarray(losses, dtype=np.float32), **grads}
    nt_io.write_safetensors(args.out, tensors, {
        "seed": seed, "batch": args.batch, "lr": repr(args.lr), "steps": args.steps, "model": args.model,
        "dataset": "mnist", "train_examples": n, "epoch": 1, "device": base.device_name(device),
        "torch": torch.__version__, "init": os.path.abspath(args.init), "init_reader": reader})
    print(f"{args.out}: {args.steps} losses ({losses[0]:.6f} ... {losses[-1]:.6f}) and {len(grads)} step-1 "
          f"gradients on {base.device_name(device)}, seed {seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
