#!/usr/bin/env python3
"""What a Chrome trace written by `--profile-out PREFIX` holds, in words (a screenshot-free description).

    trace_summary.py PREFIX.trace.json

Prints the tracks (thread names) with the kernels on each, the number of complete events per category (step,
phase, layer, kernel, wait, kernel_phase) and of flow arrows, the ranges per phase name with their time, the layer
names, and the kernels per name; checks that every kernel's exclusive time lies inside a step range when steps were
opened; and draws one training step (the third, or the last if fewer) kernel by kernel: its track, start, span and
exclusive time, and the kernels it ran beside. Python 3 standard library only.
"""
import collections
import json
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    with open(sys.argv[1]) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    process = next((e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"), "?")
    complete = [e for e in events if e.get("ph") == "X"]
    by_cat = collections.defaultdict(list)
    for e in complete:
        by_cat[e["cat"]].append(e)
    other = trace.get("otherData", {})
    print(f"process '{process}', timer {other.get('timer', '?')}, {other.get('launches', '?')} launches "
          f"({other.get('launches_not_in_trace', 0)} not in the trace)")
    print("tracks: " + ", ".join(f"{tid} {name}" for tid, name in sorted(tracks.items())))
    print("complete events: " + ", ".join(f"{cat} {len(v)}" for cat, v in sorted(by_cat.items())))
    for cat in ("phase", "layer", "kernel"):
        groups = collections.defaultdict(lambda: [0, 0.0])
        for e in by_cat.get(cat, []):
            groups[e["name"]][0] += 1
            groups[e["name"]][1] += e["dur"]
        print(f"{cat}s ({len(groups)} names): " +
              "; ".join(f"{name} x{n} {us / 1e3:.3f} ms" for name, (n, us) in sorted(groups.items(), key=lambda kv: -kv[1][1])))
    kernels = by_cat.get("kernel", [])
    on_track = collections.Counter(k["tid"] for k in kernels)
    print("kernels per track: " + ", ".join(f"{tracks.get(tid, tid)} {n}" for tid, n in sorted(on_track.items())))
    flows = [e for e in events if e.get("ph") in ("s", "f")]
    print(f"flow arrows (kernel -> the kernel it waits on): {sum(e['ph'] == 's' for e in flows)}")

    def exclusive_start(k):
        return k["ts"] + k["dur"] - k["args"].get("exclusive_us", k["dur"])

    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in by_cat.get("step", []))
    if steps:
        outside = 0
        for k in kernels:
            inside = any(s - 1e-3 <= exclusive_start(k) and k["ts"] + k["dur"] <= t + 1e-3 for s, t in steps)
            outside += not inside
        print(f"kernels outside every step range: {outside} of {len(kernels)}")
        train = [e for e in by_cat.get("step", []) if e["name"] == "train_step"] or by_cat.get("step", [])
        step = sorted(train, key=lambda e: e["ts"])[min(2, len(train) - 1)]
        lo, hi = step["ts"], step["ts"] + step["dur"]
        mine = sorted((k for k in kernels if lo - 1e-3 <= exclusive_start(k) and k["ts"] + k["dur"] <= hi + 1e-3),
                      key=lambda k: k["ts"])
        print(f"one {step['name']} ({len(mine)} kernels, {step['dur']:.2f} us from its first exclusive start to its "
              f"last end), t = 0 at its start:")
        for k in mine:
            beside = [o["name"] for o in mine if o is not k and o["ts"] < k["ts"] + k["dur"] and k["ts"] < o["ts"] + o["dur"]
                      and o["tid"] != k["tid"]]
            print(f"  {tracks.get(k['tid'], k['tid']):<18} {k['ts'] - lo:8.2f} us  span {k['dur']:7.2f}  exclusive "
                  f"{k['args'].get('exclusive_us', k['dur']):7.2f}  {k['name']:<36} {k['args'].get('layer', '')}"
                  + (f"  beside {', '.join(beside)}" if beside else "")
                  + ("  [declared beside its predecessor]" if k["args"].get("overlaps_previous") else ""))
    span = [e["ts"] for e in complete] + [e["ts"] + e["dur"] for e in complete]
    if span:
        print(f"time span {(max(span) - min(span)) / 1e3:.3f} ms")


if __name__ == "__main__":
    main()
