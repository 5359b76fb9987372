#!/usr/bin/env python3
"""Where each kernel's time goes, from one Nsight Compute raw CSV (scripts/gpu-check, part step-ncu).

    ncu_anatomy.py NCU.csv [--top 4]

NCU.csv: `ncu --csv --page raw --print-units base --section WarpStateStats --metrics
gpu__time_duration.sum,sm__cycles_active.max,gpc__cycles_elapsed.max,... --log-file NCU.csv`. Prints, per
launch in order: the function (shortened), grid and block, registers, time, the busiest SM's active share of
the elapsed cycles (low: the time is launch, scheduling or drain, not the SMs' work), achieved occupancy,
warp cycles per issued instruction, and the leading stall reasons as warps per issue cycle. Python 3
standard library only.
"""
import argparse
import csv
import re
import sys

STALL = re.compile(r"^smsp__average_warps_issue_stalled_(.+)_per_issue_active\.ratio$")


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return float("nan")


def short_name(function):
    """'void nt::...::gemm_splitk_kernel<...>(...)' -> 'gemm_splitk_kernel<...>' trimmed to 48 characters."""
    name = function.split("(")[0].replace("void ", "")
    name = re.sub(r"nt::kernels::cuda::(\(anonymous namespace\)::)?", "", name)
    return name if len(name) <= 48 else name[:45] + "..."


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=4, help="stall reasons shown per launch")
    args = parser.parse_args()
    with open(args.csv, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{args.csv}: no CSV header (a line starting with \"ID\"); did ncu profile anything?")
    rows = list(csv.reader(lines[start:]))
    header, units, body = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}

    def get(r, name):
        return number(r[col[name]]) if name in col and col[name] < len(r) else float("nan")

    stalls = [(name, m.group(1)) for name, m in ((h, STALL.match(h)) for h in header) if m]
    print(f"{'#':>3} {'kernel':<48} {'grid':>5} {'block':>5} {'regs':>4} {'us':>7} {'SM busy':>7} "
          f"{'occup%':>6} {'cyc/inst':>8}  leading stalls (warps per issue cycle)")
    for r in body:
        if len(r) != len(header):
            continue
        ns = get(r, "gpu__time_duration.sum")
        busy = get(r, "sm__cycles_active.max") / get(r, "gpc__cycles_elapsed.max")
        ranked = sorted(((get(r, name), reason) for name, reason in stalls), key=lambda t: -t[0] if t[0] == t[0] else 0)
        lead = ", ".join(f"{reason} {value:.2f}" for value, reason in ranked[: args.top] if value == value)
        print(f"{r[col['ID']]:>3} {short_name(r[col['Kernel Name']]):<48} {get(r, 'launch__grid_size'):>5.0f} "
              f"{get(r, 'launch__block_size'):>5.0f} {get(r, 'launch__registers_per_thread'):>4.0f} {ns / 1e3:>7.2f} "
              f"{100 * busy:>6.1f}% {get(r, 'sm__warps_active.avg.pct_of_peak_sustained_active'):>6.1f} "
              f"{get(r, 'smsp__average_warp_latency_per_inst_issued.ratio'):>8.1f}  {lead}")


if __name__ == "__main__":
    main()
