"""GPU clocks, power, temperature and busy share sampled by `nvidia-smi` while a benchmark launch runs, summarised
over its timed steps: whether a slow stretch came with lower SM clocks or a clock-event reason (power cap,
thermal, ...) on the GPU, or not.

    with Sampler(path) as sampler:     # nvidia-smi -lms 250 into path, stopped on exit; no nvidia-smi: no file
        ...launch...
    summary(read(path), start, end)    # per GPU index over [start, end] (epoch seconds)
"""
from __future__ import annotations

import datetime
import os
import statistics
import subprocess

FIELDS = ("timestamp", "index", "clocks.sm", "power.draw", "temperature.gpu", "utilization.gpu",
          "clocks_event_reasons.active")
PERIOD_MS = 250


class Sampler:
    def __init__(self, path):
        self.path, self.proc, self.out = path, None, None

    def __enter__(self):
        self.out = open(self.path, "w")
        try:
            self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(FIELDS)}",
                                          "--format=csv,noheader,nounits", "-lms", str(PERIOD_MS)],
                                         stdout=self.out, stderr=subprocess.DEVNULL)
        except OSError:  # no nvidia-smi here (CPU machines): nothing sampled
            self.out.close()
            os.remove(self.path)
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.out.close()
        return False


def _number(text):
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def read(path):
    """The samples of one sampler file: (epoch seconds, GPU index, SM MHz, W, °C, busy %, event-reason mask)."""
    rows = []
    if not path or not os.path.exists(path):
        return rows
    for line in open(path, errors="replace"):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(FIELDS):
            continue
        try:  # nvidia-smi writes local time, as time.time() reads it here
            when = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            index = int(parts[1])
        except ValueError:
            continue
        reasons = int(parts[6], 16) if parts[6].startswith("0x") else None  # a bit mask, or "[N/A]"
        rows.append((when, index, *(_number(p) for p in parts[2:6]), reasons))
    return rows


def stat(fn, values, digits=3):
    """fn(values) rounded, or None for no values (scaling.py and hog.py round with it too)."""
    return round(fn(values), digits) if values else None


def summary(rows, start, end):
    """Per GPU index, over the samples in [start, end]: median and lowest SM clock, median power, highest
    temperature, median and mean busy share (the share of the time a kernel ran), and every clock-event reason
    mask seen other than none (0x0) or idle (0x1)."""
    out = {}
    for index in sorted({r[1] for r in rows}):
        mine = [r for r in rows if r[1] == index and start <= r[0] <= end]
        if not mine:
            continue
        clocks, power, temp, busy = ([r[i] for r in mine if r[i] is not None] for i in (2, 3, 4, 5))
        out[str(index)] = {
            "samples": len(mine), "sm_mhz_median": stat(statistics.median, clocks), "sm_mhz_min": stat(min, clocks),
            "power_w_median": stat(statistics.median, power, 1), "temperature_c_max": stat(max, temp),
            "busy_pct_median": stat(statistics.median, busy), "busy_pct_mean": stat(statistics.mean, busy),
            "event_reasons": sorted({hex(r[6]) for r in mine if r[6] not in (None, 0, 1)})}
    return out
