#!/usr/bin/env python3
"""Steady-state training throughput, 1 GPU vs 2 GPUs, of one nbddp-converted notebook (issue 6).

On the GPU machine, after bench/offline_hub.py filled HF_HOME (reduced-size random-weight model):
    python bench/scaling.py run --script .gpurun/llama31-alpaca.py --pairs 5 --deadline 400 --out $OUT/scaling.json
    python bench/scaling.py run --script ... --configs ddp,ddp-pcie,dataparallel,plain-torchrun --pairs 5 ...
    python bench/scaling.py merge a.json=tag b.json --out merged.json
Each round launches single (CUDA_VISIBLE_DEVICES=0 python script) and every 2-GPU configuration in CONFIGS, in an
order rotated from round to round: the converted script under torchrun with the configuration's environment, or
the baselines, the notebook as a plain script (bench/plain_script.py, `run_notebooks.py convert` writes it to
plain/) in one process seeing both GPUs or under torchrun. bench/rankprobe times every optimizer step (a CUDA
event at each step end, read after training: nothing waits for the GPU) and ends each process when train() ends;
the rate is the samples of the steps after --skip warm-up steps over their wall time, rank 0's clock, counting
each step's samples (batch per process, x GPUs under DataParallel, x accumulation x world size), so runs with
different global batches compare per sample.
Peak memory per rank comes from torch.cuda.max_memory_allocated/reserved at exit.
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
import gpu_clocks  # noqa: E402
import hog  # noqa: E402
import run_notebooks as rn  # noqa: E402

def _lever(name, env):
    """A lever under test, each against its own 1-GPU run: ddp-NAME under torchrun, single-NAME on GPU 0."""
    return {f"ddp-{name}": {"env": env}, f"single-{name}": {"env": env, "launch": "one-process", "gpus": "0"}}


def _base(name):
    """A configuration's name without the tag that merge adds (ddp[c2] -> ddp)."""
    return name.split("[")[0]


