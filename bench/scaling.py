#!/usr/bin/env python3
"""Steady-state training throughput of one nbddp-converted notebook: 1 GPU against 2-GPU configurations.

On the GPU machine, after bench/offline_hub.py filled HF_HOME:
    python bench/scaling.py run --script .gpurun/llama31-alpaca.py --pairs 5 --deadline 400 --out $OUT/scaling.json
    python bench/scaling.py run --script ... --configs ddp,two-singles,plain-torchrun,dataparallel --pairs 5 ...
    python bench/scaling.py merge a.json=tag b.json --out merged.json
Each round launches `single` (CUDA_VISIBLE_DEVICES=0 python script) and every configuration in --configs, in an
order rotated from round to round (CONFIGS: the converted script under torchrun, alone on each GPU at once, or the
notebook as a plain script, bench/plain_script.py, which `run_notebooks.py convert` writes to plain/).
A configuration may name its GPUs (single: the 1-GPU run keeps its name on any GPU), and a launch may run several at once on disjoint GPUs of one machine:
    --configs single,ddp@01+two-singles@23,plain-torchrun@01+ddp@23,ddp,two-singles --nproc 4 --swap-halves
runs DDP on GPUs 0-1 while the script runs alone on GPUs 2 and 3 (same minutes, same host load: each part's rate
is also divided by its partner's), and so on; --swap-halves mirrors the GPU sets (and single's GPU) every other
round so that no configuration keeps one pair of GPUs.
bench/rankprobe times every optimizer step (a CUDA event at each step end, read after training: nothing waits for
the GPU) and ends each process when train() ends. The rate is the samples of the steps after --skip warm-up steps
over their wall time on rank 0's clock, counting each step's samples (batch per process, x GPUs under
DataParallel, x accumulation x world size), so runs with different global batches compare per sample. Peak
memory per rank is torch.cuda.max_memory_allocated/reserved at exit.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_notebooks as rn  # noqa: E402

# configuration -> environment added to the launch (NCCL_NVLS_ENABLE stays 0 in every one), which script (the
# converted one, or the notebook as a plain script) and how it starts (torchrun unless `launch` says otherwise)
CONFIGS = {
    "ddp": {"env": {"NBDDP_BATCH": "scale"}},  # each rank the notebook's batch: N times the samples a step
    "ddp-pcie": {"env": {"NBDDP_BATCH": "scale", "NCCL_P2P_DISABLE": "1"}},  # no NVLink peer-to-peer: Kaggle's T4s
    "ddp-keep-batch": {"env": {}},  # the script's default: the notebook's global batch, its accumulation divided
    # the converted script alone on each GPU, all at once, no communication: what the machine gives independent
    # trainings side by side (rate: the sum); DDP against it is the cost of DDP itself
    "two-singles": {"env": {}, "launch": "concurrent"},
    # what a user has today: the notebook as-is in one process seeing every GPU (the Trainer's DataParallel
    # path), and the same plain script under torchrun (Unsloth's documented DDP path)
    "dataparallel": {"env": {}, "script": "plain", "launch": "one-process"},
    "plain-torchrun": {"env": {}, "script": "plain"},
}

# configurations every other one is also compared with, round by round (ratios_to_<name>)
REFERENCES = ("two-singles", "plain-torchrun")


def _base(name):
    """A configuration's name without the tag that merge adds (ddp[c2] -> ddp)."""
    return name.split("[")[0]


def _stat(fn, values, digits=3):
    return round(fn(values), digits) if values else None


