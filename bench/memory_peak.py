#!/usr/bin/env python3
"""Where a run's peak GPU memory went: replays the allocator history the rank probe saved
(NBDDP_BENCH_MEMORY_HISTORY, memory-rank<R>.pickle.gz) and lists what was alive at the peak, by call site.

    python bench/memory_peak.py memory-rank0.pickle.gz [more.pickle.gz ...] [--top 20]

Counts only what was allocated after the history started (train start), so the model's weights are not in it;
the peak is the highest sum of those live blocks. A site is the innermost Python frame and the innermost one
outside torch. Then the segments the caching allocator reserved over the same window (what peak *reserved*
memory grows by), largest first."""
from __future__ import annotations

import argparse
import gzip
import pickle


def site(frames):
    """The innermost Python frame, and the innermost one outside torch itself when that is another."""
    frames = [f for f in frames if f.get("filename") != "??"]
    outside = [f for f in frames if "/torch/" not in f.get("filename", "")]
    picked = frames[:1] + [f for f in outside[:1] if f not in frames[:1]]
    return " <- ".join(f"{f.get('filename', '?').rsplit('/', 2)[-1]}:{f.get('line')} {f.get('name')}" for f in picked)


def peak(trace):
    """(peak bytes above the start, {addr: (size, frames)} alive then) over alloc / free_requested events."""
    live, now, top, at_top = {}, 0, 0, {}
    for ev in trace:
        if ev["action"] == "alloc":
            live[ev["addr"]] = (ev["size"], ev.get("frames", []))
            now += ev["size"]
            if now > top:
                top, at_top = now, dict(live)
        elif ev["action"] == "free_requested" and ev["addr"] in live:
            now -= live.pop(ev["addr"])[0]
    return top, at_top


def report(path, top_n):
    with gzip.open(path, "rb") as fh:
        snap = pickle.load(fh)
    lines = []
    for dev, trace in enumerate(snap.get("device_traces", [])):
        if not trace:
            continue
        top, alive = peak(trace)
        by_site = {}
        for size, frames in alive.values():
            key = site(frames)
            n, total = by_site.get(key, (0, 0))
            by_site[key] = (n + 1, total + size)
        lines.append(f"{path} device {dev}: {len(trace)} events, peak {top / 2**30:.3f} GiB above the start, "
                     f"{len(alive)} blocks alive then")
        for key, (n, total) in sorted(by_site.items(), key=lambda kv: -kv[1][1])[:top_n]:
            lines.append(f"  {total / 2**20:9.1f} MiB  {n:5d} blocks  {key}")
        new = [ev for ev in trace if ev["action"] in ("segment_alloc", "segment_map")]
        freed = sum(ev["size"] for ev in trace if ev["action"] in ("segment_free", "segment_unmap"))
        lines.append(f"  segments reserved in the window: {sum(ev['size'] for ev in new) / 2**20:.1f} MiB in "
                     f"{len(new)} segments, {freed / 2**20:.1f} MiB released; the largest:")
        for ev in sorted(new, key=lambda ev: -ev["size"])[:5]:
            lines.append(f"  {ev['size'] / 2**20:9.1f} MiB  segment      {site(ev.get('frames', []))}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshots", nargs="+")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args(argv)
    for path in args.snapshots:
        print(report(path, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
