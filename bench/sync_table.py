#!/usr/bin/env python3
"""Where one optimizer step synchronised the host with the GPU: the probe's syncs-rank<R>.txt files
(NBDDP_BENCH_SYNC_DEBUG=A) counted by the frame that asked, the innermost one outside torch and the probe.

    python bench/sync_table.py pair0/*/probe/syncs-rank0.txt
"""
from __future__ import annotations

import collections
import re
import sys

FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
SKIP = ("site-packages/torch/", "rankprobe/", "/warnings.py")


def callers(text):
    """One 'package/file.py:line function' per synchronisation recorded in a syncs file."""
    out = []
    for block in text.split("\n-- "):
        if "called a synchronizing" not in block.split("\n", 1)[0]:
            continue  # torch's notice that the debug mode is on
        frames = [m for m in FRAME.finditer(block) if not any(s in m["file"] for s in SKIP)]
        if frames:
            last = frames[-1]
            out.append(f"{'/'.join(last['file'].split('/')[-2:])}:{last['line']} {last['func']}")
    return out


def main(paths):
    for path in paths:
        counts = collections.Counter(callers(open(path).read()))
        print(f"{path}: {sum(counts.values())} synchronisations")
        for where, n in counts.most_common():
            print(f"  {n:3d}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
