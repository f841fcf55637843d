#!/usr/bin/env python3
"""Plot a scaling result (bench/scaling.py's JSON): samples/s per round and configuration, and each
configuration's ratio to the single-GPU run of the same round, with the median and the 1.9x goal. A merged file's
tags are dropped (ddp[c2] is plotted as ddp); --configs keeps only the named configurations.

    python bench/plot_scaling.py bench/results/scaling-2026-11-26-8b.json --configs ddp,two-singles \
        -o docs/scaling-2026-11-26-8b.png
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import textwrap


def rounds(result, configs=None):
    """[{name: samples/s}] per round, names without merge's tags; older files have only paired_runs (single, ddp)."""
    rows = result.get("rounds") or result["paired_runs"]
    keep = None if configs is None else {"single", *configs}
    return [{name.split("[")[0]: run["samples_per_s"] for name, run in row.items()
             if run and run.get("samples_per_s") and (keep is None or name.split("[")[0] in keep)}
            for row in rows]


def plot(result, out, configs=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rounds(result, configs)
    names = ["single"] + [n for n in dict.fromkeys(k for row in rows for k in row) if n != "single"]
    fig, (rate_ax, ratio_ax) = plt.subplots(1, 2, figsize=(10, 4.4))
    for n, name in enumerate(names):
        color = f"C{n}"  # one colour per configuration in both panels
        xs = [i for i, row in enumerate(rows) if name in row]
        rate_ax.plot(xs, [rows[i][name] for i in xs], marker="o", label=name, color=color)
        if name != "single":
            pairs = [i for i in xs if "single" in rows[i]]
            ratios = [rows[i][name] / rows[i]["single"] for i in pairs]
            ratio_ax.plot(pairs, ratios, marker="o", label=name, color=color)
            if ratios:
                median = statistics.median(ratios)
                ratio_ax.axhline(median, color=color, linestyle=":", label=f"{name} median {median:.2f}x")
    ratio_ax.axhline(1.9, color="grey", linestyle="--", label="goal 1.9x")
    rate_ax.set(title="steady-state throughput", xlabel="round", ylabel="samples/s")
    ratio_ax.set(title="2 GPUs / 1 GPU, same round", xlabel="round", ylabel="ratio")
    for ax in (rate_ax, ratio_ax):
        ax.legend(fontsize=8)
        ax.set_xticks(range(len(rows)))
    fig.suptitle(textwrap.fill(f"{result.get('model', '')} - {result.get('device', '')}", 130), fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--configs", help="comma-separated configurations to plot beside single (default: all)")
    args = ap.parse_args(argv)
    plot(json.load(open(args.result)), args.out, args.configs.split(",") if args.configs else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
