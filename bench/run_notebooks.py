#!/usr/bin/env python3
"""Run nbddp-converted Unsloth notebooks on a GPU machine: 2-GPU DDP (torchrun) and 1-GPU, same script.

Step 1, where nbddp and nbformat are installed (this machine):
    python bench/run_notebooks.py convert --dest .gpurun
Step 2, on the GPU machine, after `bench/offline_hub.py` filled HF_HOME (HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1):
    python bench/run_notebooks.py run --scripts .gpurun --out $OUT [--only a,b] [--resume old.json ...]
           [--timeout 240] [--deadline 500] [--modes ddp,self,single] [--single-slots 2]

Each run gets its own working folder (outputs, adapters and Unsloth's compile cache land there), a log, and a
per-rank probe (bench/rankprobe/sitecustomize.py: GPU used, peak memory, generate()/save_pretrained() calls).
The JSON summary is rewritten after every run; `--resume` skips notebooks an earlier results file has done.
The converted scripts are run exactly as nbddp wrote them: nothing caps their steps; a run that passes its
time limit is killed and recorded as timed out.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # nbddp from the checkout: the GPU machines need not install nbddp
from nbddp import launch as recipe  # noqa: E402  (standard library only)
CORPUS = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "notebooks", "unsloth"))  # ../shared beside the checkout

# slug -> notebook file (priority order)
NOTEBOOKS = {
    "tinyllama-alpaca": "Kaggle-TinyLlama_(1.1B)-Alpaca.ipynb",
    "llama31-alpaca": "Kaggle-Llama3.1_(8B)-Alpaca.ipynb",
    "mistral03-conversational": "Kaggle-Mistral_v0.3_(7B)-Conversational.ipynb",
    "gemma3-4b": "Kaggle-Gemma3_(4B).ipynb",
    "qwen3-14b-reasoning": "Kaggle-Qwen3_(14B)-Reasoning-Conversational.ipynb",
    "mistral03-cpt": "Kaggle-Mistral_v0.3_(7B)-CPT.ipynb",
    "zephyr-dpo": "Kaggle-Zephyr_(7B)-DPO.ipynb",
    "gemma3-1b-grpo": "Kaggle-Gemma3_(1B)-GRPO.ipynb",
    "qwen25vl-vision": "Qwen2.5_VL_(7B)-Vision.ipynb",
    "llama32-3b-conversational": "Llama3.2_(1B_and_3B)-Conversational.ipynb",  # issue 6's 3B shape
}

LOSS_RE = re.compile(r"""['"]loss['"]\s*:\s*['"]?([-+0-9.eE]+|nan|inf)""")
METRIC_RE = re.compile(r"""['"](train_runtime|train_samples_per_second|train_steps_per_second|train_loss)['"]\s*:\s*['"]?([-+0-9.eE]+)""")
EXIT_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def convert(dest):
    """Each notebook as nbddp converts it (dest/slug.py) and as a plain script (dest/plain/slug.py, the baselines)."""
    from nbddp.notebook import read_notebook  # only here: the GPU machine needs no nbddp converter deps
    from nbddp.pipeline import convert_notebook
    from plain_script import plain_script

    os.makedirs(os.path.join(dest, "plain"), exist_ok=True)
    for slug, nb in NOTEBOOKS.items():
        notebook = read_notebook(os.path.join(CORPUS, nb))  # read once; both steps work on their own copy
        conv = convert_notebook(notebook, source_name=nb, script_name=f"{slug}.py", nproc=2)
        with open(os.path.join(dest, f"{slug}.py"), "w", encoding="utf-8") as fh:
            fh.write(conv.script)
        with open(os.path.join(dest, "plain", f"{slug}.py"), "w", encoding="utf-8") as fh:
            fh.write(plain_script(notebook, source_name=nb))
        print(f"converted {nb} -> {dest}/{slug}.py, {dest}/plain/{slug}.py")


def _run(argv, env, cwd, log_path, timeout):
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGUSR1)  # the probe prints every thread's stack into the log
            time.sleep(3)
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc, timed_out = proc.returncode, True
    return rc, timed_out, round(time.time() - t0, 1)


def rank_probes(workdir):
    """{rank: what bench/rankprobe wrote for it} of a launch run in workdir."""
    return {str(p.get("rank")): p for p in (json.load(open(f))
                                            for f in sorted(glob.glob(os.path.join(workdir, "probe", "*.json"))))}


def adapter_dirs(workdir):
    """The folders below workdir that hold a saved adapter, less the Trainer's checkpoints."""
    return sorted(os.path.relpath(os.path.dirname(p), workdir)
                  for p in glob.glob(os.path.join(workdir, "**", "adapter_config.json"), recursive=True)
                  if "checkpoint-" not in p)


