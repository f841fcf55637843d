"""End to end on CPU: a notebook that ends itself early (`sys.exit()`, `exit()`, `raise SystemExit`, at the top level
or in a block) ends every rank of a 2-process job: nothing after it runs, the job ends at once with the notebook's
status (0, or a failure for a non-zero one; torchrun reports a failed rank as status 1)."""
from __future__ import annotations

import pytest

from e2e import run_notebook

pytestmark = pytest.mark.ddp


@pytest.mark.parametrize("cell, ok", [
    ("import sys\nprint('before', flush=True)\nsys.exit(0)\n", True),
    ("done = True\nif done:\n    exit()\n", True),
    ("raise SystemExit(3)\n", False),
])
def test_an_early_exit_ends_every_rank_with_its_status(tmp_path, cell, ok):
    done, _ = run_notebook(["import torch\nt = torch.ones(1)\n", cell, "print('AFTER THE EXIT', flush=True)\n"],
                           tmp_path, timeout=120)
    assert (done.returncode == 0) == ok, done.explain()
    assert "AFTER THE EXIT" not in done.stdout, done.explain()
    assert done.seconds < 60, done.explain()
