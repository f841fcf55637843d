#!/usr/bin/env python3
"""The host side of each launch in a scaling result: per process or rank, the median step, the training thread's
median CPU seconds per step, that as a share of the step, its involuntary context switches per step, and the
whole process's CPU seconds and switches per step (`host_per_step`, from the probe; the process columns exist
from the runs after the seventh session's), and its GPU's median busy share and SM clock over the timed steps
(`gpu_clocks`, from the same runs on). The training thread waits while the autograd engine's thread runs
each backward pass, so its share is not how busy the host was; the process's CPU seconds count both.

    python bench/host_table.py bench/results/scaling-*.json
"""
from __future__ import annotations

import json
import sys


def processes(run):
    """(label, GPU index, the part of the result it is in, rank, its host_per_step) per rank of a launch, and per
    process of a concurrent launch (rank r and process p use GPU r and GPU p)."""
    concurrent = "per_process" in run
    for p, part in enumerate(run["per_process"] if concurrent else [run]):
        for rank, host in (part.get("host_per_step") or {}).items():
            gpu_index = str(p) if concurrent else rank
            yield (f"gpu{gpu_index}" if concurrent else f"rank{rank}"), gpu_index, part, rank, host


def rows(result):
    """(round, configuration, process, median step s, thread CPU s, its share of the step, involuntary switches,
    process CPU s, process involuntary switches, GPU busy %, GPU SM MHz) per rank, and per process of a concurrent
    launch (rank r and process p use GPU r and GPU p); launches without the probe's host fields are left out."""
    out = []
    for i, row in enumerate(result["rounds"]):
        for name, run in row.items():
            for label, gpu_index, part, _, host in processes(run):
                step = part.get("median_step_s")
                gpu = (part.get("gpu_clocks") or {}).get(gpu_index, {})
                cpu = host.get("thread_cpu_s")
                share = round(cpu / step, 2) if cpu and step else None
                out.append((i, name, label, step, cpu, share, host.get("involuntary_switches"),
                            host.get("process_cpu_s"), host.get("process_involuntary_switches"),
                            gpu.get("busy_pct_median"), gpu.get("sm_mhz_median")))
    return out


def main(paths):
    for path in paths:
        print(f"{path}\nround  configuration     process  step_s  thread_cpu_s  cpu_share  involuntary_switches  "
              "process_cpu_s  process_involuntary_switches  gpu_busy_pct  sm_mhz")
        for i, name, label, *values in rows(json.load(open(path))):
            print(f"{i:5d}  {name:16s}  {label:7s}  " + "  ".join(str(v) for v in values))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
