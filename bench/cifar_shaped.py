#!/usr/bin/env python3
"""Random data of CIFAR-10's shape and format (50000 + 10000 images) for the benchmarks: CIFAR-10's binary batches
(a label byte, then 3072 planar RGB bytes per record) and its class names, in the folder given.

    bench/cifar_shaped.py OUT_DIR
"""
import os, sys
import numpy as np
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(1)
def batch(name, n):  # CIFAR-10's binary records: a label byte, then 3072 planar RGB bytes
    records = np.empty((n, 3073), np.uint8)
    records[:, 0] = rng.integers(0, 10, n)
    records[:, 1:] = rng.integers(0, 256, (n, 3072))
    records.tofile(os.path.join(out, name))
for i in range(1, 6):
    batch(f"data_batch_{i}.bin", 10000)
batch("test_batch.bin", 10000)
with open(os.path.join(out, "batches.meta.txt"), "w") as f:
    f.write("\n".join(["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]) + "\n")
