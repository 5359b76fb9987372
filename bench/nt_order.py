#!/usr/bin/env python3
"""The engine's per-epoch data order, re-implemented bit for bit (engine/rng.h, data/batcher.cpp).

The engine shuffles the training set each epoch with its own generator so that a seed means the same
order on every machine; the PyTorch baseline and the parity reference replay exactly that order:

  SplitMix64 (Steele, Lea, Flood 2014), 64-bit state, outputs as in engine/rng.h
  derive_seed(seed, purpose, index): the stream of (seed, purpose, index); shuffling is purpose 1, index = epoch
  Rng.below(n): unbiased integer in [0, n) by rejecting draws >= 2^64-1 - (2^64-1) % n
  random_permutation(n): Fisher-Yates from the top: for i = n-1 .. 1, swap p[i] with p[below(i + 1)]

Python integers are unbounded, so every product and sum is masked to 64 bits.

  python3 bench/nt_order.py --seed 1 --n 60000 --epoch 1            # prints the first indices
  python3 bench/nt_order.py --seed 1 --n 1000 --check order.npy     # compares with `nanotrain train --order-out`
"""
import argparse
import functools
import sys

MASK64 = (1 << 64) - 1
SHUFFLE_PURPOSE = 1  # kShufflePurpose in data/batcher.cpp


class Rng:
    """engine/rng.h's Rng: SplitMix64."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n):
        limit = MASK64 - MASK64 % n
        while True:
            x = self.next_u64()
            if x < limit:
                return x % n


def derive_seed(seed, purpose, index):
    r = Rng(seed ^ ((purpose * 0xD1B54A32D192ED03) & MASK64))
    r.next_u64()
    s = Rng(r.next_u64() ^ ((index * 0x8CB92BA72F3D8DD7) & MASK64))
    return s.next_u64()


def random_permutation(n, rng):
    """Fisher-Yates exactly as engine/rng.cpp; the generator is inlined (this loop is the hot part)."""
    p = list(range(n))
    state = rng.state
    for i in range(n - 1, 0, -1):
        m = i + 1
        limit = MASK64 - MASK64 % m
        while True:
            state = (state + 0x9E3779B97F4A7C15) & MASK64
            z = state
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
            z ^= z >> 31
            if z < limit:
                break
        j = z % m
        p[i], p[j] = p[j], p[i]
    rng.state = state
    return p


@functools.lru_cache(maxsize=None)
def _epoch_order_tuple(seed, epoch, n):
    return tuple(random_permutation(n, Rng(derive_seed(seed, SHUFFLE_PURPOSE, epoch))))


def epoch_order(seed, epoch, n):
    """The order of the n training examples in `epoch` (1-based, as the engine counts) for `seed`: a list."""
    return list(_epoch_order_tuple(seed, epoch, n))


def read_npy_i32(path):
    """(shape, flat list) of a little-endian int32 .npy (what `nanotrain train --order-out` writes), with the
    standard library only, so that the check runs wherever python3 does."""
    import ast
    import struct
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        raise SystemExit(f"{path}: not a .npy file")
    major = data[6]
    (hlen,), start = (struct.unpack("<H", data[8:10]), 10) if major == 1 else (struct.unpack("<I", data[8:12]), 12)
    header = ast.literal_eval(data[start:start + hlen].decode("latin1"))
    if header["descr"] != "<i4" or header["fortran_order"]:
        raise SystemExit(f"{path}: {header}, expected '<i4' in C order")
    shape = tuple(header["shape"])
    count = 1
    for d in shape:
        count *= d
    body = data[start + hlen:]
    if len(body) != 4 * count:
        raise SystemExit(f"{path}: {len(body)} data bytes for shape {shape}")
    return shape, list(struct.unpack(f"<{count}i", body))


def _self_test():
    # The generator's first output for seed 0 is SplitMix64's published reference value.
    assert Rng(0).next_u64() == 0xE220A8397B1DCDAF, "SplitMix64 reference value"
    r1, r2 = Rng(12345), Rng(12345)
    p = random_permutation(1000, r1)
    assert sorted(p) == list(range(1000))
    # The inlined loop and the class's below() agree.
    q = list(range(1000))
    for i in range(999, 0, -1):
        j = r2.below(i + 1)
        q[i], q[j] = q[j], q[i]
    assert p == q and r1.state == r2.state


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--n", type=int, default=60000, help="training examples (after --train-limit)")
    ap.add_argument("--epoch", type=int, default=1)
    ap.add_argument("--check", metavar="NPY", help="an (epochs, n) int32 .npy from `nanotrain train --order-out`")
    args = ap.parse_args()
    _self_test()
    if not args.check:
        print(" ".join(str(i) for i in epoch_order(args.seed, args.epoch, args.n)[:20]), "...")
        return 0
    shape, values = read_npy_i32(args.check)
    if len(shape) != 2 or shape[1] != args.n:
        print(f"{args.check}: shape {shape}, expected (epochs, {args.n})", file=sys.stderr)
        return 1
    for e in range(shape[0]):
        want = epoch_order(args.seed, e + 1, args.n)
        got = values[e * args.n:(e + 1) * args.n]
        if got != want:
            k = next(i for i in range(args.n) if got[i] != want[i])
            print(f"{args.check}: epoch {e + 1} differs at position {k}: engine {got[k]}, nt_order.py {want[k]}",
                  file=sys.stderr)
            return 1
    print(f"{args.check}: {shape[0]} epochs of {args.n} indices identical to nt_order.py (seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
