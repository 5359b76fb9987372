#!/usr/bin/env python3
"""What a Chrome trace written by `--profile-out PREFIX` holds, in words (a screenshot-free description).

    trace_summary.py PREFIX.trace.json

Prints the tracks (thread names), the number of complete events per category (step, phase, layer, kernel),
the ranges per phase name with their time, the layer names, and the kernels per name; checks that every
kernel event lies inside a step range when steps were opened. Python 3 standard library only.
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
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in by_cat.get("step", []))
    if steps:
        outside = 0
        for k in by_cat.get("kernel", []):
            inside = any(s - 1e-3 <= k["ts"] and k["ts"] + k["dur"] <= t + 1e-3 for s, t in steps)
            outside += not inside
        print(f"kernels outside every step range: {outside} of {len(by_cat.get('kernel', []))}")
    span = [e["ts"] for e in complete] + [e["ts"] + e["dur"] for e in complete]
    if span:
        print(f"time span {(max(span) - min(span)) / 1e3:.3f} ms")


if __name__ == "__main__":
    main()