# 2-GPU configurations: name -> environment added to the launch (NCCL_NVLS_ENABLE stays 0 in every one), which
# script (the nbddp-converted one, or the notebook as a plain script: bench/plain_script.py) and how it starts
CONFIGS = {
    "ddp": {"env": {}},
    "ddp-pcie": {"env": {"NCCL_P2P_DISABLE": "1"}},  # no NVLink peer-to-peer: a stand-in for Kaggle's two T4s
    "ddp-keep-batch": {"env": {"NBDDP_KEEP_GLOBAL_BATCH": "1"}},  # the notebook's global batch in half the steps
    # the baselines a user has today: the notebook run as-is in one process seeing both GPUs (the Trainer's
    # DataParallel path), and the same plain script under torchrun (Unsloth's documented DDP path)
    "dataparallel": {"env": {}, "script": "plain", "launch": "one-process"},
    "plain-torchrun": {"env": {}, "script": "plain"},
    # levers, one at a time, set from outside the generated script (bench/rankprobe) until one is measured to help
    "ddp-numa": {"env": {}, "torchrun": ["--numa-binding=node"]},  # each rank on the CPUs near its GPU
    "ddp-omp8": {"env": {"OMP_NUM_THREADS": "8"}},  # torchrun's default is 1 thread per rank
    "ddp-bucket-view": {"env": {"NBDDP_BENCH_DDP": "gradient_as_bucket_view=True"}},
    "ddp-bucket5": {"env": {"NBDDP_BENCH_ARGS": "ddp_bucket_cap_mb=5"}},  # smaller buckets: earlier all-reduces
    "ddp-workers2": {"env": {"NBDDP_BENCH_ARGS": "dataloader_num_workers=2"}},
    "ddp-nopin": {"env": {"NBDDP_BENCH_ARGS": "dataloader_pin_memory=False"}},  # the Trainer pins by default
    "ddp-by-length": {"env": {"NBDDP_BENCH_ARGS": "train_sampling_strategy=group_by_length"}},  # changes order
    "ddp-expandable": {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}},  # reserved memory
    "ddp-drawn": {"env": {"NBDDP_BALANCE_LENGTHS": "0"}},  # without length-balanced ranks (on by default)
    # gradient checkpointing kept on the GPU (Unsloth's "unsloth" mode offloads activations to host memory) or off
    **_lever("gc-gpu", {"NBDDP_BENCH_PEFT": "use_gradient_checkpointing=True"}),
    **_lever("gc-off", {"NBDDP_BENCH_PEFT": "use_gradient_checkpointing=False"}),
    # host synchronisations per step: the Trainer's loss/grad-norm log every 10 steps instead of every step
    # (the notebooks log every step), and Unsloth's gathered token count left rank-local (changes the loss's
    # divisor when ranks' label tokens differ: a diagnostic of what the count's gather and read-back cost)
    **_lever("log10", {"NBDDP_BENCH_ARGS": "logging_steps=10"}),
    "ddp-local-count": {"env": {"NBDDP_BENCH_ARGS": "average_tokens_across_devices=False"}},
    "ddp-excl": {"env": {}, "torchrun": ["--numa-binding=exclusive"]},  # each rank its own half of the cores
    # the probe's timing before the sixth session: CUDA synchronised at every step end
    **_lever("stepsync", {"NBDDP_BENCH_STEP_SYNC": "1"}),
    **_lever("padded", {"UNSLOTH_PADDING_CHOICE": "padded"}),  # padded batches + Unsloth's block compile
    # one independent 1-GPU process per GPU, both at once, no communication: what the machine gives two host-bound
    # trainings side by side; its rate is the sum of the two
    "two-singles": {"env": {}, "launch": "concurrent"},
    # the 1-GPU run with one more busy core beside it (bench/hog.py, a pure-Python loop that touches no GPU and
    # little memory): slowed like two-singles, the machine's cores slow each other; not slowed, the two trainings
    # share something else (host memory traffic, PCIe)
    "single-hog": {"env": {}, "launch": "one-process", "gpus": "0", "hogs": 1},
    # each process pinned to the 4 vCPUs that ran bench/hog.py's loop fastest just before the launch (the probe's
    # NBDDP_BENCH_CPUS): whether a host-bound training runs at the speed of the vCPUs it lands on
    "ddp-fast-cpus": {"env": {}, "pin": 4},
    "single-fast-cpus": {"env": {}, "launch": "one-process", "gpus": "0", "pin": 4},
    # one process under torchrun (OMP_NUM_THREADS=1 as torchrun sets it for 2): Unsloth's distributed code
    # paths and the launcher without a second rank
    "torchrun-1proc": {"env": {"OMP_NUM_THREADS": "1"}, "nproc": 1},
}


