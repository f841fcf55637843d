"""How long `nbddp convert` takes on one notebook: the conversion alone (in-process, best of N) and the whole
command (a fresh interpreter, as a user runs it), for the checkout on PYTHONPATH.

    PYTHONPATH=$PWD python bench/convert_speed.py [NOTEBOOK] [--repeat N] [--cells N]

`--cells N`: the notebook's code cells repeated to N cells (a long notebook; in-process only, no command runs).

Prints one JSON line: the notebook, the nbddp commit, the best and median in-process seconds, the command's best
seconds (`--commands` runs), and whether the conversion imported torch or transformers (it must not).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared/notebooks/unsloth/Kaggle-Llama3.1_(8B)-Alpaca.ipynb"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("notebook", nargs="?", default=str(DEFAULT))
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--commands", type=int, default=3, help="runs of the whole command (the best is printed)")
    parser.add_argument("--cells", type=int, help="the notebook's code cells repeated to this many cells")
    args = parser.parse_args()
    import nbformat

    import nbddp
    from nbddp.pipeline import convert_notebook

    notebook = nbformat.read(args.notebook, as_version=4)
    if args.cells:
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        notebook.cells = [nbformat.v4.new_code_cell(code[i % len(code)].source) for i in range(args.cells)]
    convert_notebook(notebook)  # warm: imports, the runtime's files read once
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        convert_notebook(notebook)
        times.append(time.perf_counter() - start)
    commands = []
    with tempfile.TemporaryDirectory() as out:
        for _ in range(0 if args.cells else args.commands):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "nbddp", "convert", args.notebook, "-o", os.path.join(out, "t.py")],
                           check=True, capture_output=True)
            commands.append(time.perf_counter() - start)
    root = Path(nbddp.__file__).resolve().parents[1]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True).stdout
    print(json.dumps({"notebook": Path(args.notebook).name, "cells": args.cells, "commit": commit.strip(),
                      "nbddp": str(root),
                      "best_s": round(min(times), 4), "median_s": round(statistics.median(times), 4),
                      "command_s": round(min(commands), 3) if commands else None,
                      "imported": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))


if __name__ == "__main__":
    main()
