#!/usr/bin/env python3
"""The magics on GPUs, in a real Jupyter kernel (ipykernel, started by jupyter_client as JupyterLab and Kaggle start
it), with the rank probe (bench/rankprobe) counting `generate` and `save_pretrained` and timing the steps per rank.

`%%torchrun auto`: a notebook's training code as one cell.
    Here (nbformat installed):   python bench/magic_gpu.py cell NOTEBOOK > .gpurun/SLUG.cell
    GPU machine:                 python3 bench/magic_gpu.py run .gpurun/SLUG.cell $OUT/magic [--env K=V]
  The cell is the notebook's code cells joined, less those that start with a cell magic (the install cells, which a
  user keeps out of the training cell). Output: OUT/magic.log, OUT/magic.json.

`%ddp N`: the notebook itself, cell by cell, as a user runs it (install cells included: the ranks say they skip them).
    GPU machine:                 python3 bench/magic_gpu.py cellwise NOTEBOOK $OUT/cellwise [--nproc 2] [--env K=V]
  `%load_ext nbddp`, `%ddp N`, every code cell in order, then on the ranks a cell that gathers each rank's sum of
  the trainable weights (one model: the sums are equal) and one that writes the probe's files (a rank of `%ddp`
  leaves by os._exit, which skips the probe's atexit), `%ddp stop`. Output: OUT/cellwise.log (each
  cell's streamed output under its number), OUT/cellwise.json (per cell: status, seconds, rich outputs; per rank:
  GPU, steps trained, calls; the adapters saved).

The kernel needs ipykernel, jupyter_client, nbformat and libcst wheels (with their dependencies) in `.whl`.
"""
import argparse
import contextlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import run_notebooks as rn  # noqa: E402

KEEP = ("generate", "save_pretrained", "cuda_device", "gpu_uuid", "world_size", "peak_reserved_gib", "dist_initialized")
WORKER = os.path.join(ROOT, "nbddp", "cellwise", "worker.py")  # a %ddp rank's sys.argv[0] (python -m ...worker)
DUMP_PROBE = "import sitecustomize\nsitecustomize._dump()\n"  # the rank probe is the ranks' sitecustomize
SAME_MODEL = ("import torch, torch.distributed as dist\n"  # each rank's sum of its trainable weights, gathered
              "_mine = torch.stack([p.detach().float().sum() for p in model.parameters() if p.requires_grad]).sum()\n"
              "_sums = [torch.zeros_like(_mine) for _ in range(dist.get_world_size())]\n"
              "dist.all_gather(_sums, _mine)\n"
              "print('trainable weight sums by rank:', [round(s.item(), 6) for s in _sums])\n")


def cell(notebook):
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    return "\n\n".join(c.source for c in nb.cells if c.cell_type == "code" and not c.source.lstrip().startswith("%%"))


@contextlib.contextmanager
def kernel(work, env, script):
    """A kernel in `work` whose processes see this nbddp and the rank probe; only `script`'s processes write probes."""
    from jupyter_client.manager import start_new_kernel

    os.makedirs(work, exist_ok=True)
    kernel_env = rn.child_env(dict(env, NBDDP_BENCH_PROBE_DIR=os.path.join(work, "probe"), NBDDP_BENCH_SCRIPT=script))
    kernel_env["PYTHONPATH"] = os.pathsep.join([ROOT, kernel_env["PYTHONPATH"]])
    km, kc = start_new_kernel(kernel_name="python3", cwd=work, env=kernel_env)
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def execute(kc, code, timeout):
    """Run one cell; (status, seconds, streamed text and tracebacks, rich outputs' mime types)."""
    text, rich = [], []

    def hook(msg):
        content, kind = msg["content"], msg["msg_type"]
        if kind == "stream":
            text.append(content["text"])
        elif kind == "error":
            text.append("\n".join(content["traceback"]))
        elif kind in ("display_data", "update_display_data", "execute_result"):
            rich.append(sorted(content["data"]))
    start = time.time()
    try:
        status = kc.execute_interactive(code, timeout=timeout, output_hook=hook)["content"]["status"]
    except TimeoutError:
        status = "timeout"
    return status, round(time.time() - start, 1), "".join(text), rich


