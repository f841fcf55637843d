#!/usr/bin/env python3
"""A converted notebook that trains a model too big for one GPU: `python train_ddp.py` with the fit check left to
choose (it picks the sharded mode, docs/sharded.md), against split mode (NBDDP_MODE=split), on the T4-class share.

The notebook (`notebook`): `AutoModelForCausalLM.from_pretrained("unsloth/Llama-3.1-8B", dtype=torch.float16)`,
peft's LoRA r=16 on q/k/v/o/gate/up/down, transformers' Trainer with gradient checkpointing, fp16, batch 1 x SEQ
tokens a micro-batch, gradient_accumulation_steps 2 (a global batch of 2: run as 2 processes nbddp keeps it as 1
micro-batch on each rank; split mode, one process, accumulates the 2), a fixed dataset of random token ids, every
step's loss logged, the adapter saved with save_pretrained at the end; the last cell writes each process's losses
and peak memory per GPU (bench-result-rank<R>.json) and prints them.

    python3 bench/shard_notebook.py notebook --out .gpurun/shard-notebook/shard_notebook.ipynb [--seq 1024]
    python -m nbddp convert .gpurun/shard-notebook/shard_notebook.ipynb -o .gpurun/shard-notebook/train_ddp.py
    python3 bench/shard_notebook.py cpu --script .gpurun/shard-notebook/train_ddp.py --work /tmp/shard-nb-cpu
        # a 3-layer Llama of the same shape family served under the same hub id, NBDDP_MODE=shard NBDDP_NPROC=2
        # against the same script as one process (NBDDP_NPROC=1): losses equal step by step
    python3 bench/shard_notebook.py gpu --script .gpurun/shard-notebook/train_ddp.py --out $OUT
        # on the 2-GPU machine: builds the 32-layer stand-in (bench/offline_hub.py's llama31 family, random
        # weights) in a hub cache under /tmp/hf, then bench/kaggle_t4.py --gib 15 --sms 8 --runs self,split

An Unsloth notebook as it is (the Kaggle Llama-3.1 Alpaca notebook, 4-bit, converted with `nbddp convert`):

    python3 bench/shard_notebook.py gpu --script .gpurun/unsloth-alpaca/train_ddp.py --out $OUT --gib 6.5 \
        --hub llama31,unsloth/alpaca-cleaned --env NBDDP_BENCH_ARGS=max_steps=10 --env NBDDP_BENCH_EXIT_AFTER_TRAIN=1
        # offline_hub.py serves the stand-in under every id Unsloth's mapper asks for, and the notebook's dataset
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
sys.path.insert(0, HERE)
MODEL = "unsloth/Llama-3.1-8B"
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def cells(seq, steps, rows, lr):
    return [
        "import json, os\nimport torch\nfrom transformers import AutoModelForCausalLM\n\n"
        f"model = AutoModelForCausalLM.from_pretrained({MODEL!r}, dtype = torch.float16)\n",
        "from peft import LoraConfig, get_peft_model\n\ntorch.manual_seed(0)\n"
        "model = get_peft_model(model, LoraConfig(r = 16, lora_alpha = 16, lora_dropout = 0.0, bias = 'none',\n"
        f"                                          target_modules = {PROJECTIONS!r},\n"
        "                                          task_type = 'CAUSAL_LM'))\nmodel.print_trainable_parameters()\n",
        "from transformers import Trainer, TrainingArguments\n\n"
        f"SEQ = {seq}\n"
        "# random token ids from the first 256 of the vocabulary (a fixed dataset whose loss can fall), one row a sample\n"
        f"rows = torch.randint(0, 256, ({rows}, SEQ), generator = torch.Generator().manual_seed(2))\n"
        "data = [{'input_ids': r, 'labels': r, 'attention_mask': torch.ones_like(r)} for r in rows]\n"
        "args = TrainingArguments(output_dir = 'outputs', per_device_train_batch_size = 1,\n"
        f"                         gradient_accumulation_steps = 2, max_steps = {steps}, learning_rate = {lr},\n"
        "                         lr_scheduler_type = 'constant', logging_steps = 1, save_strategy = 'no',\n"
        "                         report_to = 'none', seed = 0, disable_tqdm = True,\n"
        "                         fp16 = torch.cuda.is_available(),  # True on the GPU (the CPU check: no AMP)\n"
        "                         gradient_checkpointing = True,\n"
        "                         gradient_checkpointing_kwargs = {'use_reentrant': False})\n"
        "trainer = Trainer(model = model, args = args, train_dataset = data)\ntrainer.train()\n",
        "rank = int(os.environ.get('RANK', '0'))\n"
        "losses = [e['loss'] for e in trainer.state.log_history if 'loss' in e]\n"
        "gpus = (range(torch.cuda.device_count()) if os.environ.get('WORLD_SIZE', '1') == '1'\n"
        "        else [torch.cuda.current_device()]) if torch.cuda.is_available() else []\n"
        "peak = {str(d): {'allocated_gib': round(torch.cuda.max_memory_allocated(d) / 2**30, 3),\n"
        "                 'reserved_gib': round(torch.cuda.max_memory_reserved(d) / 2**30, 3)} for d in gpus}\n"
        "print('bench: rank', rank, 'losses', json.dumps(losses), 'peak', json.dumps(peak), flush = True)\n"
        "with open(f'bench-result-rank{rank}.json', 'w') as fh:\n"
        "    json.dump({'losses': losses, 'peak': peak, 'log_history': trainer.state.log_history}, fh)\n"
        "model.save_pretrained('lora_model')\n",
    ]


def write_notebook(path, seq=1024, steps=10, rows=20, lr=2e-3):
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                     "source": src.splitlines(keepends=True)} for i, src in enumerate(cells(seq, steps, rows, lr))],
          "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                       "language_info": {"name": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(nb, fh, indent=1)
    print(f"wrote {path}")


def build_hub(home, layers=None, tiny=False):
    """A hub cache under home serving MODEL: offline_hub's llama31 family (random bf16 weights) at `layers`, or a
    tiny Llama of the same family (vocabulary, heads ratio, rope) for the CPU check. Returns the model folder."""
    import offline_hub as hub
    if tiny:
        cls, kwargs, style, ids = hub.FAMILIES["llama31"]
        hub.FAMILIES["llama31_tiny"] = (cls, dict(kwargs, hidden_size=64, intermediate_size=160, num_attention_heads=4,
                                                  num_key_value_heads=2, num_hidden_layers=3), style, ids)
    family = "llama31_tiny" if tiny else "llama31"
    store = os.path.join(home, "offlinehub-models", f"{family}-{layers or 'default'}layers")
    if not os.path.exists(os.path.join(store, "config.json")):
        os.makedirs(store, exist_ok=True)
        hub.build_model(family, store, hub.lexicon(), layers)
    for name in hub.FAMILIES[family][3]:
        hub.install_repo(os.path.join(home, "hub"), name, store)
    return store


def cpu_check(script, work):
    """NBDDP_MODE=shard NBDDP_NPROC=2 `python script` against NBDDP_NPROC=1, both on CPU (gloo), at once."""
    home = os.path.join(work, "hf")
    build_hub(home, tiny=True)
    env = dict(os.environ, HF_HOME=home, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", CUDA_VISIBLE_DEVICES="",
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    jobs = {}
    for name, extra in (("sharded", {"NBDDP_MODE": "shard", "NBDDP_NPROC": "2"}), ("plain", {"NBDDP_NPROC": "1"})):
        cwd = os.path.join(work, name)
        shutil.rmtree(cwd, ignore_errors=True)
        os.makedirs(cwd)
        shutil.copy(script, cwd)
        runtime = os.path.splitext(script)[0] + "_runtime.py"
        if os.path.exists(runtime):
            shutil.copy(runtime, cwd)
        log = open(os.path.join(cwd, "run.log"), "w")
        jobs[name] = (subprocess.Popen([sys.executable, os.path.basename(script)], cwd=cwd, env=dict(env, **extra),
                                       stdout=log, stderr=subprocess.STDOUT), cwd)
    out = {}
    for name, (proc, cwd) in jobs.items():
        rc = proc.wait(timeout=900)
        text = open(os.path.join(cwd, "run.log"), errors="replace").read()
        results = {p: json.load(open(p)) for p in sorted(glob.glob(os.path.join(cwd, "bench-result-rank*.json")))
                   if os.path.getsize(p)}  # rank 0 writes it (the converted cell: the others leave it empty)
        out[name] = {"returncode": rc, "nbddp_lines": [ln for ln in text.splitlines() if ln.startswith("nbddp: ")],
                     "losses": {os.path.basename(p): r["losses"] for p, r in results.items()},
                     "adapter": os.path.exists(os.path.join(cwd, "lora_model", "adapter_model.safetensors"))}
        print(f"--- {name}: rc {rc}\n" + "\n".join(out[name]["nbddp_lines"]), flush=True)
        if rc:
            print(text[-4000:])
    a = out["sharded"]["losses"].get("bench-result-rank0.json") or []
    b = out["plain"]["losses"].get("bench-result-rank0.json") or []
    rel = max((abs(x - y) / abs(y) for x, y in zip(a, b)), default=None) if len(a) == len(b) and a else None
    out["max_rel_loss_diff"] = rel
    print(json.dumps({"sharded": a, "plain": b, "max_rel_diff": rel}))
    with open(os.path.join(work, "cpu-check.json"), "w") as fh:
        json.dump(out, fh, indent=1)
    return 0 if rel is not None and rel < 1e-4 and all(v["returncode"] == 0 for v in (out["sharded"], out["plain"])) else 1


def gpu(args):
    """On the GPU machine: the stand-in, the machine's record, then kaggle_t4 (its JSON and every run's log)."""
    out = args.out
    # the 16 GB checkpoint in memory (tmpfs) where /dev/shm has room for it and the host copies' 13 GB: no disk write
    home = "/dev/shm/hf" if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > 48 * 2 ** 30 else "/tmp/hf"
    os.environ.update(HF_HOME=home, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", NCCL_NVLS_ENABLE="0")
    t0 = time.time()
    with open(os.path.join(out, "machine.txt"), "w") as fh:
        fh.write(subprocess.run(["nvidia-smi", "--query-gpu=index,name,uuid,memory.total,driver_version",
                                 "--format=csv"], capture_output=True, text=True).stdout)
        from importlib.metadata import version
        for name in ("torch", "transformers", "peft", "accelerate", "safetensors", "bitsandbytes", "unsloth",
                     "unsloth_zoo", "trl", "datasets"):
            try:
                fh.write(f"{name} {version(name)}\n")
            except Exception:  # noqa: BLE001 (not installed: the notebook does not use it)
                fh.write(f"{name} not installed\n")
        fh.write(f"python {sys.version.split()[0]}; cores {os.cpu_count()}; HF_HOME {home}\n")
        fh.write(subprocess.run("df -h /dev/shm /tmp | tail -2; free -g | head -2", shell=True, capture_output=True,
                                text=True).stdout)
    if args.hub:  # offline_hub.py itself: every name Unsloth's mapper asks for, and the notebook's datasets
        build = subprocess.run([sys.executable, os.path.join(HERE, "offline_hub.py"), "--home", home, "--layers",
                                f"{args.hub.split(',')[0]}={args.layers}", "--models", args.hub.split(",")[0],
                                "--datasets", ",".join(args.hub.split(",")[1:]) or "none"],
                               capture_output=True, text=True)
    else:
        build = subprocess.run([sys.executable, os.path.abspath(__file__), "build", "--home", home, "--layers",
                                str(args.layers)], capture_output=True, text=True)
    built = round(time.time() - t0, 1)
    with open(os.path.join(out, "machine.txt"), "a") as fh:
        fh.write(f"stand-in built in {built} s (rc {build.returncode})\n{build.stdout[-2000:]}{build.stderr[-3000:]}\n")
        fh.write(subprocess.run(f"du -sh {home}/offlinehub-models/*; ls -la {home}/offlinehub-models/*/", shell=True,
                                capture_output=True, text=True).stdout)
    print(f"stand-in built in {built} s, rc {build.returncode}", flush=True)
    if build.returncode:
        print(build.stderr[-3000:])
        return 1
    import kaggle_t4
    argv = ["--script", args.script, "--gib", args.gib, "--runs", args.runs, "--sms", "8", "--skip", str(args.skip),
            "--rounds", str(args.rounds), "--first-round", str(args.first_round), "--timeout", str(args.timeout), "--out", os.path.join(out, "t4.json"),
            "--work", "/tmp/kaggle-t4"]
    if args.deadline:
        argv += ["--deadline", str(args.deadline - (time.time() - t0))]
    for item in args.env or []:
        argv += ["--env", item]
    try:
        kaggle_t4.main(argv)
    finally:
        with open(os.path.join(out, "logs.txt"), "w") as fh:
            for log in sorted(glob.glob("/tmp/kaggle-t4/*/run.log")):
                fh.write(f"===== {log}\n")
                fh.write(open(log, errors="replace").read())
            for res in sorted(glob.glob("/tmp/kaggle-t4/*/bench-result-rank*.json")):
                fh.write(f"===== {res}\n{open(res).read()}\n")
        results = {os.path.relpath(p, "/tmp/kaggle-t4"): json.load(open(p))
                   for p in sorted(glob.glob("/tmp/kaggle-t4/*/bench-result-rank*.json")) if os.path.getsize(p)}
        with open(os.path.join(out, "results.json"), "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("notebook")
    p.add_argument("--out", required=True)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=2e-3)
    p = sub.add_parser("build")
    p.add_argument("--home", required=True)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--tiny", action="store_true")
    p = sub.add_parser("cpu")
    p.add_argument("--script", required=True)
    p.add_argument("--work", default="/tmp/shard-nb-cpu")
    p = sub.add_parser("gpu")
    p.add_argument("--script", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--runs", default="self,split")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--first-round", type=int, default=0, help="kaggle_t4's: the number of the first round")
    p.add_argument("--skip", type=int, default=2)
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--deadline", type=float, help="seconds from this command's start (kaggle_t4's --deadline)")
    p.add_argument("--gib", default="15", help="kaggle_t4's --gib: free GiB left on each GPU")
    p.add_argument("--env", action="append", help="kaggle_t4's --env K=V (e.g. NBDDP_BENCH_ARGS=max_steps=10)")
    p.add_argument("--hub", help="FAMILY,DATASET,...: the stand-in built by offline_hub.py (every hub id Unsloth's "
                                 "mapper asks for, and these datasets) instead of this file's build")
    args = ap.parse_args(argv)
    if args.cmd == "notebook":
        write_notebook(args.out, args.seq, args.steps, rows=2 * args.steps, lr=args.lr)
        return 0
    if args.cmd == "build":
        print(build_hub(args.home, args.layers, args.tiny))
        return 0
    if args.cmd == "cpu":
        return cpu_check(args.script, args.work)
    return gpu(args)


if __name__ == "__main__":
    sys.exit(main())