def summarize(mode, rc, timed_out, wall, log_path, workdir, world):
    text = open(log_path, errors="replace").read()
    losses = [float(x) for x in LOSS_RE.findall(text)]
    metrics = {}
    for k, v in METRIC_RE.findall(text):
        metrics.setdefault(k, []).append(float(v))
    probes, adapters = rank_probes(workdir), adapter_dirs(workdir)
    exit_codes = {r: int(c) for r, c in EXIT_RE.findall(text)}
    if rc == 0 and not timed_out:
        exit_codes = {str(r): 0 for r in range(world)}
    errors = [ln.strip() for ln in text.splitlines()
              if re.search(r"(Error|Exception)\b.*:", ln) and "Warning" not in ln][-6:]
    return {
        "mode": mode, "world_size": world, "returncode": rc, "timed_out": timed_out, "wall_s": wall,
        "rank_exit_codes": exit_codes, "ranks": probes, "losses": losses, "n_loss_logs": len(losses),
        "metrics": metrics, "adapter_dirs": adapters,
        "generate_calls_per_rank": {r: p.get("generate") for r, p in probes.items()},
        "save_pretrained_calls_per_rank": {r: p.get("save_pretrained") for r, p in probes.items()},
        "errors": errors, "log": os.path.basename(log_path),
        "step_end_times": {r: p.get("step_end_times") for r, p in probes.items()},
        "batch": {r: p.get("batch") for r, p in probes.items()},
    }


def parse_env(pairs):
    """--env K=V options -> dict."""
    return dict(kv.split("=", 1) for kv in pairs or [])


