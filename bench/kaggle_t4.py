#!/usr/bin/env python3
"""Kaggle's "GPU T4 x2" on a 2-GPU machine, and a converted script started as a Kaggle Script starts it.

The stand-in for the T4s: each GPU keeps only --gib of free memory (a ballast process holds the rest, so the script
sees what a T4 has: its own free-memory check and its allocations both meet the limit), no bfloat16 (the probe's
NBDDP_BENCH_FP16=1: the notebook's `dtype = None` picks float16), no NVLink peer-to-peer (NCCL_P2P_DISABLE=1), and
the whole job on 4 cores (taskset -c 0-3), as Kaggle's 4 vCPUs.

    source bench/gpu_env.sh --models llama31 --layers llama31=32 ... && \\
    python3 bench/kaggle_t4.py --script .gpurun/llama31-alpaca.py --gib 15 --runs self,one --out $OUT/t4.json

Runs (each `python script`, as a Kaggle Script runs it; the rate and peak memory come from the rank probe):
  self   the script as generated: it starts one process per GPU itself
  one    NBDDP_NPROC=1: one process on one GPU
  ddp    NBDDP_MODE=ddp: one process per GPU whatever the model needs (what the script did before it checked)
Several --gib values run the listed runs at each (e.g. 15 for the throughput, a lower one where the model fits only
split over both GPUs).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_notebooks as rn  # noqa: E402
from scaling import launch_rate  # noqa: E402

BALLAST = """
import sys, time, torch
keep = float(sys.argv[1]) * 2**30
held = [torch.empty(int(torch.cuda.mem_get_info(d)[0] - keep), dtype=torch.uint8, device=d)
        for d in range(torch.cuda.device_count())]
print("free GiB", [round(torch.cuda.mem_get_info(d)[0] / 2**30, 2) for d in range(torch.cuda.device_count())],
      flush=True)
time.sleep(10 ** 6)
"""
RUNS = {"self": {}, "one": {"NBDDP_NPROC": "1"}, "ddp": {"NBDDP_MODE": "ddp"}}
T4 = {"NBDDP_BENCH_FP16": "1", "NCCL_P2P_DISABLE": "1"}


def ballast(gib):
    """A process that leaves `gib` GiB free on every GPU until it is stopped; returns it and the free memory."""
    proc = subprocess.Popen([sys.executable, "-c", BALLAST, str(gib)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("free GiB"):
        proc.kill()
        raise SystemExit(f"ballast failed: {line!r}")
    return proc, json.loads(line[len("free GiB "):])


def one(script, workdir, env, limit):
    """`taskset -c 0-3 python script` in workdir, with the probe; its summary (run_notebooks) and its fit line."""
    os.makedirs(workdir, exist_ok=True)
    env = dict(env, NBDDP_BENCH_PROBE_DIR=os.path.join(workdir, "probe"), NBDDP_BENCH_SCRIPT=os.path.abspath(script))
    log = os.path.join(workdir, "run.log")
    rc, timed_out, wall = rn._run(["taskset", "-c", "0-3", sys.executable, os.path.abspath(script)], env, workdir,
                                  log, limit)
    world = 1 + sum(1 for name in os.listdir(os.path.join(workdir, "probe")) if name != "rank0.json") \
        if os.path.isdir(os.path.join(workdir, "probe")) else 1
    result = rn.summarize("python", rc, timed_out, wall, log, workdir, world)
    text = open(log, errors="replace").read()
    result["nbddp_lines"] = [line.strip() for line in text.splitlines() if line.startswith("nbddp: ")][:8]
    result["out_of_memory"] = "OutOfMemoryError" in text or "CUDA out of memory" in text
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--script", required=True)
    parser.add_argument("--gib", default="15", help="free GiB left on each GPU; several: 15,6")
    parser.add_argument("--runs", default="self,one", help="for each --gib: " + ",".join(RUNS) + "; several: a/b")
    parser.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the rate")
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--env", action="append", help="K=V for every run (e.g. NBDDP_BENCH_ARGS=max_steps=20)")
    parser.add_argument("--work", default="/tmp/kaggle-t4")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    env = rn.child_env({**T4, **rn.parse_env(args.env)})
    results = []
    for gib, runs in zip(args.gib.split(","), args.runs.split("/") * len(args.gib.split(","))):
        held, free = ballast(float(gib))
        try:
            for name in runs.split(","):
                print(f"run {name} with {gib} GiB free per GPU", flush=True)
                started = time.time()
                r = one(args.script, os.path.join(args.work, f"{gib}-{name}"), dict(env, **RUNS[name]), args.timeout)
                rate = launch_rate(r, args.skip)
                results.append({"gib": float(gib), "free_gib": free, "run": name, "env": RUNS[name],
                                "world_size": r["world_size"], "returncode": r["returncode"],
                                "out_of_memory": r["out_of_memory"], "nbddp_lines": r["nbddp_lines"],
                                "losses": r["losses"][-3:], "adapter_dirs": r["adapter_dirs"],
                                "peak_reserved_gib_per_gpu": {k: p.get("peak_reserved_gib_per_gpu")
                                                              for k, p in r["ranks"].items()},
                                "rate": rate, "errors": r["errors"][-3:], "wall_s": round(time.time() - started, 1)})
                print(json.dumps(results[-1])[:600], flush=True)
        finally:
            held.kill()
            held.wait()
    report = {"machine": os.environ.get("BENCH_MACHINE"), "script": args.script, "t4_env": T4,
              "cores": "taskset -c 0-3", "runs": results}
    for gib in {r["gib"] for r in results}:
        rates = {r["run"]: (r["rate"] or {}).get("samples_per_s") for r in results if r["gib"] == gib}
        if rates.get("self") and rates.get("one"):
            report[f"self_over_one_at_{gib:g}_gib"] = round(rates["self"] / rates["one"], 3)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
