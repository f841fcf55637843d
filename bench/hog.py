#!/usr/bin/env python3
"""A busy core that times itself (issue 6: how fast is the host's core under a host-bound training?).

    python bench/hog.py FILE [COUNT]
times a fixed pure-Python loop over and over, one line per loop appended to FILE (the wall time at its end, its
seconds), until COUNT loops (0: until stopped). scaling.py runs it beside a launch (`single-hog`: is a training
slowed by another busy core?), as 1, 2, 4, 8 and 16 copies at once before the first round and after the last
(`host_load_s`: does a core run the loop slower while others are busy?), and in its own process pinned to each
vCPU in turn before and after every launch (`cpu_speeds`: do some vCPUs run it slower than others?).
"""
from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

import gpu_clocks

N = 200_000


def loop_s(n=N):
    """Seconds for one run of the fixed loop on this core."""
    return timeit.timeit(lambda: sum(i * i for i in range(n)), number=1)


def best_loop_s(repeats=5):
    """The fastest of `repeats` loops, rounded: the core's speed, with as little noise from the moment as may be."""
    return round(min(loop_s() for _ in range(repeats)), 5)


@contextlib.contextmanager
def running(copies, count=0):
    """`copies` hog processes for the duration of the block; yields a list that holds, after the block, each
    copy's loops as (end wall time, seconds) (COUNT loops each, or as many as it ran until the block ended)."""
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        files = [os.path.join(tmp, f"hog{i}.txt") for i in range(copies)]
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), f, str(count)]) for f in files]
        try:
            yield times
            if count:
                for p in procs:
                    p.wait()
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    p.wait()
            for f in files:
                with contextlib.suppress(OSError), open(f) as fh:
                    times.append([tuple(map(float, line.split())) for line in fh if line.strip()])


def summary(times, start=float("-inf"), end=float("inf")):
    """Over the loops that ended between `start` and `end` (wall times): per copy its median loop time, over the
    copies the median of those, and how many loops counted."""
    times = [[s for t, s in copy if start <= t <= end] for copy in times]
    medians = [statistics.median(t) for t in times if t]
    return {"loop_s_median": gpu_clocks.stat(statistics.median, medians, 5),
            "per_copy": [round(m, 5) for m in medians], "loops": sum(map(len, times))}


def cpu_speeds(repeats=5):
    """The fixed loop's time on each CPU this process may use, the fastest of `repeats` with the process pinned
    there (one CPU at a time, the others as they are): {cpu: seconds}. On a shared VM some vCPUs can run the same
    loop much slower than others at the same moment."""
    allowed = os.sched_getaffinity(0)
    speeds = {}
    try:
        for cpu in sorted(allowed):
            os.sched_setaffinity(0, {cpu})
            speeds[cpu] = best_loop_s(repeats)
    finally:
        os.sched_setaffinity(0, allowed)
    return speeds


def fastest_groups(speeds, groups, size):
    """`groups` disjoint sets of `size` CPUs, the fastest first: "a,b;c,d" as the probe's NBDDP_BENCH_CPUS takes
    it (rank by local rank). With fewer CPUs than that, smaller groups (and shared ones below 1 CPU a group)."""
    ranked = sorted(speeds, key=lambda cpu: (speeds[cpu], cpu))
    size = max(1, min(size, len(ranked) // groups))
    return ";".join(",".join(str(cpu) for cpu in sorted({ranked[(i * size + j) % len(ranked)] for j in range(size)}))
                    for i in range(groups))


def load_curve(levels=(1, 2, 4, 8, 16), count=60):
    """The fixed loop's median time per copy with 1, 2, 4, 8, 16 copies busy at once: a flat curve means a core's
    speed does not depend on how many others are busy."""
    curve = {}
    for copies in levels:
        with running(copies, count) as times:
            pass
        curve[str(copies)] = summary(times)
    return curve


def main(argv):
    out, count = argv[0], int(argv[1]) if len(argv) > 1 else 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    done = 0
    with open(out, "a") as fh:
        while not count or done < count:
            seconds = loop_s()
            fh.write(f"{time.time():.3f} {seconds:.5f}\n")
            fh.flush()
            done += 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