def child_env(extra):
    """Every launch's environment: this one, `extra` on top, the rank probe on PYTHONPATH, NVLink multicast off."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", **extra)
    env["NCCL_NVLS_ENABLE"] = "0"  # never anything else
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(HERE, "rankprobe")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def launch_argv(script, nproc, env, gpu=None, mode="ddp"):
    """(launch, world size, mode), the launch's argv and what it sets on top of `env`: torchrun on nproc processes
    as nbddp's recipe builds it (`nbddp run`'s argv and environment, every rank's output in the one log); with `gpu`
    (a GPU index, or several as "0,1") one plain process; mode "self": `python script`, which starts its own
    processes, one per visible GPU (nproc: how many that is), by the same recipe."""
    if mode == "self":
        return recipe.Launch([sys.executable, script], {}), nproc, "self"
    if gpu is None:
        return recipe.build(script, nproc, python=sys.executable, cpus=recipe.cpu_count(), env=env,
                            routed=False), nproc, "ddp"
    return recipe.Launch([sys.executable, script], {}), 1, "single"


def launch(script, workdir, log_path, env, limit, nproc, gpu=None, visible=None, mode="ddp"):
    """One launch of a converted notebook in workdir: torchrun on nproc processes (on the GPUs `visible`
    lists, "2,3", or all), `python script` starting its own processes (mode "self"), or with `gpu` one process
    seeing that GPU (or those, "0,1"). Returns its summary."""
    os.makedirs(workdir, exist_ok=True)
    env = dict(env, NBDDP_BENCH_PROBE_DIR=os.path.join(workdir, "probe"), NBDDP_BENCH_SCRIPT=os.path.abspath(script))
    shown = gpu if gpu is not None else visible
    if shown is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(shown)
    job, world, mode = launch_argv(script, nproc, env, gpu, mode)
    rc, timed_out, wall = _run(job.argv, {**env, **job.env}, workdir, log_path, limit)
    r = summarize(mode, rc, timed_out, wall, log_path, workdir, world)
    if shown is not None:
        r["gpu"] = shown
    return r


def _job(args, base_env, slug, key, mode, gpu, limit):
    """One launch of one corpus notebook, printed as it goes."""
    name = key.replace("@", "_")
    print(f"run {slug} {mode}{f' on GPU {gpu}' if mode == 'single' else ''} (limit {limit:.0f}s)", flush=True)
    r = launch(os.path.abspath(os.path.join(args.scripts, f"{slug}.py")), os.path.join(args.work, name, mode),
               os.path.join(args.work, "logs", f"{name}-{mode}.log"), base_env, limit, args.nproc,
               gpu if mode == "single" else None, mode=mode)
    print(f"  {slug} {mode}: rc={r['returncode']} timed_out={r['timed_out']} wall={r['wall_s']}s "
          f"losses={len(r['losses'])} first/last={r['losses'][:1]}/{r['losses'][-1:]} adapters={r['adapter_dirs']} "
          f"gen={r['generate_calls_per_rank']} errors={r['errors'][-2:]}", flush=True)
    return r


def _status(entry):
    runs = [r for r in entry["runs"].values() if "skipped" not in r]
    if not runs:
        return "not run"
    return "ok" if all(r.get("returncode") == 0 for r in runs) else "failed"


def run(args):
    """Every DDP launch first, one after another; then the 1-GPU launches, `--single-slots` at a time, each on
    its own GPU (slot i uses GPU i; the runs of one slot never share a GPU)."""
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    logdir = os.path.join(args.work, "logs")
    os.makedirs(logdir, exist_ok=True)
    done = {}  # key -> entry holding the runs an earlier results file finished (a skipped run is not done)
    for f in args.resume or []:
        if os.path.exists(f):
            for key, entry in json.load(open(f)).get("notebooks", {}).items():
                runs = {m: r for m, r in entry.get("runs", {}).items() if "returncode" in r}
                if runs:
                    done[key] = dict(entry, runs=runs)
    extra_env = parse_env(args.env)
    results = {"machine": args.machine, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "settings": {"timeout_s": args.timeout, "timeout_for": args.timeout_for or [], "modes": args.modes,
                            "env": extra_env, "single_slots": args.single_slots}, "notebooks": dict(done)}
    out_json = os.path.join(args.out, "notebooks.json")
    base_env = child_env(extra_env)
    timeouts = {k: int(v) for k, v in parse_env(args.timeout_for).items()}
    lock = threading.Lock()
    modes = args.modes.split(",")
    todo = {m: [] for m in modes}
    for slug in (args.only.split(",") if args.only else list(NOTEBOOKS)):
        key = f"{slug}@{args.tag}" if args.tag else slug
        entry = results["notebooks"].setdefault(key, {"notebook": NOTEBOOKS.get(slug, slug), "script": f"{slug}.py",
                                                      "runs": {}, "env": extra_env, "status": "not run"})
        for m in modes:
            if m in entry["runs"]:
                print(f"skip {slug} {m}: done in an earlier results file", flush=True)
            else:
                todo[m].append((slug, key))

    def record(key, mode, r):
        with lock:
            entry = results["notebooks"][key]
            entry["runs"][mode] = r
            entry["status"] = _status(entry)
            results["elapsed_s"] = round(time.time() - t_start, 1)
            json.dump(results, open(out_json, "w"), indent=1)
            with tarfile.open(os.path.join(args.out, "notebook-logs.tar.gz"), "w:gz") as tar:
                tar.add(logdir, arcname="logs")

    def launch(slug, key, mode, gpu=0):
        limit = min(timeouts.get(slug, args.timeout), args.deadline - (time.time() - t_start))
        if limit < 30:
            record(key, mode, {"mode": mode, "skipped": "time budget of this batch spent (not run)"})
        else:
            record(key, mode, _job(args, base_env, slug, key, mode, gpu, limit))

    for mode in ("ddp", "self"):
        for slug, key in todo.get(mode, []):
            launch(slug, key, mode)
    if todo.get("single"):
        queue = list(todo["single"])

        def slot(gpu):
            while True:
                with lock:
                    if not queue:
                        return
                    slug, key = queue.pop(0)
                launch(slug, key, "single", gpu)
        threads = [threading.Thread(target=slot, args=(g,)) for g in range(args.single_slots)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert")
    c.add_argument("--dest", default=".gpurun")
    r = sub.add_parser("run")
    r.add_argument("--scripts", default=".gpurun")
    r.add_argument("--out", required=True)
    r.add_argument("--work", default="/tmp/nbrun")
    r.add_argument("--only", default="")
    r.add_argument("--resume", nargs="*")
    r.add_argument("--timeout", type=int, default=240, help="seconds per run")
    r.add_argument("--timeout-for", action="append", metavar="SLUG=SECONDS", help="another limit for one notebook")
    r.add_argument("--deadline", type=int, default=480, help="every run ends by this many seconds after the start")
    r.add_argument("--modes", default="ddp,single", help="ddp (torchrun, --nproc processes), self (`python script`: "
                   "it starts one process per GPU itself; --nproc says how many GPUs there are), single")
    r.add_argument("--nproc", type=int, default=2)
    r.add_argument("--single-slots", type=int, default=1,
                   help="1-GPU runs at once, each on its own GPU (2: two notebooks side by side on GPUs 0 and 1)")
    r.add_argument("--env", action="append", help="K=V for every run of this batch (recorded)")
    r.add_argument("--tag", default="", help="results key suffix for runs with --env (slug@tag)")
    r.add_argument("--machine", default=os.environ.get("BENCH_MACHINE", ""))
    args = ap.parse_args(argv)
    return convert(args.dest) if args.cmd == "convert" else run(args)


if __name__ == "__main__":
    sys.exit(main())
