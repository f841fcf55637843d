#!/usr/bin/env python3
"""Issue 4's GPU check: a real IPython shell runs `%load_ext nbddp` and a `%%torchrun 2` cell that trains.

    python3 bench/magic_gpu.py CELL_FILE LOG
CELL_FILE holds the cell body (a notebook's training code); the magic's streamed output is written to LOG and
the outcome printed as JSON.
"""
import json
import sys
import time

from IPython.core.interactiveshell import InteractiveShell


def main(cell_file, log):
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbddp")
    cell = open(cell_file, encoding="utf-8").read()
    start = time.time()
    result = shell.run_cell("%%torchrun 2 --out magic_train_ddp.py\n" + cell)
    outcome = {"ok": result.success, "error": repr(result.error_in_exec or result.error_before_exec),
               "wall_s": round(time.time() - start, 1), "log": log}
    print(json.dumps(outcome))
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
