#!/usr/bin/env python3
"""Plot a scaling result (bench/scaling.py's JSON): samples/s per round and configuration, and each
configuration's ratio to the single-GPU run of the same round, with the median and the 1.9x goal. A merged file's
tags are dropped (ddp[c2] is plotted as ddp); --configs keeps only the named configurations.

    python bench/plot_scaling.py bench/results/scaling-2026-11-26-8b.json --configs ddp,two-singles \
        -o docs/scaling-2026-11-26-8b.png
--by-gpus plots against the number of GPUs instead: every launch of every round at its GPU count (a configuration
run on named GPUs, ddp@01, counts those; one without, the file's world_size), with N x the median 1-GPU rate.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import textwrap

import scaling  # bench/: a run's key and its GPU count


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


SHOWN = {"single": "1 GPU", "ddp": "nbddp DDP", "two-singles": "N independent 1-GPU processes",
         "plain-torchrun": "plain notebook under torchrun (Unsloth's path)"}


def gpus_used(name, world_size):
    """single -> 1; ddp@23 -> 2; ddp -> the file's world size."""
    config, _, count = scaling.label(name).partition("@")
    return 1 if config == "single" else int(count or world_size)


def plot_by_gpus(result, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    world = result.get("world_size") or 2
    rows = result.get("rounds") or []
    points = {}  # configuration -> [(gpus, samples/s, ratio to the round's single or None)]
    for row in rows:
        single = (row.get("single") or {}).get("samples_per_s")
        for name, run in row.items():
            rate = (run or {}).get("samples_per_s")
            if rate:
                points.setdefault(scaling.label(name).partition("@")[0], []).append((gpus_used(name, world), rate, rate / single if single else None))
    fig, (rate_ax, ratio_ax) = plt.subplots(1, 2, figsize=(10, 4.4))
    counts = sorted({g for pts in points.values() for g, _, _ in pts})
    if points.get("single"):
        one = statistics.median(r for _, r, _ in points["single"])
        rate_ax.plot(counts, [g * one for g in counts], color="grey", linestyle="--", label="N x median 1 GPU")
    ratio_ax.plot(counts, counts, color="grey", linestyle="--", label="N (perfect)")
    for n, (name, pts) in enumerate(points.items()):
        offset = (n - len(points) / 2) * 0.04  # side by side at each GPU count
        rate_ax.scatter([g + offset for g, _, _ in pts], [r for _, r, _ in pts], color=f"C{n}", label=SHOWN.get(name, name),
                        s=18)
        medians = [(g, statistics.median(x for h, _, x in pts if h == g and x)) for g in counts
                   if any(h == g and x for h, _, x in pts)]
        if medians and name != "single":
            ratio_ax.plot([g for g, _ in medians], [m for _, m in medians], marker="o", color=f"C{n}",
                          label=f"{SHOWN.get(name, name)}, median")
            ratio_ax.scatter([g + offset for g, _, x in pts if x], [x for _, _, x in pts if x], color=f"C{n}",
                             s=10, alpha=0.5)
    rate_ax.set(title="throughput, every launch", xlabel="GPUs", ylabel="samples/s", xticks=counts)
    ratio_ax.set(title="over the same round's 1-GPU run", xlabel="GPUs", ylabel="ratio", xticks=counts)
    for ax in (rate_ax, ratio_ax):
        ax.legend(fontsize=8)
    fig.suptitle(textwrap.fill(f"{result.get('model', '')} - {result.get('device', '')}", 130), fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--configs", help="comma-separated configurations to plot beside single (default: all)")
    ap.add_argument("--by-gpus", action="store_true", help="samples/s and ratio against the number of GPUs")
    args = ap.parse_args(argv)
    if args.by_gpus:
        plot_by_gpus(json.load(open(args.result)), args.out)
        return 0
    plot(json.load(open(args.result)), args.out, args.configs.split(",") if args.configs else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