def steady_rate(run, skip):
    """samples/s over optimizer steps after `skip`, from rank 0's step-end times."""
    times = (run.get("step_end_times") or {}).get("0") or []
    batch = (run.get("batch") or {}).get("0") or {}
    if len(times) < skip + 3 or not batch.get("per_device_train_batch_size"):
        return None
    ranks = run.get("ranks", {})
    per_process = batch.get("train_batch_size") or batch["per_device_train_batch_size"]  # DataParallel: x GPUs
    per_step = per_process * batch["gradient_accumulation_steps"] * (batch["world_size"] or 1)
    window = times[skip:]
    steps = len(window) - 1  # steps skip+2..N, rank 0's clock; label tokens of the same steps on every rank
    seconds = window[-1] - window[0]
    tokens = [(p.get("step_tokens") or [])[skip + 1:skip + 1 + steps] for p in ranks.values()]
    imbalance = [max(step) * len(step) / sum(step) for step in zip(*tokens) if sum(step)] if len(tokens) > 1 else []
    rank0 = ranks.get("0", {})
    levers = {"args": rank0.get("bench_args"), "peft": rank0.get("bench_peft"),
              "ddp": [d["bench_ddp"] for d in rank0.get("ddp_constructed", []) if d.get("bench_ddp")]}
    return {"samples_per_s": round(per_step * steps / seconds, 3),
            "label_tokens_per_s": (round(sum(map(sum, tokens)) / seconds, 1)
                                   if tokens and all(len(t) == steps for t in tokens) else None),
            "label_token_imbalance": _stat(statistics.mean, imbalance, 4),  # busiest rank / mean rank, per step
            "losses": run.get("losses"), "samples_per_step": per_step, "steps_timed": steps,
            "median_step_s": round(statistics.median(b - a for a, b in zip(window, window[1:])), 4),
            "step_s": {r: [round(b - a, 4) for a, b in zip(t[skip:], t[skip + 1:])]
                       for r, t in (run.get("step_end_times") or {}).items() if t},
            "peak_allocated_gib": {r: p.get("peak_allocated_gib") for r, p in ranks.items()},
            "peak_reserved_gib": {r: p.get("peak_reserved_gib") for r, p in ranks.items()},
            "ddp_memory_gib": {r: [{k: d.get(k) for k in ("memory_before_gib", "memory_after_gib")}
                                   for d in p.get("ddp_constructed", [])] for r, p in ranks.items()},
            "levers_set": {k: v for k, v in levers.items() if v},
            "returncode": run.get("returncode"), "wall_s": run.get("wall_s")}


def launch_rate(r, skip):
    """steady_rate of one launch; of concurrent launches, their samples and label tokens per second summed, each
    GPU's peak memory under its index. A launch without a rate gives what it left instead (_failure)."""
    if "concurrent" not in r:
        return steady_rate(r, skip) or _failure(r)
    parts = [steady_rate(x, skip) for x in r["concurrent"]]
    if not all(parts):
        return _failure(r["concurrent"][parts.index(None)])
    tokens = [p["label_tokens_per_s"] for p in parts]
    rate = {"samples_per_s": round(sum(p["samples_per_s"] for p in parts), 3),
            "label_tokens_per_s": round(sum(tokens), 1) if all(tokens) else None,
            "median_step_s": [p["median_step_s"] for p in parts],
            "per_process": [{k: p[k] for k in ("samples_per_s", "median_step_s", "step_s")} for p in parts],
            "peak_allocated_gib": {str(i): p["peak_allocated_gib"].get("0") for i, p in enumerate(parts)},
            "peak_reserved_gib": {str(i): p["peak_reserved_gib"].get("0") for i, p in enumerate(parts)},
            "returncode": max(p["returncode"] or 0 for p in parts), "wall_s": max(p["wall_s"] or 0 for p in parts)}
    return dict(rate, **lockstep(rate))


