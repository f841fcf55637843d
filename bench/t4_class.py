#!/usr/bin/env python3
"""A T4-class share of an H100/H200: every process held to N of its GPU's SMs, for bench/kaggle_t4.py --sms.

The share is NVIDIA MPS (the Multi-Process Service, a user-space daemon; the GPU's compute mode, clocks and MIG
stay as they are): a client started with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=P runs every kernel of every thread
and stream of the process on P% of the SMs, and the streams keep their ordinary ordering (nothing about the
process changes but the SMs its kernels may use). The daemon is started for a batch and stopped at its end.
A CUDA green context (bench/rankprobe's NBDDP_BENCH_GREEN_SMS) is the other way; `probe` checks both.

    python3 bench/t4_class.py probe --sms 4,6,8,10,12 --out $OUT/t4-probe.json    # pick N: matmul/copy, losses
    python3 bench/t4_class.py measure --device 0 [--train]                      # one client (what probe runs)

`measure` prints one JSON line: the SMs the process reports, a 4096^3 float16 matmul in TFLOP/s, a 512 MiB
device-to-device copy in GB/s (bytes read plus written), and with --train a small float16 training loop's losses
and median step time (weights and data drawn on the CPU, so that they do not depend on the SM count; backward on
autograd's device thread, pinned non-blocking copies, set_device called again mid-loop as libraries do).
A Tesla T4 has 40 SMs, 65 TFLOP/s float16 peak (about 25-40 measured) and 320 GB/s."""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

from run_notebooks import recipe  # nbddp's launch recipe (bench/ is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
MPS_DIRS = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nbddp-mps/pipe", "CUDA_MPS_LOG_DIRECTORY": "/tmp/nbddp-mps/log"}
T4 = {"sms": 40, "fp16_tflops_peak": 65, "fp16_tflops_measured": "25-40", "copy_gbps_peak": 320}


def mps_available():
    return shutil.which("nvidia-cuda-mps-control") is not None


def mps_start():
    """Starts the MPS control daemon (its pipe and log folders under /tmp); returns the environment clients need."""
    for path in MPS_DIRS.values():
        os.makedirs(path, exist_ok=True)
    env = dict(os.environ, **MPS_DIRS)
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    time.sleep(1)
    return dict(MPS_DIRS)


def mps_stop():
    """Stops the daemon (and its server); clients must have ended."""
    env = dict(os.environ, **MPS_DIRS)
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env, check=False)
    time.sleep(1)


def mps_percent(sms, total):
    """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for `sms` of `total` SMs."""
    return f"{math.floor(10000.0 * sms / total) / 100:.2f}"  # rounded down: never a share over N


