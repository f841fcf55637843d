#!/usr/bin/env python3
"""A notebook as a plain Python script, without nbddp's DDP changes: the baselines of issue 6.

    python bench/plain_script.py NOTEBOOK.ipynb OUT.py

The product's own plain script (`nbddp.pipeline.plain_script`, docs/conversion.md): the code cells in order, with
IPython magics and shell lines handled by nbddp's first two steps (installs dropped) and the runtime helpers those
lines call, as a converted script carries them; nothing else changes: no device placement, no rank guards, no
launch, no runtime layer. Launched as `python OUT.py` with two GPUs visible it is the notebook as people run it
today (one process; Hugging Face's Trainer then wraps the model in DataParallel); launched as
`torchrun --nproc_per_node=2 OUT.py` it is Unsloth's documented DDP path (any training script under torchrun;
Unsloth reads LOCAL_RANK itself).
"""
from __future__ import annotations

import os
import sys


def plain_script(notebook, source_name=None):
    """`notebook`: a path, or a notebook already read (nbddp reads a fresh copy: no caller's object changes)."""
    from nbddp.pipeline import plain_script as plain

    return plain(notebook, source_name=source_name or os.path.basename(notebook))


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
