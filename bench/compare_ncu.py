#!/usr/bin/env python3
"""Compare the kernel profiler's times with Nsight Compute's, launch by launch.

    compare_ncu.py OURS.trace.json NCU.csv [--min-us 5] [--tolerance-pct 10]

OURS.trace.json: written by `nanotrain profile --profile-out OURS` (one complete event per launch, in
launch order). NCU.csv: `ncu --csv --metrics gpu__time_duration.sum --log-file NCU.csv` over the same run
with `--profile-from-start off`, so that it holds exactly the launches between the profiler's
cudaProfilerStart and cudaProfilerStop, in the same order. The two lists are zipped in order (ncu names
are the CUDA functions, ours the ops, so names cannot be matched; counts and order can) and averaged per
(kernel, phase, layer) row of our table.

Prints: kernel | phase | layer | calls | ours avg us | ncu avg us | difference %. Exits 1 when a row whose
own average is >= --min-us differs by more than --tolerance-pct, 2 when the launch lists do not line up.
Python 3 standard library only.
"""
import argparse
import csv
import json
import re
import sys
from collections import OrderedDict

UNIT_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
IGNORED = ("profile_hold", "memset", "memcpy")  # never in our trace: the profiler's hold, copy engines' work


def our_launches(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return [(e["name"], e["args"]["phase"], e["args"]["layer"], float(e["dur"]))
            for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]


def ncu_launches(path):
    """[(function name, duration in us)] in launch order, from either of ncu's CSV layouts."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{path}: no CSV header (a line starting with \"ID\"); did ncu profile anything?")
    rows = list(csv.reader(lines[start:]))
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    by_id = OrderedDict()
    if "Metric Name" in col:  # the details page: one row per (launch, metric)
        for r in body:
            if len(r) != len(header) or r[col["Metric Name"]] != "gpu__time_duration.sum":
                continue
            value = float(r[col["Metric Value"]].replace(",", ""))
            by_id[int(r[col["ID"]])] = (r[col["Kernel Name"]], value * UNIT_TO_US[r[col["Metric Unit"]]])
    elif "gpu__time_duration.sum" in col:  # the raw page: one row per launch, a units row first
        units = body[0][col["gpu__time_duration.sum"]]
        for r in body[1:]:
            if len(r) != len(header):
                continue
            value = float(r[col["gpu__time_duration.sum"]].replace(",", ""))
            by_id[int(r[col["ID"]])] = (r[col["Kernel Name"]], value * UNIT_TO_US[units])
    else:
        sys.exit(f"{path}: no gpu__time_duration.sum column or metric")
    launches = [by_id[i] for i in sorted(by_id)]
    return [(name, us) for name, us in launches if not any(word in name.lower() for word in IGNORED)]


def short_name(function):
    """'void nt::kernels::cuda::(anonymous namespace)::gemm_kernel<64, 64>(...)' -> 'gemm_kernel'."""
    name = re.sub(r"\(.*$", "", function.replace("(anonymous namespace)", "anon"))
    name = re.sub(r"<.*$", "", name)
    return name.split("::")[-1].split(" ")[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ours")
    ap.add_argument("ncu")
    ap.add_argument("--min-us", type=float, default=5.0, help="rows averaging less are shown, not judged")
    ap.add_argument("--tolerance-pct", type=float, default=10.0)
    a = ap.parse_args()

    ours, theirs = our_launches(a.ours), ncu_launches(a.ncu)
    if len(ours) != len(theirs):
        print(f"launch lists differ: {len(ours)} in {a.ours}, {len(theirs)} in {a.ncu}", file=sys.stderr)
        for i in range(min(len(ours), len(theirs), 40)):
            print(f"  {i:4d} {ours[i][0]:<20} {short_name(theirs[i][0])}", file=sys.stderr)
        return 2

    rows = OrderedDict()  # (kernel, phase, layer) -> [calls, ours us, ncu us, ncu function names]
    for (kernel, phase, layer, us), (function, ncu_us) in zip(ours, theirs):
        row = rows.setdefault((kernel, phase, layer), [0, 0.0, 0.0, set()])
        row[0] += 1
        row[1] += us
        row[2] += ncu_us
        row[3].add(short_name(function))

    table = [("Kernel", "Phase", "Layer", "Calls", "Ours avg us", "ncu avg us", "Diff %", "", "ncu function")]
    failures = 0
    total_ours = total_ncu = 0.0
    for (kernel, phase, layer), (calls, us, ncu_us, functions) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        ours_avg, ncu_avg = us / calls, ncu_us / calls
        diff = 100.0 * (ours_avg - ncu_avg) / ncu_avg if ncu_avg > 0 else float("inf")
        judged = ours_avg >= a.min_us
        bad = judged and abs(diff) > a.tolerance_pct
        failures += bad
        total_ours += us
        total_ncu += ncu_us
        mark = "FAIL" if bad else ("ok" if judged else "(short)")
        table.append((kernel, phase or "-", layer or "-", str(calls), f"{ours_avg:.2f}", f"{ncu_avg:.2f}", f"{diff:+.1f}",
                      mark, ",".join(sorted(functions))))
    widths = [max(len(r[c]) for r in table) for c in range(len(table[0]))]
    for i, r in enumerate(table):
        print(" | ".join(cell.rjust(w) if 3 <= c <= 6 else cell.ljust(w) for c, (cell, w) in enumerate(zip(r, widths))).rstrip())
        if i == 0:
            print("-+-".join("-" * w for w in widths))
    print(f"\n{len(ours)} launches; sum of kernel time: ours {total_ours / 1e3:.3f} ms, ncu {total_ncu / 1e3:.3f} ms "
          f"({100.0 * (total_ours - total_ncu) / total_ncu:+.1f}%)")
    print(f"rows averaging >= {a.min_us:g} us outside +-{a.tolerance_pct:g}%: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
