#!/usr/bin/env python3
"""Two "machines" of 2 GPUs each on one 4-GPU host: one corpus notebook as a 4-rank job over two torchrun launchers.

Step 1, here (nbddp installed): the notebook with two cells added before its training cell, a `!` line and a
`%%writefile` cell (the corpus' trainable notebooks have neither), converted by nbddp:
    python bench/two_machines.py convert --slug llama32-3b-conversational --dest .gpurun
Step 2, on a 4-GPU machine after bench/gpu_env.sh (the offline hub in $HF_HOME):
    python3 .gpurun/bench/two_machines.py run --script .gpurun/two-machines-llama32-3b-conversational.py \\
        --out $OUT/two-machines.json --env NBDDP_BENCH_ARGS=max_steps=10

Machine m (0 or 1) is `torchrun --nnodes=2 --node-rank=m --nproc-per-node=2` with a static rendezvous on
127.0.0.1, GPUs 2m and 2m+1, its own working folder and its own Hugging Face cache (a hard-linked copy of $HF_HOME:
what a run writes there is a new file of that machine's), as two machines without shared storage. Each rank runs
with the rank probe. The report checks what docs/running.md promises: 4 ranks train as one job and hold the same
weights at the end (the probe's SHA-256 of the trainable weights), which moved; saving and generation on global rank
0 only, the adapters in machine 0's folder only; the `!` line and `%%writefile` once on each machine; the dataset's
preparation filled each machine's own datasets cache; the Trainer logged its losses once in the whole job.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run_notebooks as rn  # noqa: E402

NODES, PER_NODE = 2, 2
ADDED = ["!hostname >> shell.log", "%%writefile notes.txt\nwritten once on each machine\n"]


def convert(slug, dest):
    from nbddp.notebook import read_notebook
    from nbddp.pipeline import convert_notebook
    import nbformat

    name = rn.NOTEBOOKS[slug]
    nb = read_notebook(os.path.join(rn.CORPUS, name))
    train = next(i for i, cell in enumerate(nb.cells) if cell.cell_type == "code" and ".train(" in cell.source)
    nb.cells[train:train] = [nbformat.v4.new_code_cell(src) for src in ADDED]
    script = f"two-machines-{slug}.py"
    conv = convert_notebook(nb, source_name=name, script_name=script, nproc=PER_NODE)
    with open(os.path.join(dest, script), "w", encoding="utf-8") as fh:
        fh.write(conv.script)
    print(f"converted {name} with {len(ADDED)} added cells -> {dest}/{script}")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def files_under(root):
    out = set()
    for where, _, names in os.walk(root):
        out.update(os.path.relpath(os.path.join(where, n), root) for n in names)
    return out


def run(args):
    work, hf = os.path.abspath(args.work), os.environ["HF_HOME"]
    shutil.rmtree(work, ignore_errors=True)
    port, procs, machines = free_port(), [], []
    env = rn.child_env(rn.parse_env(args.env))
    for node in range(NODES):
        root = os.path.join(work, f"machine{node}")
        folder, cache = os.path.join(root, "work"), os.path.join(root, "hf")
        os.makedirs(folder)
        subprocess.run(["cp", "-al", hf, cache], check=True)
        shutil.copy(args.script, folder)
        before = files_under(os.path.join(cache, "datasets"))
        node_env = dict(env, HF_HOME=cache, CUDA_VISIBLE_DEVICES=",".join(map(str, gpus(node))),
                        NBDDP_BENCH_PROBE_DIR=os.path.join(root, "probe"))
        job = rn.recipe.build(os.path.basename(args.script), PER_NODE, python=sys.executable, cpus=rn.recipe.cpu_count(),
                              env=node_env, routed=False, flags=[f"--nnodes={NODES}", f"--node-rank={node}",
                                                                 "--master-addr=127.0.0.1", f"--master-port={port}"])
        log = open(os.path.join(root, "run.log"), "w")
        procs.append((subprocess.Popen(job.argv, cwd=folder, env={**node_env, **job.env}, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True), log))
        machines.append({"root": root, "folder": folder, "cache": cache, "datasets_before": before})
    t0, codes = time.time(), []
    for proc, log in procs:
        try:
            codes.append(proc.wait(timeout=max(1, args.timeout - (time.time() - t0))))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            codes.append("timed out")
        log.close()
    report = {"machine": os.environ.get("BENCH_MACHINE"), "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "script": os.path.basename(args.script), "env": rn.parse_env(args.env), "launcher_exit": codes,
              "wall_s": round(time.time() - t0, 1), "machines": [], "ranks": {}}
    for node, m in enumerate(machines):
        text = open(os.path.join(m["root"], "run.log"), errors="replace").read()
        probes = rn.rank_probes(m["root"])
        report["ranks"].update({r: {k: p.get(k) for k in ("local_rank", "world_size", "generate", "save_pretrained",
                                                          "trainable_begin", "trainable_end", "phases", "device")}
                                for r, p in probes.items()})
        new = sorted(files_under(os.path.join(m["cache"], "datasets")) - m["datasets_before"])
        files = {f for f in files_under(m["folder"]) if not f.startswith("unsloth_compiled_cache/")}
        report["machines"].append({
            "node": node, "gpus": gpus(node), "files": sorted(files - {os.path.basename(args.script)}),
            "shell_log_lines": _lines(os.path.join(m["folder"], "shell.log")),
            "notes_txt": _lines(os.path.join(m["folder"], "notes.txt")),
            "datasets_cache_new_files": new, "loss_logs": len(rn.LOSS_RE.findall(text)),
            "nbddp_lines": [ln.strip() for ln in text.splitlines() if "nbddp: " in ln][:12],
            "errors": [ln.strip() for ln in text.splitlines() if "Error" in ln][-4:]})
        with open(os.path.join(args.logs, f"machine{node}.log"), "w") as fh:
            fh.write(text)
    report["checks"] = checks(report)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)
    print(json.dumps(report["checks"], indent=1))
    return 0 if all(report["checks"].values()) else 1


def gpus(node):
    return [node * PER_NODE + g for g in range(PER_NODE)]


def _lines(path):
    return open(path).read().splitlines() if os.path.exists(path) else None


def checks(report):
    ranks, (m0, m1) = report["ranks"], report["machines"]
    ends = {r: (p.get("trainable_end") or {}).get("sha256") for r, p in ranks.items()}
    begins = {r: (p.get("trainable_begin") or {}).get("sha256") for r, p in ranks.items()}
    adapters = {node: sorted({f.split("/")[0] for f in m["files"] if f.endswith("adapter_config.json")})
                for node, m in enumerate((m0, m1))}
    return {
        "both launchers exit 0": report["launcher_exit"] == [0, 0],
        "4 ranks, world size 4": sorted(ranks) == ["0", "1", "2", "3"] and
        all(p.get("world_size") == 4 for p in ranks.values()),
        "same trained weights on every rank": len(set(ends.values())) == 1 and None not in ends.values(),
        "the weights moved": all(begins[r] != ends[r] for r in ranks),
        "save_pretrained on rank 0 only": bool(ranks.get("0", {}).get("save_pretrained")) and
        not any(p.get("save_pretrained") for r, p in ranks.items() if r != "0"),
        "generate on rank 0 only": not any(p.get("generate") for r, p in ranks.items() if r != "0"),
        "adapters in machine 0's folder only": bool(adapters[0]) and not adapters[1],
        "! line once on each machine": m0["shell_log_lines"] is not None and len(m0["shell_log_lines"]) == 1
        and m1["shell_log_lines"] is not None and len(m1["shell_log_lines"]) == 1,
        "%%writefile once on each machine": m0["notes_txt"] == m1["notes_txt"] == ["written once on each machine"],
        "data preparation in each machine's own cache": bool(m0["datasets_cache_new_files"]) and
        bool(m1["datasets_cache_new_files"]),
        "losses logged once (machine 0 only)": m0["loss_logs"] > 0 and m1["loss_logs"] == 0,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert")
    c.add_argument("--slug", default="llama32-3b-conversational")
    c.add_argument("--dest", default=".gpurun")
    r = sub.add_parser("run")
    r.add_argument("--script", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--logs", default=".", help="folder for each machine's log")
    r.add_argument("--work", default="/tmp/two-machines")
    r.add_argument("--timeout", type=float, default=400)
    r.add_argument("--env", action="append", help="K=V for every rank (e.g. NBDDP_BENCH_ARGS=max_steps=10)")
    args = ap.parse_args(argv)
    return convert(args.slug, args.dest) if args.cmd == "convert" else run(args)


if __name__ == "__main__":
    sys.exit(main())