# configurations every other one is also compared with, round by round (ratios_to_<name>): two GPUs with no
# communication at all (the cost of DDP itself), and Unsloth's documented torchrun path (what nbddp adds to it)
REFERENCES = ("two-singles", "plain-torchrun")


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
    tokens = [(p.get("step_tokens") or [])[skip + 1:skip + 1 + steps] for p in ranks.values()]
    levers = {"args": ranks.get("0", {}).get("bench_args"),
              "ddp": [d["bench_ddp"] for d in ranks.get("0", {}).get("ddp_constructed", []) if d.get("bench_ddp")],
              "peft": ranks.get("0", {}).get("bench_peft")}
    imbalance = [max(step) * len(step) / sum(step) for step in zip(*tokens) if sum(step)] if len(tokens) > 1 else []
    return {"samples_per_s": round(per_step * (len(window) - 1) / (window[-1] - window[0]), 3),
            "label_tokens_per_s": (round(sum(map(sum, tokens)) / (window[-1] - window[0]), 1)
                                   if tokens and all(len(t) == steps for t in tokens) else None),
            # busiest rank / mean rank, per step
            "label_token_imbalance": gpu_clocks.stat(statistics.mean, imbalance, 4),
            "losses": run.get("losses"),
            "samples_per_step": per_step, "steps_timed": len(window) - 1,
            "median_step_s": round(statistics.median(b - a for a, b in zip(window, window[1:])), 4),
            "step_s": [round(b - a, 4) for a, b in zip(window, window[1:])],
            "peak_allocated_gib": {r: p.get("peak_allocated_gib") for r, p in ranks.items()},
            "peak_reserved_gib": {r: p.get("peak_reserved_gib") for r, p in ranks.items()},
            "peak_set_at_step": {r: _peak_step(p.get("step_memory_gib")) for r, p in ranks.items()},
            "ddp_memory_gib": {r: [{k: d.get(k) for k in ("memory_before_gib", "memory_after_gib")}
                                   for d in p.get("ddp_constructed", [])] for r, p in ranks.items()},
            "levers_set": {k: v for k, v in levers.items() if v},
            "host_per_step": {r: _host_per_step(p, skip) for r, p in ranks.items() if p.get("step_thread_cpu_s")},
            "gpu_clocks": _gpu_clocks(run, window), "hog": _hog(run, window),
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
    return {"samples_per_s": round(sum(p["samples_per_s"] for p in parts), 3),
            "label_tokens_per_s": round(sum(tokens), 1) if all(tokens) else None,
            "median_step_s": [p["median_step_s"] for p in parts],
            "per_process": [{k: p[k] for k in ("samples_per_s", "median_step_s", "step_s", "host_per_step",
                                                "gpu_clocks")} for p in parts],
            "peak_allocated_gib": {str(i): p["peak_allocated_gib"].get("0") for i, p in enumerate(parts)},
            "peak_reserved_gib": {str(i): p["peak_reserved_gib"].get("0") for i, p in enumerate(parts)},
            "returncode": max(p["returncode"] or 0 for p in parts), "wall_s": max(p["wall_s"] or 0 for p in parts)}


def _failure(r):
    """What a launch without a rate left."""
    return {"returncode": r["returncode"], "errors": r["errors"][-2:], "wall_s": r.get("wall_s"),
            "steps_seen": {k: len(v or []) for k, v in (r.get("step_end_times") or {}).items()}}


def _gpu_clocks(run, window):
    """The GPU samples taken during the launch (gpu_clocks.Sampler), over its timed steps. Each GPU's mean busy
    share times the mean step is `busy_s_per_step`: the seconds of a step in which a kernel ran; the rest of the
    step the GPU waited."""
    span = _wall_span(run, window)
    if span is None or not run.get("gpu_samples"):
        return None
    out = gpu_clocks.summary(run["gpu_samples"], *span)
    step = (window[-1] - window[0]) / (len(window) - 1)
    for gpu in out.values():
        gpu["busy_s_per_step"] = None if gpu["busy_pct_mean"] is None else round(gpu["busy_pct_mean"] / 100 * step, 4)
    return out


def _hog(run, window):
    """The busy core's loop (bench/hog.py) beside the launch, over its timed steps (configurations with hogs)."""
    span = _wall_span(run, window)
    return hog.summary(run["hog_samples"], *span) if span and run.get("hog_samples") else None


def _wall_span(run, window):
    """The timed steps' first and last end as wall times: rank 0's step ends are on a clock whose zero the probe
    recorded as wall time (None where it did not)."""
    origin = ((run.get("ranks") or {}).get("0") or {}).get("clock_origin_epoch")
    return None if origin is None else (origin + window[0], origin + window[-1])


def _host_per_step(probe, skip):
    """Over the timed steps of one rank: the training thread's median CPU seconds and involuntary context switches
    per step, the CPUs it ran on at step ends, and the whole process's two medians (probes since the seventh
    session's runs; None before)."""
    def median_step(key):
        values = (probe.get(key) or [])[skip:]
        return gpu_clocks.stat(statistics.median, [b - a for a, b in zip(values, values[1:])], 4)
    return {"thread_cpu_s": median_step("step_thread_cpu_s"),
            "involuntary_switches": median_step("step_involuntary_switches"),
            "cpus": sorted({c for c in (probe.get("step_cpu") or [])[skip:] if c is not None}),
            "process_cpu_s": median_step("step_process_cpu_s"),
            "process_involuntary_switches": median_step("step_process_involuntary_switches")}


def _peak_step(memory):
    """1-based optimizer step whose end first showed the run's training peak (probe: (allocated, peak) per step)."""
    if not memory:
        return None
    top = memory[-1][1]
    return next(i + 1 for i, (_, peak) in enumerate(memory) if peak >= top)


def host_cpu_times():
    """The machine's CPU time counters (/proc/stat, all CPUs), or None where there are none."""
    try:
        with open("/proc/stat") as fh:
            return [int(v) for v in fh.readline().split()[1:9]]
    except (OSError, ValueError):
        return None


def host_cpu_share(before, after):
    """Over one launch: % of the CPUs' time busy (user..softirq) and % stolen by the hypervisor for other guests."""
    if not before or not after:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (b - a for a, b in zip(before, after))
    total = user + nice + system + idle + iowait + irq + softirq + steal
    return {"busy_pct": round(100 * (user + nice + system + irq + softirq) / total, 1),
            "steal_pct": round(100 * steal / total, 2), "cpus": os.cpu_count()} if total else None


def one(name, scripts, work, env, limit, nproc):
    """One launch: `single` (the converted script on GPU 0), or a 2-GPU configuration; the GPUs sampled while it
    runs (gpu_clocks: each launch's own CSV beside its log, the samples handed to steady_rate)."""
    os.makedirs(work, exist_ok=True)
    samples = os.path.join(work, f"{os.path.basename(work)}-{name}-gpus.csv")
    with gpu_clocks.Sampler(samples), hog.running(CONFIGS.get(name, {}).get("hogs", 0)) as hog_times:
        r = _launch(name, scripts, work, env, limit, nproc)
    rows = gpu_clocks.read(samples)
    for part in r.get("concurrent", [r]):
        part["gpu_samples"] = rows
        part["hog_samples"] = hog_times
    return r


def _launch(name, scripts, work, env, limit, nproc):
    workdir = os.path.join(work, name)
    subprocess.run(["rm", "-rf", workdir])
    log = os.path.join(work, f"{os.path.basename(work)}-{name}.log")
    if name == "single":
        return rn.launch(scripts["converted"], workdir, log, env, limit, nproc, gpu=0)
    config = CONFIGS[name]
    script = scripts[config.get("script", "converted")]
    env = dict(env, **_joined(env, config["env"]), NCCL_NVLS_ENABLE="0")
    if config.get("launch") == "concurrent":  # the converted script alone on each GPU, all at once
        def alone(gpu):
            return rn.launch(script, os.path.join(workdir, f"gpu{gpu}"), f"{log[:-len('.log')]}-gpu{gpu}.log",
                             env, limit, nproc, gpu=gpu)
        with concurrent.futures.ThreadPoolExecutor(nproc) as pool:
            return {"concurrent": list(pool.map(alone, range(nproc)))}
    if config.get("launch") == "one-process":  # one process, every GPU visible (or the config's)
        gpus = config.get("gpus", ",".join(str(g) for g in range(nproc)))
        return rn.launch(script, workdir, log, env, limit, nproc, gpu=gpus)
    return rn.launch(script, workdir, log, env, limit, config.get("nproc", nproc),
                     torchrun_args=config.get("torchrun", ()))


def _pinned(name, speeds, nproc):
    """For a configuration that pins its processes: NBDDP_BENCH_CPUS, the fastest vCPUs of the map just taken."""
    config = CONFIGS.get(name, {})
    if not config.get("pin"):
        return {}
    groups = 1 if config.get("launch") == "one-process" else config.get("nproc", nproc)
    return {"NBDDP_BENCH_CPUS": hog.fastest_groups(speeds, groups, config["pin"])}


def _joined(env, extra):
    """The configuration's environment; its NBDDP_BENCH_* k=v lists added to the call's (--env) instead of
    replacing them, so a lever keeps the call's max_steps."""
    return {k: (f"{env[k]},{v}" if k.startswith("NBDDP_BENCH_") and "=" in v and env.get(k) else v)
            for k, v in extra.items()}


def run(args):
    t0 = time.time()
    # training only: the probe ends each process when train() ends (generation and saving are not timed)
    env = rn.child_env(dict(rn.parse_env(args.env), NBDDP_BENCH_EXIT_AFTER_TRAIN="1"))
    scripts = {"converted": os.path.abspath(args.script),
               "plain": os.path.abspath(args.plain_script or os.path.join(os.path.dirname(args.script), "plain",
                                                                          os.path.basename(args.script)))}
    names = ["single"] + args.configs.split(",")
    pairs, notes = [], []
    levels = [int(n) for n in args.host_load.split(",") if n]  # a core's speed with 1..16 busy, before and after
    host_load = {"before": hog.load_curve(levels)} if levels else None
    for i in range(args.pairs):
        if time.time() - t0 + len(names) * args.run_estimate > args.deadline:
            notes.append(f"stopped after {i} rounds: time budget of the call")
            break
        pair, work = {}, os.path.join(args.work, f"pair{i}")
        for name in names[i % len(names):] + names[:i % len(names)]:  # rotate which goes first
            # the host's one-core speed around each launch, unpinned (host_loop_s) and on each vCPU (cpu_loop_s)
            before, loop, speeds = host_cpu_times(), hog.best_loop_s(), hog.cpu_speeds()
            pinned = _pinned(name, speeds, args.nproc)
            r = one(name, scripts, work, dict(env, **pinned), args.timeout, args.nproc)
            pair[name] = launch_rate(r, args.skip)
            pair[name]["host_cpu"] = host_cpu_share(before, host_cpu_times())
            pair[name]["host_loop_s"] = [loop, hog.best_loop_s()]
            pair[name]["cpu_loop_s"] = {"before": speeds, "after": hog.cpu_speeds()}
            pair[name].update(pinned)
            write(args, pairs + [pair], notes, host_load)  # a call cut off mid-round keeps the launches it finished
        pairs.append(pair)  # already written with the round's last launch
        print(f"round {i}: {json.dumps(pair)}", flush=True)
    if levels:
        host_load["after"] = hog.load_curve(levels)
    write(args, pairs, notes, host_load)
    if args.artifacts:  # the probe's optional tables, traces, sync stacks and allocator histories, every launch's log
        with tarfile.open(args.artifacts, "w:gz") as tar:
            for f in sorted(glob.glob(os.path.join(args.work, "pair*", "**", "*"), recursive=True)):
                if f.endswith((".txt", ".pickle.gz", ".json.gz", ".log", ".json", ".csv")):  # .json.gz: traces
                    tar.add(f, arcname=os.path.relpath(f, args.work))
    return 0


def summary(pairs, name):
    """Ratios of one DDP configuration to the single run of the same round (samples/s, label tokens/s), and peak
    memory growth per rank (allocated, reserved)."""
    ratios, token_ratios, growth = [], [], {"peak_allocated_gib": [], "peak_reserved_gib": []}
    to_ref = {ref: [] for ref in REFERENCES}
    for p in pairs:
        single, ddp = p.get("single", {}), p.get(name, {})
        for ref, found in to_ref.items():
            other = next((run for key, run in p.items() if _base(key) == ref), {})
            if ddp.get("samples_per_s") and other.get("samples_per_s") and ddp is not other:
                found.append(ddp["samples_per_s"] / other["samples_per_s"])
        if ddp.get("samples_per_s") and single.get("samples_per_s"):
            ratios.append(ddp["samples_per_s"] / single["samples_per_s"])
            if ddp.get("label_tokens_per_s") and single.get("label_tokens_per_s"):
                token_ratios.append(ddp["label_tokens_per_s"] / single["label_tokens_per_s"])
            for key, grown in growth.items():
                base = (single.get(key) or {}).get("0")
                grown += [peak / base - 1 for peak in (ddp.get(key) or {}).values() if base and peak]
    return {"ratios": [round(r, 3) for r in ratios], "median_ratio": gpu_clocks.stat(statistics.median, ratios),
            "min_ratio": gpu_clocks.stat(min, ratios), "token_ratios": [round(r, 3) for r in token_ratios],
            "median_token_ratio": gpu_clocks.stat(statistics.median, token_ratios),
            "max_peak_allocated_growth": gpu_clocks.stat(max, growth["peak_allocated_gib"], 4),
            "max_peak_reserved_growth": gpu_clocks.stat(max, growth["peak_reserved_gib"], 4),
            **{f"ratios_to_{ref.replace('-', '_')}": [round(r, 3) for r in found]
               for ref, found in to_ref.items() if found}}


def write(args, pairs, notes, host_load=None):
    configs = args.configs.split(",")
    by_config = {name: summary(pairs, name) for name in configs}
    first = by_config[configs[0]]
    out = {"device": args.machine, "model": args.model, "script": os.path.basename(args.script),
           "world_size": args.nproc, "paired_runs": [{"single": p.get("single"), "ddp": p.get(configs[0])}
                                                      for p in pairs],
           "median_ratio": first["median_ratio"], "ratios": first["ratios"], "configs": by_config,
           "rounds": pairs, "notes": notes, "host_load_s": host_load,
           "settings": {"skip_steps": args.skip, "configs": {c: CONFIGS[c] for c in configs},
                        "env": rn.parse_env(args.env),
                        "timing": "rank 0's optimizer-step ends: CUDA events read after training (the probe's "
                                  "default since the sixth session; NBDDP_BENCH_STEP_SYNC=1 synchronised each step "
                                  "end before)"},
           "commit": args.commit}
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)


