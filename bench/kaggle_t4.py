#!/usr/bin/env python3
"""Kaggle's "GPU T4 x2" on a 2-GPU machine, and a converted script started as a Kaggle Script starts it.

The stand-in for the T4s: each GPU keeps only --gib of free memory (a ballast process holds the rest, so the script
sees what a T4 has: its own free-memory check and its allocations both meet the limit), no bfloat16 (the probe's
NBDDP_BENCH_FP16=1: the notebook's `dtype = None` picks float16), no NVLink peer-to-peer (NCCL_P2P_DISABLE=1), and
the whole job on 4 cores (taskset -c 0-3), as Kaggle's 4 vCPUs.

    source bench/gpu_env.sh --models llama31 --layers llama31=32 ... && \\
    python3 bench/kaggle_t4.py --script .gpurun/llama31-alpaca.py --gib 15 --runs self,one --out $OUT/t4.json
    # T4-class (8 SMs per process), 3 rounds, the one-process run checked against the whole GPU:
    python3 bench/kaggle_t4.py --script .gpurun/llama31-alpaca.py --gib 15 --runs one+whole,self --rounds 3 \\
        --sms 8 --skip 1 --env NBDDP_BENCH_ARGS=max_steps=5 --env NBDDP_BENCH_EXIT_AFTER_TRAIN=1 --out $OUT/t4.json

Runs (each `python script`, as a Kaggle Script runs it; the rate and peak memory come from the rank probe):
  self   the script as generated: it starts one process per GPU itself
  one    NBDDP_NPROC=1: one process on one GPU
  ddp    NBDDP_MODE=ddp: one process per GPU whatever the model needs (what the script did before it checked)
  split  NBDDP_MODE=split: one process, the model split over every GPU (the reference for the sharded mode, which
         `self` runs where the fit check picks it)
  onegpu NBDDP_NPROC=1 NBDDP_MODE=ddp: one process on GPU 0, whatever the fit check would choose (a reference where
         the model fits one GPU, e.g. a short-depth stand-in against the sharded mode asked for by --env NBDDP_MODE=shard)
  whole  NBDDP_NPROC=1 on GPU 1 with the whole GPU (no --sms share) and cores 4-7: the reference the share's
         losses must equal; `one+whole` runs both at once (separate GPUs and cores)
Several --gib values run the listed runs at each (e.g. 15 for the throughput, a lower one where the model fits only
split over both GPUs). --rounds K repeats the runs K times, the order rotated by one each round (--first-round
goes on from an earlier call); --deadline stops starting runs that would end past it.

T4-class compute (--sms N, bench/t4_class.py): every process of the job runs its kernels on N SMs of its GPU
(NVIDIA MPS's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, the daemon started here and stopped at the end; --share green
uses the rank probe's green context instead); the report then has "t4_class": true, the SM count and the share's
own matmul and copy figures on each GPU, measured first.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_notebooks as rn  # noqa: E402
import t4_class  # noqa: E402
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
RUNS = {"self": {}, "one": {"NBDDP_NPROC": "1"}, "ddp": {"NBDDP_MODE": "ddp"}, "split": {"NBDDP_MODE": "split"},
        "whole": {"NBDDP_NPROC": "1", "CUDA_VISIBLE_DEVICES": "1"}, "onegpu": {"NBDDP_NPROC": "1", "NBDDP_MODE": "ddp"}}
CORES = {"whole": "4-7"}  # every other run: 0-3, Kaggle's 4 vCPUs
T4 = {"NBDDP_BENCH_FP16": "1", "NCCL_P2P_DISABLE": "1"}


def ballast(gib):
    """A process that leaves `gib` GiB free on every GPU until it is stopped; returns it and the free memory."""
    proc = subprocess.Popen([sys.executable, "-c", BALLAST, str(gib)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("free GiB"):
        proc.kill()
        raise SystemExit(f"ballast failed: {line!r}")
    return proc, json.loads(line[len("free GiB "):])


def one(script, workdir, env, limit, cores="0-3"):
    """`taskset -c <cores> python script` in workdir, with the probe; its summary (run_notebooks) and its fit line."""
    os.makedirs(workdir, exist_ok=True)
    env = dict(env, NBDDP_BENCH_PROBE_DIR=os.path.join(workdir, "probe"), NBDDP_BENCH_SCRIPT=os.path.abspath(script))
    log = os.path.join(workdir, "run.log")
    started = time.time()
    rc, timed_out, wall = rn._run(["taskset", "-c", cores, sys.executable, os.path.abspath(script)], env, workdir,
                                  log, limit)
    world = 1 + sum(1 for name in os.listdir(os.path.join(workdir, "probe")) if name != "rank0.json") \
        if os.path.isdir(os.path.join(workdir, "probe")) else 1
    result = rn.summarize("python", rc, timed_out, wall, log, workdir, world)
    text = open(log, errors="replace").read()
    result["nbddp_lines"] = [line.strip() for line in text.splitlines() if line.startswith("nbddp: ")][:8]
    result["out_of_memory"] = "OutOfMemoryError" in text or "CUDA out of memory" in text
    result["phases"] = {r: dict(p.get("phases") or {}, process_start=round(p["started_at"] - started, 2))
                        for r, p in result["ranks"].items() if p.get("started_at")}
    # the Trainer's own losses, unrounded, where it saved a checkpoint (its trainer_state.json); the log's are rounded
    states = sorted(glob.glob(os.path.join(workdir, "**", "trainer_state.json"), recursive=True), key=os.path.getmtime)
    result["state_losses"] = [e["loss"] for e in json.load(open(states[-1]))["log_history"] if "loss" in e] \
        if states else []
    return result


def share_env(args, total):
    """The environment that holds a process to --sms SMs (none without --sms), and the whole-GPU one."""
    if not args.sms:
        return {}, {}
    if args.share == "green":
        return {"NBDDP_BENCH_GREEN_SMS": str(args.sms)}, {"NBDDP_BENCH_GREEN_SMS": ""}
    return ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": t4_class.mps_percent(args.sms, total)},
            {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"})


def record(name, gib, free, env, r, skip, started):
    rate = launch_rate(r, skip)
    return {"gib": float(gib), "free_gib": free, "run": name, "env": env,
            "world_size": r["world_size"], "returncode": r["returncode"],
            "out_of_memory": r["out_of_memory"], "nbddp_lines": r["nbddp_lines"],
            "losses": r["losses"], "state_losses": r["state_losses"], "adapter_dirs": r["adapter_dirs"],
            "peak_reserved_gib_per_gpu": {k: p.get("peak_reserved_gib_per_gpu") for k, p in r["ranks"].items()},
            "peak_allocated_gib": {k: p.get("peak_allocated_gib") for k, p in r["ranks"].items()},
            "green_sms": {k: p.get("green_sms") for k, p in r["ranks"].items() if p.get("green_sms")},
            "rate": rate, "errors": r["errors"][-3:], "wall_s": round(time.time() - started, 1),
            "script_wall_s": r["wall_s"], "phases": r["phases"]}


def summary(results):
    """Per round: self (and ddp) over one; each `whole` run's losses against the same round's `one`."""
    out = {}
    for key in sorted({(r["gib"], r.get("round", 0)) for r in results}):
        runs = {r["run"]: r for r in results if (r["gib"], r.get("round", 0)) == key}
        rate = {k: (v["rate"] or {}).get("samples_per_s") for k, v in runs.items()}
        row = {f"{k}_over_one": round(rate[k] / rate["one"], 3) for k in ("self", "ddp") if rate.get(k) and rate.get("one")}
        if rate.get("self") and rate.get("split"):
            row["self_over_split"] = round(rate["self"] / rate["split"], 3)
        wall = {k: v.get("script_wall_s") for k, v in runs.items()}  # `python script` from start to end
        row.update({f"one_wall_over_{k}": round(wall["one"] / wall[k], 3)
                    for k in ("self", "ddp") if wall.get(k) and wall.get("one")})
        if "whole" in runs and "one" in runs:
            a, b = runs["one"]["losses"], runs["whole"]["losses"]
            ok = len(a) == len(b) and a and all(map(math.isfinite, a + b))
            row["one_vs_whole_losses"] = {"one": a, "whole": b, "max_rel_diff": round(max(
                abs(x - y) / abs(y) for x, y in zip(a, b)), 5) if ok else None}
            row["one_over_whole_step_s"] = [(runs[k]["rate"] or {}).get("median_step_s") for k in ("one", "whole")]
        out[f"{key[0]:g}gib-round{key[1]}"] = row
    ratios = [row["self_over_one"] for row in out.values() if "self_over_one" in row]
    if ratios:
        out["self_over_one_median"] = statistics.median(ratios)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--script", required=True)
    parser.add_argument("--gib", default="15", help="free GiB left on each GPU; several: 15,6")
    parser.add_argument("--runs", default="self,one", help="for each --gib: " + ",".join(RUNS) + " (a+b at once); several: a/b")
    parser.add_argument("--rounds", type=int, default=1, help="the runs this many times, order rotated each round")
    parser.add_argument("--first-round", type=int, default=0, help="number of the first round (rotation goes on)")
    parser.add_argument("--sms", type=int, help="T4-class: each process on this many SMs of its GPU")
    parser.add_argument("--share", choices=("mps", "green"), default="mps", help="how --sms is held")
    parser.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the rate")
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--deadline", type=float, help="seconds from start: no run starts that would end past it")
    parser.add_argument("--env", action="append", help="K=V for every run (e.g. NBDDP_BENCH_ARGS=max_steps=20)")
    parser.add_argument("--work", default="/tmp/kaggle-t4")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    t0 = time.time()
    total = t4_class.total_sms() if args.sms else None
    report = {"machine": os.environ.get("BENCH_MACHINE"), "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "script": args.script, "t4_env": T4, "cores": "taskset -c 0-3", "env": rn.parse_env(args.env),
              "t4_class": bool(args.sms), "runs": []}
    mps = args.sms and args.share == "mps"
    if mps:
        os.environ.update(t4_class.mps_start())  # every child below is an MPS client
    try:
        share, whole = share_env(args, total)
        if args.sms:
            figures = t4_class.pair([(share, False), (share, False)])
            report.update(sms=args.sms, share=args.share, total_sms=total, share_env=share, reference=figures,
                          t4=t4_class.T4)
            print("reference:", json.dumps(figures), flush=True)
        env = rn.child_env({**T4, **share, **rn.parse_env(args.env)})
        gibs = args.gib.split(",")
        longest = 0.0
        for gib, runs in zip(gibs, args.runs.split("/") * len(gibs)):
            held, free = ballast(float(gib))
            try:
                names = runs.split(",")
                for rnd in range(args.first_round, args.first_round + args.rounds):
                    k = rnd % len(names)
                    for item in names[k:] + names[:k]:
                        if args.deadline and time.time() - t0 + 1.15 * longest > args.deadline:
                            print(f"deadline: {item} (round {rnd}) not started", flush=True)
                            continue
                        started = time.time()
                        threads, done = [], {}
                        for name in item.split("+"):
                            run_env = dict(env, **RUNS[name], **(whole if name == "whole" else {}))
                            work = os.path.join(args.work, f"{gib}-r{rnd}-{name}")
                            th = threading.Thread(target=lambda n=name, e=run_env, w=work: done.__setitem__(
                                n, one(args.script, w, e, args.timeout, CORES.get(n, "0-3"))))
                            threads.append(th)
                            th.start()
                            print(f"run {name} (round {rnd}) with {gib} GiB free per GPU", flush=True)
                        for th in threads:
                            th.join()
                        for name in item.split("+"):
                            res = dict(record(name, gib, free, RUNS[name], done[name], args.skip, started), round=rnd)
                            report["runs"].append(res)
                            print(json.dumps(res)[:700], flush=True)
                        longest = max(longest, time.time() - started)
                        report["summary"] = summary(report["runs"])
                        with open(args.out, "w") as fh:
                            json.dump(report, fh, indent=1)
            finally:
                held.kill()
                held.wait()
    finally:
        if mps:
            t4_class.mps_stop()
    report["summary"] = summary(report["runs"])
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)
    print(json.dumps(report["summary"])[:1500], flush=True)


if __name__ == "__main__":
    main()