def ranks_and_adapters(work):
    probes = rn.rank_probes(work)
    ranks = {rank: dict({k: p.get(k) for k in KEEP}, steps=len(p.get("step_end_times") or [])) for rank, p in probes.items()}
    return ranks, rn.adapter_dirs(work)


def write(out, name, log, outcome):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.log"), "w") as fh:
        fh.write(log)
    with open(os.path.join(out, f"{name}.json"), "w") as fh:
        json.dump(outcome, fh, indent=1)
    print(json.dumps(outcome)[:3000])


def run(cell_file, out, env):
    work = os.path.join("/tmp", "magic-work")
    start = time.time()
    with kernel(work, env, os.path.join(work, "train_ddp.py")) as kc:  # only ranks write probes
        loaded, _, log1, _ = execute(kc, "%load_ext nbddp", 120)
        body = open(cell_file, encoding="utf-8").read()
        status, _, log2, _ = execute(kc, "%%torchrun auto\n" + body, 540)
    ranks, adapters = ranks_and_adapters(work)
    write(out, "magic", log1 + log2, {"load_ext": loaded, "cell": status, "wall_s": round(time.time() - start, 1),
                                      "ranks": ranks, "adapters": adapters, "env": env})
    return 0 if status == "ok" else 1


def cellwise(notebook, out, nproc, env, timeout):
    import nbformat

    sources = [c.source for c in nbformat.read(notebook, as_version=4).cells
               if c.cell_type == "code" and c.source.strip()]
    work = os.path.join("/tmp", "cellwise-work")
    steps = [("load", "%load_ext nbddp"), ("start", f"%ddp {nproc}"), ("where", "%ddp")]
    steps += [(f"notebook cell {i}", src) for i, src in enumerate(sources, 1)]
    steps += [("same model", SAME_MODEL), ("probe", DUMP_PROBE), ("stop", "%ddp stop")]
    cells, log, start = [], [], time.time()
    with kernel(work, env, WORKER) as kc:
        for label, code in steps:
            status, seconds, text, rich = execute(kc, code, timeout)
            cells.append({"cell": label, "status": status, "seconds": seconds, "rich": rich,
                          "first_line": code.strip().splitlines()[0][:80]})
            log.append(f"===== {label} ({status}, {seconds} s): {cells[-1]['first_line']}\n{text}\n")
            print(f"{label}: {status} in {seconds} s", flush=True)
            if status == "timeout":
                break
    ranks, adapters = ranks_and_adapters(work)
    failed = [c["cell"] for c in cells if c["status"] != "ok"]
    sums = next((line.split(":", 1)[1].strip() for line in "".join(log).splitlines()
                 if line.startswith("trainable weight sums by rank:")), None)
    write(out, "cellwise", "".join(log), {"notebook": os.path.basename(notebook), "nproc": nproc, "cells": cells,
                                          "failed": failed, "trainable_weight_sums": sums, "wall_s": round(time.time() - start, 1), "ranks": ranks,
                                          "adapters": adapters, "env": env})
    return 0 if not failed else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cell", help="print the training cell of a notebook")
    c.add_argument("notebook")
    for name, what, helptext in (("run", "cell_file", "run the cell as %%%%torchrun auto in a new kernel"),
                                 ("cellwise", "notebook", "run the notebook cell by cell under %%ddp N")):
        r = sub.add_parser(name, help=helptext)
        r.add_argument(what)
        r.add_argument("out")
        r.add_argument("--env", action="append", default=[], metavar="K=V", help="for the kernel and its ranks")
        if name == "cellwise":
            r.add_argument("--nproc", type=int, default=2)
            r.add_argument("--timeout", type=float, default=300, help="seconds per cell")
    args = ap.parse_args(argv)
    if args.cmd == "cell":
        print(cell(args.notebook))
        return 0
    env = rn.parse_env(args.env)
    if args.cmd == "run":
        return run(args.cell_file, args.out, env)
    return cellwise(args.notebook, args.out, args.nproc, env, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