def merge(args):
    """One file from several calls' results (same machine): their rounds in order, each file's configurations
    renamed NAME[TAG] where the file is given as FILE=TAG; `median_ratio` pools every configuration named ddp or
    ddp[...] (NVLink, the generated defaults)."""
    rows, sources, first = [], [], None
    for item in args.files:
        path, _, tag = item.partition("=")
        result = json.load(open(path))
        first = first or result
        sources.append({"file": os.path.basename(path), "tag": tag, "device": result.get("device"),
                        "commit": result.get("commit"), "notes": result.get("notes")})
        for row in result["rounds"]:
            rows.append({(name if name == "single" or not tag else f"{name}[{tag}]"): run for name, run in row.items()})
    names = list(dict.fromkeys(n for row in rows for n in row if n != "single"))
    pooled = [{"single": row["single"], "ddp": run, "config": name} for row in rows
              for name, run in row.items() if _base(name) == "ddp"]
    ratios = [p["ddp"]["samples_per_s"] / p["single"]["samples_per_s"] for p in pooled
              if p["ddp"].get("samples_per_s") and p["single"].get("samples_per_s")]
    out = {"device": args.machine or first.get("device"), "model": first.get("model"),
           "world_size": first.get("world_size"), "paired_runs": pooled,
           "median_ratio": gpu_clocks.stat(statistics.median, ratios), "min_ratio": gpu_clocks.stat(min, ratios),
           "ratios": [round(r, 3) for r in ratios],
           "configs": {name: summary(rows, name) for name in names}, "rounds": rows, "sources": sources,
           "settings": first.get("settings")}
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
    r.add_argument("--pairs", type=int, default=5, help="rounds: each runs single and every configuration once")
    r.add_argument("--configs", default="ddp", help=f"2-GPU configurations, comma-separated: {', '.join(CONFIGS)}")
    r.add_argument("--skip", type=int, default=15, help="warm-up optimizer steps left out of the rate")
    r.add_argument("--deadline", type=int, default=400)
    r.add_argument("--run-estimate", type=int, default=60)
    r.add_argument("--timeout", type=int, default=150)
    r.add_argument("--nproc", type=int, default=2)
    r.add_argument("--env", action="append")
    r.add_argument("--host-load", default="1,2,4,8,16", help="before the first round and after the last: the "
                   "one-core loop's time with this many copies busy at once (bench/hog.py; empty: not measured)")
    r.add_argument("--artifacts", default="", help="tar.gz of every launch's log and the probe's tables/histories")
    r.add_argument("--machine", default=os.environ.get("BENCH_MACHINE", ""))
    r.add_argument("--model", default="Llama-3.1-8B shape, 2 layers, random weights, 4-bit (offline_hub llama31)")
    r.add_argument("--commit", default=os.environ.get("BENCH_COMMIT", ""))
    m = sub.add_parser("merge", help="one result from several calls' files")
    m.add_argument("files", nargs="+", metavar="FILE[=TAG]")
    m.add_argument("--out", required=True)
    m.add_argument("--machine", default="")
    args = ap.parse_args(argv)
    return run(args) if args.cmd == "run" else merge(args)


if __name__ == "__main__":
    sys.exit(main())
