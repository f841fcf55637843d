#!/usr/bin/env python3
"""The magic on GPUs: a real Jupyter kernel (ipykernel, started by jupyter_client as JupyterLab and Kaggle start
it) runs `%load_ext nbddp` and a notebook's training code as one `%%torchrun auto` cell.

Here (nbformat installed):   python bench/magic_gpu.py cell NOTEBOOK > .gpurun/SLUG.cell
GPU machine (.gpurun carried, ipykernel and jupyter_client among the wheels):
    python3 bench/magic_gpu.py run .gpurun/SLUG.cell $OUT/magic [--env NBDDP_BENCH_ARGS=max_steps=20]
The cell is the notebook's code cells joined, less those that start with a cell magic (the install cells, which
a user keeps out of the training cell). The rank probe (bench/rankprobe) counts `generate` and `save_pretrained`
per rank; the cell's streamed output goes to OUT/magic.log and the outcome, as JSON, to OUT/magic.json.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run_notebooks as rn  # noqa: E402


def cell(notebook):
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    return "\n\n".join(c.source for c in nb.cells if c.cell_type == "code" and not c.source.lstrip().startswith("%%"))


def run(cell_file, out, env):
    from jupyter_client.manager import start_new_kernel

    os.makedirs(out, exist_ok=True)
    work = os.path.join("/tmp", "magic-work")
    os.makedirs(work, exist_ok=True)
    kernel_env = rn.child_env(dict(env, NBDDP_BENCH_PROBE_DIR=os.path.join(work, "probe"),
                                   NBDDP_BENCH_SCRIPT=os.path.join(work, "train_ddp.py")))  # only ranks write probes
    kernel_env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), kernel_env["PYTHONPATH"]])  # this nbddp
    km, kc = start_new_kernel(kernel_name="python3", cwd=work, env=kernel_env)
    text = []

    def hook(msg):
        content = msg["content"]
        if msg["msg_type"] == "stream":
            text.append(content["text"])
        elif msg["msg_type"] == "error":
            text.append("\n".join(content["traceback"]))

    start = time.time()
    try:
        loaded = kc.execute_interactive("%load_ext nbddp", timeout=120, output_hook=hook)["content"]["status"]
        body = open(cell_file, encoding="utf-8").read()
        status = kc.execute_interactive("%%torchrun auto\n" + body, timeout=540, output_hook=hook)["content"]["status"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    with open(os.path.join(out, "magic.log"), "w") as fh:
        fh.write("".join(text))
    keep = ("generate", "save_pretrained", "cuda_device", "gpu_uuid", "world_size", "peak_reserved_gib",
            "dist_initialized")
    ranks = {rank: {k: p.get(k) for k in keep} for rank, p in rn.rank_probes(work).items()}
    outcome = {"load_ext": loaded, "cell": status, "wall_s": round(time.time() - start, 1), "ranks": ranks,
               "adapters": rn.adapter_dirs(work),
               "env": env}
    with open(os.path.join(out, "magic.json"), "w") as fh:
        json.dump(outcome, fh, indent=1)
    print(json.dumps(outcome))
    return 0 if status == "ok" else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cell", help="print the training cell of a notebook")
    c.add_argument("notebook")
    r = sub.add_parser("run", help="run the cell as %%%%torchrun auto in a new kernel")
    r.add_argument("cell_file")
    r.add_argument("out")
    r.add_argument("--env", action="append", default=[], metavar="K=V", help="for the kernel and its ranks")
    args = ap.parse_args(argv)
    if args.cmd == "cell":
        print(cell(args.notebook))
        return 0
    return run(args.cell_file, args.out, dict(kv.split("=", 1) for kv in args.env))


if __name__ == "__main__":
    sys.exit(main())