def total_sms(device=0):
    """The GPU's SM count, asked in a child process (this one keeps no CUDA context)."""
    code = f"import torch; print(torch.cuda.get_device_properties({device}).multi_processor_count)"
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def _median_ms(torch, fn, reps, before=None):
    """The median of `reps` timings of `fn` on the GPU (CUDA events), after 3 warm-ups; `before` runs untimed ahead
    of each (a barrier that lines up the ranks of a collective)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if before is not None:
            torch.cuda.synchronize()
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _train(torch, device, steps=24, width=1024, batch=2048):
    """A 4-block MLP trained in float16 autocast with a loss scaler: losses and median step time."""
    gen = torch.Generator().manual_seed(0)
    blocks = []
    for _ in range(4):
        blocks += [torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)]
    model = torch.nn.Sequential(*blocks)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 / math.sqrt(p.shape[-1])))
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    xs = [torch.randn(batch, width, generator=gen).pin_memory() for _ in range(steps)]
    ys = [torch.randn(batch, width, generator=gen).pin_memory() for _ in range(steps)]
    losses, times = [], []
    for i in range(steps):
        t0 = time.perf_counter()
        x, y = xs[i].to(device, non_blocking=True), ys[i].to(device, non_blocking=True)
        if i % 5 == 2:
            torch.cuda.set_device(device)  # libraries do this mid-run; the share must survive it
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # the host waits: the step's time is on the host clock
        times.append(time.perf_counter() - t0)
    return {"losses": [round(v, 6) for v in losses], "median_step_ms": round(1000 * statistics.median(times[4:]), 3)}


def measure(args):
    import torch
    device = args.device
    torch.cuda.set_device(device)  # where the probe's green context (if asked) is made
    props = torch.cuda.get_device_properties(device)
    out = {"device": device, "gpu": props.name, "sms_reported": props.multi_processor_count,
           "mps_percent": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
           "green_sms": os.environ.get("NBDDP_BENCH_GREEN_SMS")}
    n = 4096
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(n, n, generator=gen).half().to(device)
    b = torch.randn(n, n, generator=gen).half().to(device)
    out["matmul_tflops"] = round(2 * n ** 3 / (_median_ms(torch, lambda: a @ b, 20) / 1000) / 1e12, 2)
    src = torch.empty(256 * 2 ** 20, dtype=torch.float16, device=device).normal_()
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * src.element_size()  # read + written
    out["copy_gbps"] = round(nbytes / (_median_ms(torch, lambda: dst.copy_(src), 20) / 1000) / 1e9, 1)
    if args.train:
        out["train"] = _train(torch, device)
    print(json.dumps(out), flush=True)


def client(device, env_extra, train=False, timeout=180):
    """One `measure` client in a child process with env_extra on top (rank probe on PYTHONPATH, for the green
    context); its JSON, or the error it left."""
    env = dict(os.environ, NBDDP_BENCH_PROBE_DIR=f"/tmp/nbddp-t4-probe/{device}", **env_extra)  # the probe loads
    env["NCCL_NVLS_ENABLE"] = "0"
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "rankprobe")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    argv = [sys.executable, os.path.abspath(__file__), "measure", "--device", str(device)] + (["--train"] if train else [])
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-3:], "returncode": proc.returncode,
                "env": env_extra}
    return dict(json.loads(lines[-1]), env=env_extra)


def pair(jobs):
    """Clients two at a time, one per GPU (device 0 and 1): [(env, train), ...] -> results in order."""
    import concurrent.futures as cf
    out = [None] * len(jobs)
    with cf.ThreadPoolExecutor(2) as pool:
        for start in range(0, len(jobs), 2):
            futs = {pool.submit(client, i, env, train): start + i for i, (env, train) in enumerate(jobs[start:start + 2])}
            for fut in cf.as_completed(futs):
                out[futs[fut]] = fut.result()
    return out


def same_losses(a, b, rtol=2e-2):
    """Both finite and equal step by step within float16 noise; the largest relative difference."""
    la, lb = (a or {}).get("train", {}).get("losses"), (b or {}).get("train", {}).get("losses")
    if not la or not lb or len(la) != len(lb) or not all(map(math.isfinite, la + lb)):
        return False, None
    worst = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(la, lb))
    return worst <= rtol, round(worst, 5)


def nccl_check(env_extra):
    """A 2-rank NCCL all-reduce (bench/allreduce.py, small) under the share, peer-to-peer off: its exit status."""
    env = dict(os.environ, **env_extra, NCCL_P2P_DISABLE="1", NCCL_NVLS_ENABLE="0")
    job = recipe.build(os.path.join(HERE, "allreduce.py"), 2, python=sys.executable, cpus=recipe.cpu_count(), env=env,
                       script_args=["--numel", "4194304", "--dtypes", "float16", "--steps", "5",
                                    "--out", "/tmp/nbddp-nccl-check.json"], routed=False)
    with open("/tmp/nbddp-nccl-check.log", "w") as log:
        rc = subprocess.run(job.argv, env={**env, **job.env}, stdout=log, stderr=subprocess.STDOUT,
                            timeout=120).returncode
    return {"returncode": rc, "tail": open("/tmp/nbddp-nccl-check.log").read().strip().splitlines()[-3:]}


def choose(figures, target_tflops):
    """The SM count whose matmul lands nearest the target (log distance): the count the process reported under
    that share (MPS rounds a share up: on H100s 3-7.6% all ran on 8 SMs), else the count asked."""
    ok = [f for f in figures if f.get("matmul_tflops")]
    if not ok:
        return None
    best = min(ok, key=lambda f: abs(math.log(f["matmul_tflops"] / target_tflops)))
    return best.get("sms_reported") or best["sms"]


def probe(args):
    report = {"t4_class": True, "t4": T4, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": os.environ.get("BENCH_MACHINE"), "target_tflops": args.target_tflops}
    total = total_sms()
    report["total_sms"] = total
    green = [int(x) for x in args.green_sms.split(",") if x and args.phase in ("green", "both")]
    whole, *greens = pair([({}, True)] + [({"NBDDP_BENCH_GREEN_SMS": str(n)}, True) for n in green])
    report["whole_gpu"] = whole
    report["green"] = [dict(g, losses_match_whole=same_losses(g, whole)) for g in greens]
    report["green_valid"] = {g.get("green_sms"): bool(g["losses_match_whole"][0] and g["train"]["median_step_ms"]
                                                     > 1.5 * whole["train"]["median_step_ms"])
                             for g in report["green"] if g["losses_match_whole"][0]}
    report["mps_available"] = mps_available()
    if report["mps_available"] and args.phase in ("mps", "both"):
        sms = [int(x) for x in args.sms.split(",")]
        try:
            base = mps_start()
            figures = pair([(dict(base, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=mps_percent(n, total)), False) for n in sms])
            for n, f in zip(sms, figures):
                f["sms"] = n
            report["mps_figures"] = figures
            chosen = choose(figures, args.target_tflops)
            report["mps_chosen_sms"] = chosen
            if chosen:
                env = dict(base, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=mps_percent(chosen, total))
                share, full = pair([(env, True), (dict(base, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="100"), True)])
                report["mps_train"] = {"share": share, "full": full,
                                       "losses_match_full": same_losses(share, full),
                                       "losses_match_whole_without_mps": same_losses(share, whole)}
                report["mps_nccl"] = nccl_check(env)
                if report["mps_nccl"]["returncode"]:  # NCCL's cuMem buffers under MPS: try without them
                    report["mps_nccl_without_cumem"] = nccl_check(dict(env, NCCL_CUMEM_ENABLE="0"))
        except Exception as exc:  # the report still says what was seen
            report["mps_error"] = repr(exc)
        finally:
            mps_stop()
    train = report.get("mps_train", {})
    report["mps_valid"] = bool(train.get("losses_match_full", [False])[0] and train.get("losses_match_whole_without_mps", [False])[0]
                               and 0 in (report.get("mps_nccl", {}).get("returncode"),
                                         report.get("mps_nccl_without_cumem", {}).get("returncode"))
                               and train["share"]["train"]["median_step_ms"] > 1.5 * train["full"]["train"]["median_step_ms"])
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)
    print(json.dumps({k: report.get(k) for k in ("total_sms", "mps_available", "mps_chosen_sms", "mps_valid")}))
    for f in report.get("mps_figures", []):
        print(f"MPS {f.get('sms')} SMs: reported {f.get('sms_reported')}, matmul {f.get('matmul_tflops')} TFLOP/s, "
              f"copy {f.get('copy_gbps')} GB/s {f.get('error', '')}")
    for g in [whole] + report["green"]:
        t = g.get("train", {})
        print(f"green {g.get('green_sms')}: matmul {g.get('matmul_tflops')} copy {g.get('copy_gbps')} "
              f"step {t.get('median_step_ms')} ms, losses {t.get('losses', [])[:3]} match {g.get('losses_match_whole')} {g.get('error', '')}")
    if train:
        print("MPS train:", {k: (v.get("train", {}).get("median_step_ms"), v.get("train", {}).get("losses", [])[-2:])
                             for k, v in train.items() if isinstance(v, dict)},
              train["losses_match_full"], train["losses_match_whole_without_mps"], report.get("mps_nccl"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--device", type=int, default=0)
    m.add_argument("--train", action="store_true")
    p = sub.add_parser("probe")
    p.add_argument("--sms", default="4,6,8,10,12", help="MPS shares to measure (SM counts)")
    p.add_argument("--green-sms", default="8,128", help="green-context SM counts to check (0: none)")
    p.add_argument("--phase", choices=("green", "mps", "both"), default="both",
                   help="green: the green contexts and the whole GPU only (no daemon: other GPU work may run); mps")
    p.add_argument("--target-tflops", type=float, default=32.0, help="the matmul figure N is chosen by")
    p.add_argument("--out", required=True)
    sub.add_parser("stop-mps", help="stop the MPS daemon that a probe or kaggle_t4.py --sms started, if one runs")
    args = parser.parse_args(argv)
    {"measure": measure, "probe": probe, "stop-mps": lambda _: mps_stop()}[args.cmd](args)


if __name__ == "__main__":
    main()