def lockstep(rate):
    """For independent processes run at once (a concurrent launch's rate): what they would reach in lockstep, each
    step as long as the slowest process's step of the same index (DDP's pace with nothing else added), and N x the
    slowest process's own rate, both over their summed rate; each process's step-to-step variation (standard
    deviation over mean) and the correlation of every other process's step times with the first's."""
    procs = [p for p in rate.get("per_process", []) if p.get("step_s", {}).get("0")]
    if len(procs) < 2 or not rate.get("samples_per_s"):
        return {}
    steps = [p["step_s"]["0"] for p in procs]
    per_step = [p["samples_per_s"] * sum(s) / len(s) for p, s in zip(procs, steps)]
    n = min(map(len, steps))
    locked = sum(per_step) * n / sum(max(s[i] for s in steps) for i in range(n))
    def correlation(a, b):
        return round(statistics.correlation(a, b), 3) if statistics.pstdev(a) and statistics.pstdev(b) else None
    return {"lockstep_to_sum": round(locked / rate["samples_per_s"], 4),
            "slowest_x_n_to_sum": round(len(procs) * min(p["samples_per_s"] for p in procs) / rate["samples_per_s"], 4),
            "step_cv": [round(statistics.pstdev(s) / statistics.mean(s), 3) for s in steps],
            "step_correlation_to_first": [correlation(steps[0][:n], s[:n]) for s in steps[1:]]}


def _failure(r):
    """What a launch without a rate left (a rank stopped at the time limit keeps the steps it finished)."""
    return {"returncode": r["returncode"], "errors": r["errors"][-2:], "wall_s": r.get("wall_s"),
            "steps_seen": {k: len(v or []) for k, v in (r.get("step_end_times") or {}).items()}}


