#!/usr/bin/env python3
"""A notebook as a plain Python script, without nbddp's DDP changes: the baselines of issue 6.

    python bench/plain_script.py NOTEBOOK.ipynb OUT.py

The code cells in order, with IPython magics and shell lines handled by nbddp's own first two steps (installs
dropped); nothing else changes: no device placement, no rank guards, no process group, no runtime layer. Launched
as `python OUT.py` with two GPUs visible it is the notebook as people run it today (one process; Hugging Face's
Trainer then wraps the model in DataParallel); launched as `torchrun --nproc_per_node=2 OUT.py` it is Unsloth's
documented DDP path (any training script under torchrun; Unsloth reads LOCAL_RANK itself).
"""
from __future__ import annotations

import os
import sys

# what nbddp's Magics step may call, defined the plain way (no once-per-node logic)
HELPERS = """import subprocess as _subprocess


def nbddp_shell(command, shell=True):
    return _subprocess.run(command, shell=True, executable=None if shell is True else shell).returncode


def nbddp_getoutput(command):
    done = _subprocess.run(command, shell=True, capture_output=True, text=True)
    return (done.stdout + done.stderr).splitlines()


def nbddp_write_file(path, text, append=False):
    with open(path, "a" if append else "w", encoding="utf-8") as fh:
        fh.write(text)

"""


def plain_script(notebook, source_name=None):
    """`notebook`: anything nbddp.notebook.as_notebook reads (a path, or a notebook already read; either way a
    fresh copy comes back, so the steps below change no caller's object)."""
    from nbddp.notebook import as_notebook
    from nbddp.pipeline import CodeCells
    from nbddp.report import Report
    from nbddp.transforms.base import Context, Options
    from nbddp.transforms.magics import Magics

    source_name = source_name or os.path.basename(notebook)
    ctx = Context(report=Report(source=source_name), options=Options())
    nb = as_notebook(notebook)
    for step in (CodeCells(), Magics()):
        nb = step.preprocess(nb, ctx)
    cells = [f"# %% cell {c.metadata['nbddp']['cell']}\n{c.source.rstrip()}\n" for c in nb.cells]
    head = f'"""{source_name} as a plain script (bench/plain_script.py): no DDP changes."""\n'
    return head + HELPERS + "\n".join(cells)


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    with open(args[1], "w", encoding="utf-8") as fh:
        fh.write(plain_script(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
