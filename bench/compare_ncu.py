#!/usr/bin/env python3
"""Compare the kernel profiler's times with Nsight Compute's, launch by launch.

    compare_ncu.py OURS.trace.json NCU.csv [--reference OTHER.trace.json ...] [--min-us 5] [--tolerance-pct 10]
                   [--calibration SPIN.csv SPIN_NCU.csv]

OURS.trace.json: written by `nanotrain profile --profile-out OURS` (one complete event per launch, in
launch order; its otherData names the timer, cupti or cuda events). NCU.csv: `ncu --csv --metrics
gpu__time_duration.sum --log-file NCU.csv` over a separate run of the same command with
`--profile-from-start off`, so that it holds exactly the launches between the profiler's cudaProfilerStart
and cudaProfilerStop, in the same order. ncu holds CUPTI itself, so its run must use `--profile-timer events`
(with --no-hold: ncu serializes launches); the run compared may use any timer. The lists are zipped in order
(ncu names are the CUDA functions, ours the ops, so names cannot be matched; counts and order can) and
averaged per (kernel, phase, layer) row of our table. --reference adds the columns of another of our runs
(e.g. the events timer next to cupti), shown but not judged; with --judge-reference the first reference is the judge
instead of ncu: another timer over the same execution (the launch stamps of replayed graphs against CUPTI's records
of the same replays, where graph execution itself moves some kernels by up to 20% from ncu's serialized launches),
every row averaging >= --min-us within --tolerance-pct, but for those whose kernels share the GPU with a neighbour
(as below) or follow one that ran beside its predecessor: the two timers place the end of a kernel that overlaps
differently (docs/profiler.md, "Launch stamps").

--calibration: what each timer reads for kernels of known length (spin kernels of 0 to 20 us: SPIN.csv from
`bench_launch --out`, SPIN_NCU.csv from ncu over `bench_launch --ncu`). ncu's gpu__time_duration of a kernel
run alone reads a fixed amount more than the kernel's length, the same for every length; its median over
the spin kernels, less what our timer reads over them, is ncu's fixed cost relative to our timer. The table
then adds the column "ncu - fixed" and judges our times against it (docs/profiler.md, "Fidelity"); the raw
difference stays in the table.

Prints: kernel | phase | layer | calls | ncu avg us | ours avg us | difference % | verdict [| ncu - fixed |
difference % | verdict] [| reference avg us | difference %] | ncu function. Exits 1 when a row whose own
average is >= --min-us differs by more than --tolerance-pct (from ncu - fixed with --calibration), 2 when
the launch lists do not line up. Python 3 standard library only.
"""
import argparse
import csv
import json
import os
import re
import sys
from collections import OrderedDict

UNIT_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
IGNORED = ("profile_hold", "memset", "memcpy")  # never in our trace: the profiler's hold, copy engines' work


def our_launches(path):
    """(timer name, [(kernel, phase, layer, exclusive us, span us, beside its predecessor)] in launch order).
    The trace's slice is the span; its args hold the exclusive time (docs/profiler.md, "Span and exclusive time")."""
    with open(path) as f:
        trace = json.load(f)
    timer = trace.get("otherData", {}).get("timer") or "ours"
    return timer, [(e["name"], e["args"]["phase"], e["args"]["layer"],
                    float(e["args"].get("exclusive_us", e["dur"])), float(e["dur"]),
                    bool(e["args"].get("overlaps_previous", False)))
                   for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]


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


def lists_line_up(name, ours, theirs, path):
    if len(ours) == len(theirs):
        return True
    print(f"launch lists differ: {len(ours)} in {path} ({name}), {len(theirs)} in ncu's", file=sys.stderr)
    for i in range(min(len(ours), len(theirs), 40)):
        print(f"  {i:4d} {ours[i][0]:<20} {short_name(theirs[i][0])}", file=sys.stderr)
    return False


