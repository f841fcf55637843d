#!/usr/bin/env python3
"""Per-vCPU speed around each launch of a scaling result (`cpu_loop_s`: bench/hog.py's loop pinned to each vCPU,
before and after the launch; runs from the ninth session on). A vCPU counts as slow when its loop took more than
1.25x the map's fastest. Per launch: samples/s, how many vCPUs were slow before and after, the median fast and
slow loop and their ratio, the share of the vCPUs slow before that were still slow after (across the launch),
the vCPU each training thread ran on at step ends and its loop before -> after, and for a pinned launch the mean
loop of its set.
Then, between consecutive launches, the share still slow from one launch's after-map to the next's before-map
(seconds apart).

    python bench/cpu_table.py bench/results/scaling-*.json
"""
from __future__ import annotations

import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_table  # noqa: E402

SLOW = 1.25  # x the map's fastest vCPU


def slow(speeds):
    """The vCPUs of one map whose loop took more than SLOW x the fastest."""
    fastest = min(speeds.values())
    return {cpu for cpu, s in speeds.items() if s > SLOW * fastest}


def kept(first, second):
    """Share of the vCPUs slow in the first map that were slow in the second (None when none was)."""
    a = slow(first)
    return round(len(a & slow(second)) / len(a), 2) if a else None


def launch_row(run):
    """One launch's columns, or None when it has no per-vCPU maps."""
    maps = run.get("cpu_loop_s")
    if not maps:
        return None
    before, after = maps["before"], maps["after"]
    s = slow(before)
    fast_s = statistics.median(v for c, v in before.items() if c not in s)  # the fastest vCPU is never slow
    slow_s = statistics.median(before[c] for c in s) if s else None
    threads = {label: [f"{cpu}:{round(1000 * before[str(cpu)], 1)}->{round(1000 * after[str(cpu)], 1)}"
                       for cpu in host.get("cpus") or []]
               for label, _, _, _, host in host_table.processes(run)}
    pinned = run.get("NBDDP_BENCH_CPUS")
    pinned_ms = None
    if pinned:
        cpus = [c for group in pinned.split(";") for c in group.split(",")]
        pinned_ms = [round(1000 * statistics.mean(m[c] for c in cpus), 1) for m in (before, after)]
    return {"samples_per_s": run.get("samples_per_s"), "slow_before": len(s), "slow_after": len(slow(after)),
            "fast_ms": round(1000 * fast_s, 1), "slow_ms": slow_s and round(1000 * slow_s, 1),
            "slow_over_fast": slow_s and round(slow_s / fast_s, 2),
            "kept_across_launch": kept(before, after), "threads": threads, "pinned_ms": pinned_ms}


def rows(result):
    """(round, configuration, launch_row) per launch with maps, then the between-launch persistence list."""
    out, between, last = [], [], None
    for i, row in enumerate(result["rounds"]):
        for name, run in row.items():
            columns = launch_row(run)
            if columns is None:
                continue
            out.append((i, name, columns))
            if last is not None:
                between.append(kept(last, run["cpu_loop_s"]["before"]))
            last = run["cpu_loop_s"]["after"]
    return out, between


def main(paths):
    for path in paths:
        launches, between = rows(json.load(open(path)))
        if not launches:
            print(f"{path}: no per-vCPU maps (runs before the ninth session's second call)")
            continue
        print(f"{path}\nround  configuration     samples_per_s  slow_before  slow_after  fast_ms  slow_ms  "
              "slow_over_fast  kept_across_launch  thread vCPU:ms before->after  pinned_set_ms before,after")
        for i, name, c in launches:
            print(f"{i:5d}  {name:16s}  " + "  ".join(str(c[k]) for k in (
                "samples_per_s", "slow_before", "slow_after", "fast_ms", "slow_ms", "slow_over_fast",
                "kept_across_launch"))
                  + f"  {json.dumps(c['threads'])}  {c['pinned_ms']}")
        print(f"kept from one launch's after-map to the next launch's before-map: {between}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