def parts(item, mirror=False, total=2):
    """A launch of --configs as [(key, configuration, GPUs or None)]: "ddp@01+two-singles@23" -> two parts run at
    once, "ddp" -> one on every GPU. mirror: each GPU g becomes (g + total/2) mod total."""
    out = []
    for part in item.split("+"):
        name, _, gpus = part.partition("@")
        if name != "single" and name not in CONFIGS:
            raise SystemExit(f"scaling.py: unknown configuration {name!r} (one of single, {', '.join(CONFIGS)})")
        gpus = gpus or ("0" if name == "single" else "")
        if mirror:
            gpus = "".join(str((int(g) + total // 2) % total) for g in gpus)
        out.append((f"{name}@{gpus}" if gpus and name != "single" else name, name, gpus or None))
    return out


def one(part, scripts, work, env, limit, nproc):
    """One part of a launch, (key, name, GPUs) as parts() gives it: `single` (the converted script on its GPU), or
    a configuration of CONFIGS on every GPU or on the GPUs named ("23")."""
    key, name, gpus = part
    workdir = os.path.join(work, key)
    subprocess.run(["rm", "-rf", workdir])
    log = os.path.join(work, f"{os.path.basename(work)}-{key}.log")
    if name == "single":
        return rn.launch(scripts["converted"], workdir, log, env, limit, nproc, gpu=int(gpus[0]))
    order = [int(g) for g in gpus] if gpus else list(range(nproc))
    nproc = len(order)
    config = CONFIGS[name]
    script = scripts[config.get("script", "converted")]
    env = dict(env, **config["env"], NCCL_NVLS_ENABLE="0")
    if config.get("launch") == "concurrent":
        def alone(gpu):
            return rn.launch(script, os.path.join(workdir, f"gpu{gpu}"), f"{log[:-len('.log')]}-gpu{gpu}.log",
                             env, limit, nproc, gpu=gpu)
        with concurrent.futures.ThreadPoolExecutor(nproc) as pool:
            return {"concurrent": list(pool.map(alone, order))}
    visible = ",".join(map(str, order))
    if config.get("launch") == "one-process":  # one process, every GPU visible
        return rn.launch(script, workdir, log, env, limit, nproc, gpu=visible)
    return rn.launch(script, workdir, log, env, limit, nproc, visible=visible if gpus else None)


def together(launch, scripts, work, env, limit, nproc, skip):
    """{key: rate} of one launch's parts, started at once (each part on its own GPUs); a part run beside others
    names them under `beside` and its rate over theirs under `to_beside`."""
    with concurrent.futures.ThreadPoolExecutor(len(launch)) as pool:
        runs = list(pool.map(lambda part: one(part, scripts, work, env, limit, nproc), launch))
    rates = {key: dict(launch_rate(r, skip), gpus=gpus or "all") for (key, _, gpus), r in zip(launch, runs)}
    if len(launch) > 1:
        for key, rate in rates.items():
            others = {k: v.get("samples_per_s") for k, v in rates.items() if k != key}
            rate["beside"] = list(others)
            rate["to_beside"] = {k: round(rate["samples_per_s"] / v, 4) for k, v in others.items()
                                 if v and rate.get("samples_per_s")}
    return rates


def run(args):
    t0 = time.time()
    # training only: the probe ends each process when train() ends (generation and saving are not timed)
    env = rn.child_env(dict(rn.parse_env(args.env), NBDDP_BENCH_EXIT_AFTER_TRAIN="1"))
    scripts = {"converted": os.path.abspath(args.script),
               "plain": os.path.abspath(args.plain_script or os.path.join(os.path.dirname(args.script), "plain",
                                                                          os.path.basename(args.script)))}
    names = args.configs.split(",")
    names = names if "single" in names else ["single"] + names
    pairs, notes, hub = [], [], stand_ins()
    for i in range(args.first_round, args.first_round + args.pairs):
        pair, work = {}, os.path.join(args.work, f"pair{i}")
        os.makedirs(work, exist_ok=True)
        for item in names[i % len(names):] + names[:i % len(names)]:  # rotate which goes first
            if time.time() - t0 + args.run_estimate > args.deadline:
                notes.append(f"round {i} stopped before {item}: time budget of the call")
                break
            launch = parts(item, mirror=args.swap_halves and i % 2 == 1, total=args.nproc)
            pair.update(together(launch, scripts, work, env, args.timeout, args.nproc, args.skip))
            write(args, pairs + [pair], notes, hub)  # a call cut off mid-round keeps the launches it finished
        if pair:
            pairs.append(pair)
            print(f"round {i}: " + json.dumps({k: v.get("samples_per_s", v.get("errors")) for k, v in pair.items()}),
                  flush=True)
        if notes:  # only a stop for time writes a note
            break
    write(args, pairs, notes, hub)
    if args.artifacts:  # every launch's log and the probe's files
        with tarfile.open(args.artifacts, "w:gz") as tar:
            for f in sorted(glob.glob(os.path.join(args.work, "pair*", "**", "*"), recursive=True)):
                if f.endswith((".log", ".json")):
                    tar.add(f, arcname=os.path.relpath(f, args.work))
    return 0


def summary(pairs, name):
    """Ratios of one configuration to the single run of the same round (samples/s, label tokens/s) and to the
    REFERENCES of the same round on as many GPUs, and peak memory growth per rank over the single run (allocated, reserved)."""
    ratios, token_ratios, growth = [], [], {"peak_allocated_gib": [], "peak_reserved_gib": []}
    to_ref = {ref: [] for ref in REFERENCES}
    size = label(name).partition("@")[2]  # a reference counts only on as many GPUs: ddp@01 -> two-singles@23
    for p in pairs:
        single, run = p.get("single", {}), p.get(name, {})
        for ref, found in to_ref.items():
            other = next((r for key, r in p.items() if label(key) == (f"{ref}@{size}" if size else ref)), {})
            if run.get("samples_per_s") and other.get("samples_per_s") and run is not other:
                found.append(run["samples_per_s"] / other["samples_per_s"])
        if run.get("samples_per_s") and single.get("samples_per_s"):
            ratios.append(run["samples_per_s"] / single["samples_per_s"])
            if run.get("label_tokens_per_s") and single.get("label_tokens_per_s"):
                token_ratios.append(run["label_tokens_per_s"] / single["label_tokens_per_s"])
            for key, grown in growth.items():
                base = (single.get(key) or {}).get("0")
                grown += [peak / base - 1 for peak in (run.get(key) or {}).values() if base and peak]
    return {"ratios": [round(r, 3) for r in ratios], "median_ratio": _stat(statistics.median, ratios),
            "min_ratio": _stat(min, ratios), "token_ratios": [round(r, 3) for r in token_ratios],
            "median_token_ratio": _stat(statistics.median, token_ratios),
            "max_peak_allocated_growth": _stat(max, growth["peak_allocated_gib"], 4),
            "max_peak_reserved_growth": _stat(max, growth["peak_reserved_gib"], 4),
            **{f"ratios_to_{ref.replace('-', '_')}": [round(r, 3) for r in found]
               for ref, found in to_ref.items() if found}}


def label(key):
    """A run's key without its GPU set, with their number: ddp@23 -> ddp@2 (ddp on 2 of the machine's GPUs)."""
    name, _, gpus = _base(key).partition("@")
    return f"{name}@{len(gpus)}" if gpus else name


def on_gpu_sets(pairs):
    """Runs that named their GPUs, grouped by label: each rate over the same round's single run, and over the
    rate of each part that ran beside it in the same launch (by that part's label)."""
    out = {}
    for p in pairs:
        single = (p.get("single") or {}).get("samples_per_s")
        for key, run in p.items():
            rate = run.get("samples_per_s")
            if "@" not in key or not rate:
                continue
            entry = out.setdefault(label(key), {"to_single": [], "to_beside": {}})
            if single:
                entry["to_single"].append(round(rate / single, 3))
            for other, ratio in run.get("to_beside", {}).items():
                entry["to_beside"].setdefault(label(other), []).append(ratio)
    for entry in out.values():
        entry["median_to_single"] = _stat(statistics.median, entry["to_single"])
        entry["median_to_beside"] = {k: _stat(statistics.median, v, 4) for k, v in entry["to_beside"].items()}
    return out


def lockstep_summary(pairs):
    """Per label of the concurrent launches: every launch's lockstep() figures pooled, and their medians."""
    fields = ("lockstep_to_sum", "slowest_x_n_to_sum", "step_cv", "step_correlation_to_first")
    out = {}
    for p in pairs:
        for key, run in p.items():
            if "lockstep_to_sum" in run:
                entry = out.setdefault(label(key), {k: [] for k in fields})
                for k in fields:
                    entry[k] += [x for x in (run[k] if isinstance(run[k], list) else [run[k]]) if x is not None]
    return {k: dict(v, **{f"median_{m}": _stat(statistics.median, v[m], 4) for m in fields}) for k, v in out.items()}


def stand_ins():
    """The offline hub's report of the models it built (family -> repo ids, layers), where HF_HOME has one."""
    path = os.path.join(os.environ.get("HF_HOME", ""), "offline_hub.json")
    return json.load(open(path)).get("models") if os.environ.get("HF_HOME") and os.path.exists(path) else None


def write(args, pairs, notes, hub=None):
    launches = args.configs.split(",")
    used = {name for item in launches for _, name, _ in parts(item)}
    configs = [c for c in launches if c != "single" and "@" not in c]
    by_config = {name: summary(pairs, name) for name in configs}
    first = by_config[configs[0]] if configs else {}
    out = {"device": args.machine, "model": args.model, "full_depth": args.full_depth, "stand_ins": hub,
           "script": os.path.basename(args.script),
           "world_size": args.nproc, "paired_runs": [{"single": p.get("single"), "ddp": p.get(configs[0])}
                                                      for p in pairs] if configs else [],
           "median_ratio": first.get("median_ratio"), "ratios": first.get("ratios"), "configs": by_config,
           "on_gpu_sets": on_gpu_sets(pairs), "lockstep": lockstep_summary(pairs), "rounds": pairs, "notes": notes,
           "settings": {"skip_steps": args.skip, "launches": launches, "swap_halves": args.swap_halves,
                        "first_round": args.first_round,
                        "configs": {c: CONFIGS[c] for c in CONFIGS if c in used},
                        "env": rn.parse_env(args.env),
                        "timing": "rank 0's optimizer-step ends: CUDA events read after training"},
           "commit": args.commit}
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)


def merge(args):
    """One file from several calls' results: their rounds in order, each file's configurations renamed NAME[TAG]
    where the file is given as FILE=TAG; `ddp_pooled` (and `median_ratio`, `ratios`) summarises every configuration
    named ddp or ddp[...] together (NVLink, the generated defaults), `configs` each name as it stands."""
    rows, sources, first = [], [], None
    for item in args.files:
        path, _, tag = item.partition("=")
        result = json.load(open(path))
        first = first or result
        sources.append({"file": os.path.basename(path), "tag": tag, "device": result.get("device"),
                        "full_depth": result.get("full_depth"),
                        "commit": result.get("commit"), "notes": result.get("notes")})
        for row in result["rounds"]:
            row = {name: dict(run, **lockstep(run)) for name, run in row.items()}  # files older than lockstep()
            rows.append({(name if name == "single" or not tag else f"{name}[{tag}]"): run for name, run in row.items()})
    names = list(dict.fromkeys(n for row in rows for n in row if n != "single"))
    pooled = [{"single": row.get("single"), "ddp": run, "config": name} for row in rows
              for name, run in row.items() if _base(name) == "ddp"]
    ddp = summary([{("ddp" if _base(k) == "ddp" else k): v for k, v in row.items()} for row in rows], "ddp")
    out = {"device": args.machine or first.get("device"), "model": first.get("model"),
           "full_depth": all(s.get("full_depth") for s in sources),
           "world_size": first.get("world_size"), "paired_runs": pooled,
           "median_ratio": ddp["median_ratio"], "min_ratio": ddp["min_ratio"], "ratios": ddp["ratios"],
           "ddp_pooled": ddp, "configs": {name: summary(rows, name) for name in names},
           "on_gpu_sets": on_gpu_sets(rows), "lockstep": lockstep_summary(rows), "rounds": rows,
           "sources": sources, "settings": first.get("settings")}
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--script", default=".gpurun/llama31-alpaca.py")
    r.add_argument("--plain-script", default="", help="for dataparallel / plain-torchrun (default: plain/ beside "
                                                        "--script, as run_notebooks.py convert writes it)")
    r.add_argument("--out", required=True)
    r.add_argument("--work", default="/tmp/scaling")
    r.add_argument("--pairs", type=int, default=5, help="rounds: each runs single and every launch of --configs once")
    r.add_argument("--configs", default="ddp", help=f"configurations, comma-separated: {', '.join(CONFIGS)}")
    r.add_argument("--skip", type=int, default=15, help="warm-up optimizer steps left out of the rate")
    r.add_argument("--deadline", type=int, default=400, help="no launch starts that would end after this (s); a "
                   "round cut short keeps the launches it ran")
    r.add_argument("--first-round", type=int, default=0, help="number of the first round (rotation and "
                   "--swap-halves go on from an earlier call's rounds)")
    r.add_argument("--run-estimate", type=int, default=60, help="seconds one launch is expected to take")
    r.add_argument("--timeout", type=int, default=150, help="seconds before a launch is stopped")
    r.add_argument("--nproc", type=int, default=2, help="GPUs: processes of a configuration that names none")
    r.add_argument("--swap-halves", action="store_true",
                   help="every other round, GPU g of a configuration's GPU set becomes g + nproc/2 (mod nproc)")
    r.add_argument("--env", action="append", metavar="K=V", help="for every launch, e.g. "
                   "NBDDP_BENCH_ARGS=max_steps=40 (bench/rankprobe's levers)")
    r.add_argument("--artifacts", default="", help="tar.gz of every launch's log and probe files")
    r.add_argument("--machine", default=os.environ.get("BENCH_MACHINE", ""))
    r.add_argument("--model", default="")
    r.add_argument("--full-depth", action="store_true", help="the stand-in has the real model's depth (recorded)")
    r.add_argument("--commit", default=os.environ.get("BENCH_COMMIT", ""))
    m = sub.add_parser("merge", help="one result from several calls' files")
    m.add_argument("files", nargs="+", metavar="FILE[=TAG]")
    m.add_argument("--out", required=True)
    m.add_argument("--machine", default="")
    args = ap.parse_args(argv)
    return run(args) if args.cmd == "run" else merge(args)


if __name__ == "__main__":
    sys.exit(main())