def ncu_fixed_us(spin_csv, spin_ncu_csv, timer):
    """ncu's fixed cost per kernel beyond what our `timer` reads: the median over the spin kernels of
    (ncu avg - ours avg). Prints the calibration table."""
    with open(spin_csv, newline="") as f:
        spins = list(csv.DictReader(f))
    theirs = ncu_launches(spin_ncu_csv)
    if not spins or len(theirs) % len(spins):
        sys.exit(f"{spin_ncu_csv}: {len(theirs)} launches, not a multiple of the {len(spins)} kernels of {spin_csv}")
    per = len(theirs) // len(spins)  # bench_launch --ncu: `per` launches of each kernel, in the CSV's order
    column = {"cupti": "cupti_us", "cuda events": "events_us", "launch stamps": "stamps_us"}.get(timer, "cupti_us")
    if column not in spins[0]:
        sys.exit(f"{spin_csv}: no {column} column for the {timer} timer")
    print("Calibration: kernels of known length (bench_launch; one block spinning on %globaltimer), us per launch")
    print(f"{'kernel':<10} | {'true':>6} | {'ncu':>6} | {'cupti':>6} | {'events':>6} | {'stamps':>6} | "
          f"{'ncu - ' + timer:>20} | {'ncu - true':>10}")
    gaps = []
    for k, spin in enumerate(spins):
        ncu = sum(us for _, us in theirs[k * per:(k + 1) * per]) / per
        true, cupti, events = float(spin["true_us"]), float(spin["cupti_us"]), float(spin["events_us"])
        stamps = float(spin.get("stamps_us", 0))
        gaps.append(ncu - float(spin[column]))
        print(f"{spin['kernel']:<10} | {true:6.2f} | {ncu:6.2f} | {cupti:6.2f} | {events:6.2f} | {stamps:6.2f} | "
              f"{gaps[-1]:20.2f} | {ncu - true:10.2f}")
    gaps.sort()
    fixed = (gaps[(len(gaps) - 1) // 2] + gaps[len(gaps) // 2]) / 2
    print(f"ncu's fixed cost beyond {timer}: {fixed:.2f} us per kernel (median of {len(gaps)}; spread "
          f"{gaps[0]:.2f} to {gaps[-1]:.2f})\n")
    return fixed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ours")
    ap.add_argument("ncu")
    ap.add_argument("--reference", action="append", default=[], help="another of our traces, shown, not judged")
    ap.add_argument("--min-us", type=float, default=5.0, help="rows averaging less are shown, not judged")
    ap.add_argument("--tolerance-pct", type=float, default=10.0)
    ap.add_argument("--calibration", nargs=2, metavar=("SPIN.csv", "SPIN_NCU.csv"),
                    help="judge against ncu less its fixed cost, measured on kernels of known length")
    ap.add_argument("--judge-reference", action="store_true",
                    help="judge against the first --reference (the same execution, another timer), not ncu")
    a = ap.parse_args()
    if a.judge_reference and not a.reference:
        sys.exit("--judge-reference: name the reference with --reference")

    theirs = ncu_launches(a.ncu)
    paths = [a.ours] + a.reference
    runs = [our_launches(path) for path in paths]
    timers = [name for name, _ in runs]  # two runs of one timer are told apart by their files' names
    runs = [(f"{name} ({os.path.basename(path).split('.')[0]})" if timers.count(name) > 1 else name, launches)
            for (name, launches), path in zip(runs, paths)]
    if not all(lists_line_up(name, launches, theirs, path) for (name, launches), path in zip(runs, paths)):
        return 2
    fixed = ncu_fixed_us(*a.calibration, runs[0][0].split(" (")[0]) if a.calibration else None

    # (kernel, phase, layer) -> [calls, ncu us, ncu function names, us of each run, span us of the first, shared]
    # A launch shares the GPU with a neighbour when it was declared to run beside its predecessor, or its successor was
    # (conv2's backward_weight slows down while backward_data runs beside it): its exclusive time is then not the
    # length ncu measures of it alone.
    first = runs[0][1]
    rows = OrderedDict()
    for i, (function, ncu_us) in enumerate(theirs):
        kernel, phase, layer, _, span, beside = first[i]
        after_beside = i > 0 and first[i - 1][5]
        beside = beside or (i + 1 < len(first) and first[i + 1][5])
        row = rows.setdefault((kernel, phase, layer), [0, 0.0, set(), [0.0] * len(runs), 0.0, False, False])
        row[0] += 1
        row[1] += ncu_us
        row[2].add(short_name(function))
        for r, (_, launches) in enumerate(runs):
            row[3][r] += launches[i][3]
        row[4] += span
        row[5] = row[5] or beside
        row[6] = row[6] or after_beside

    def pct(x, ref):
        return 100.0 * (x - ref) / ref if ref > 0 else float("inf")

    header = ["Kernel", "Phase", "Layer", "Calls", "ncu avg us", f"{runs[0][0]} avg us", "span us", "Diff %", ""]
    numeric = {3, 4, 5, 6, 7}
    if fixed is not None:
        header += [f"ncu - {fixed:.2f}", "Diff %", ""]
        numeric |= {9, 10}
    for r, (name, _) in enumerate(runs[1:]):
        numeric |= {len(header), len(header) + 1}
        header += [f"{name} avg us", "Diff %"]
        if r == 0 and a.judge_reference:
            numeric.add(len(header))
            header += [f"{runs[0][0]} vs it", ""]
    header.append("ncu function")
    table = [header]
    failures, raw_failures, reference_failures = 0, 0, 0
    total_ncu, totals = 0.0, [0.0] * len(runs)
    # A kernel that shares the GPU with a neighbour has an exclusive time that is how far it extends the stream, not its
    # length alone: shown, not judged here (the --no-pdl run, where nothing overlaps, judges it).
    for (kernel, phase, layer), (calls, ncu_us, functions, us, span_us, beside, after_beside) in sorted(
            rows.items(), key=lambda kv: -kv[1][1]):
        ncu_avg = ncu_us / calls
        avgs = [x / calls for x in us]
        judged = avgs[0] >= a.min_us and not beside
        unjudged = "(overlap)" if beside else "(short)"
        raw_bad = judged and abs(pct(avgs[0], ncu_avg)) > a.tolerance_pct
        raw_failures += raw_bad
        total_ncu += ncu_us
        totals = [t + x for t, x in zip(totals, us)]
        line = [kernel, phase or "-", layer or "-", str(calls), f"{ncu_avg:.2f}", f"{avgs[0]:.2f}",
                f"{span_us / calls:.2f}", f"{pct(avgs[0], ncu_avg):+.1f}",
                "FAIL" if raw_bad else ("ok" if judged else unjudged)]
        if fixed is None:
            failures += raw_bad
        else:
            calibrated = ncu_avg - fixed
            bad = judged and abs(pct(avgs[0], calibrated)) > a.tolerance_pct
            failures += bad
            line += [f"{calibrated:.2f}", f"{pct(avgs[0], calibrated):+.1f}",
                     "FAIL" if bad else ("ok" if judged else unjudged)]
        for r, avg in enumerate(avgs[1:]):
            line += [f"{avg:.2f}", f"{pct(avg, ncu_avg):+.1f}"]
            if r == 0 and a.judge_reference:
                shared = beside or after_beside
                judged_here = avgs[0] >= a.min_us and not shared
                bad = judged_here and abs(pct(avgs[0], avg)) > a.tolerance_pct
                reference_failures += bad
                line += [f"{pct(avgs[0], avg):+.1f}",
                         "FAIL" if bad else ("ok" if judged_here else ("(overlap)" if shared else "(short)"))]
        line.append(",".join(sorted(functions)))
        table.append(line)
    widths = [max(len(r[c]) for r in table) for c in range(len(header))]
    for i, r in enumerate(table):
        print(" | ".join(cell.rjust(w) if c in numeric else cell.ljust(w)
                         for c, (cell, w) in enumerate(zip(r, widths))).rstrip())
        if i == 0:
            print("-+-".join("-" * w for w in widths))
    print(f"\n{len(theirs)} launches; sum of kernel time: ncu {total_ncu / 1e3:.3f} ms, " +
          ", ".join(f"{name} {t / 1e3:.3f} ms ({pct(t, total_ncu):+.1f}%)" for (name, _), t in zip(runs, totals)))
    print(f"{runs[0][0]}: rows averaging >= {a.min_us:g} us outside +-{a.tolerance_pct:g}% of ncu: {raw_failures}")
    if fixed is not None:
        print(f"{runs[0][0]}: rows averaging >= {a.min_us:g} us outside +-{a.tolerance_pct:g}% of ncu less its fixed "
              f"{fixed:.2f} us: {failures}")
    if a.judge_reference:
        print(f"{runs[0][0]}: rows averaging >= {a.min_us:g} us outside +-{a.tolerance_pct:g}% of {runs[1][0]} (the judge "
              f"here; ncu shown): {reference_failures}")
        return 1 if reference_failures else 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
