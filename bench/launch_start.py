#!/usr/bin/env python3
"""How long `python train_ddp.py` takes to start its ranks, and which processes hold GPU memory while they run.

Step 1, here: a three-cell notebook (import torch and transformers, load a model by hub id, rank 0 lists the GPU's
processes) converted by each nbddp checkout given (e.g. the one before a change and this one):
    python bench/launch_start.py make --checkout /tmp/nbddp_base --checkout . --dest .gpurun/launch
Step 2, on a 2-GPU machine after bench/gpu_env.sh --models llama32_3b --datasets none:
    python3 bench/launch_start.py run --scripts .gpurun/launch --rounds 3 --out $OUT/launch.json
Each script runs as a Kaggle Script runs it, `python script` on cores 0-3, the order alternating by round; the rank
probe gives each rank's start (seconds after the script's), and rank 0 writes its launcher's process id and
nvidia-smi's list of processes holding GPU memory.
`parts` times what a launch is made of, each a fresh `python3 -c` on cores 0-3 (python alone, `import torch`, with
the free memory of GPUs 0 and 1 read through CUDA, with `torch.cuda.device_count()`, `torchrun --help`):
    python3 bench/launch_start.py parts --rounds 3 --out $OUT/parts.json
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CELLS = [
    "import torch\nfrom transformers import AutoModelForCausalLM\n",
    "model = AutoModelForCausalLM.from_pretrained('unsloth/Llama-3.2-3B-Instruct', dtype = torch.float16, "
    "device_map = 'cuda')\n",
    "import json, os, subprocess\nif os.environ.get('RANK') == '0':\n"
    "    apps = subprocess.run(['nvidia-smi', '--query-compute-apps=pid,used_memory', '--format=csv,noheader'],\n"
    "                          capture_output = True, text = True).stdout\n"
    "    json.dump({'launcher_pid': os.getppid(), 'gpu_apps': apps.splitlines()}, open(os.environ['LAUNCH_OUT'], 'w'))\n",
]
MAKE = """
import sys
sys.path.insert(0, sys.argv[1])
import nbformat
from nbddp.pipeline import convert_notebook
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in {cells!r}])
open(sys.argv[2], "w").write(convert_notebook(nb).script)
"""


def make(checkouts, dest):
    """One script per checkout, converted by that checkout's nbddp in a fresh interpreter: dest/<n>.py."""
    os.makedirs(dest, exist_ok=True)
    for n, checkout in enumerate(checkouts):
        path = os.path.join(dest, f"{n}.py")
        subprocess.run([sys.executable, "-c", MAKE.format(cells=CELLS), os.path.abspath(checkout), path], check=True)
        print(f"{checkout} -> {path}")


def run(scripts, rounds, out):
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(scripts, "*.py")))
    results = []
    for rnd in range(rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            work = f"/tmp/launch-start/{name}-{rnd}"
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
            env = dict(os.environ, NBDDP_BENCH_PROBE_DIR=f"{work}/probe", LAUNCH_OUT=f"{work}/apps.json",
                       NCCL_NVLS_ENABLE="0",
                       PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(HERE, "rankprobe"),
                                                                 os.environ.get("PYTHONPATH")])))
            t0 = time.time()
            done = subprocess.run(["taskset", "-c", "0-3", sys.executable, os.path.abspath(os.path.join(scripts, name))],
                                  cwd=work, env=env, capture_output=True, text=True, timeout=300)
            probes = [json.load(open(f)) for f in sorted(glob.glob(f"{work}/probe/*.json"))]
            apps = f"{work}/apps.json"
            row = {"script": name, "round": rnd, "returncode": done.returncode, "wall_s": round(time.time() - t0, 2),
                   "rank_start_s": sorted(round(p["started_at"] - t0, 2) for p in probes),
                   "gpu_processes": json.load(open(apps)) if os.path.exists(apps) else None,
                   "stderr_tail": done.stderr[-600:] if done.returncode else ""}
            results.append(row)
            print(json.dumps(row), flush=True)
    with open(out, "w") as fh:
        json.dump({"machine": os.environ.get("BENCH_MACHINE"), "date": time.strftime("%Y-%m-%d", time.gmtime()),
                   "runs": results}, fh, indent=1)


PARTS = {"python": "pass", "import torch": "import torch",
         "import torch, CUDA free memory of GPUs 0,1": "import torch; [torch.cuda.mem_get_info(d) for d in range(2)]",
         "import torch, device_count": "import torch; torch.cuda.device_count()"}


def parts(rounds, out):
    times = {}
    for _ in range(rounds):
        for name, argv in [(n, ["-c", code]) for n, code in PARTS.items()] + [
                ("torchrun --help", ["-m", "torch.distributed.run", "--help"])]:
            t0 = time.time()
            subprocess.run(["taskset", "-c", "0-3", sys.executable, *argv], check=True, stdout=subprocess.DEVNULL)
            times.setdefault(name, []).append(round(time.time() - t0, 2))
    with open(out, "w") as fh:
        json.dump({"machine": os.environ.get("BENCH_MACHINE"), "date": time.strftime("%Y-%m-%d", time.gmtime()),
                   "seconds": times}, fh, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--checkout", action="append", required=True, help="an nbddp checkout (several: one script each)")
    m.add_argument("--dest", default=".gpurun/launch")
    r = sub.add_parser("run")
    r.add_argument("--scripts", default=".gpurun/launch")
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--out", required=True)
    t = sub.add_parser("parts")
    t.add_argument("--rounds", type=int, default=3)
    t.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "parts":
        return parts(args.rounds, args.out)
    return make(args.checkout, args.dest) if args.cmd == "make" else run(args.scripts, args.rounds, args.out)


if __name__ == "__main__":
    sys.exit(main())
