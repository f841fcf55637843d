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


TRAINS = "import torch\nmodel = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(model.parameters(), lr = 0.1)\n" \
         "for step in range(2):\n    model(torch.ones(4, 2)).sum().backward()\n    opt.step()\n    opt.zero_grad()\n"


@pytest.mark.parametrize("cell, ok", [
    ("import sys\nprint('REST', flush=True)\nsys.exit(0)\n", True),
    ("print('REST', flush=True)\nraise SystemExit(3)\n", False),
    ("print('REST', flush=True)\nraise RuntimeError('in the rest')\n", False),
])
def test_an_exit_after_training_ends_the_ranks_waiting_for_rank_0(tmp_path, cell, ok):
    """After training's end rank 0 runs on alone; its exit or error there ends the other ranks too (they wait for it
    at the script's end), with its status, at once."""
    done, conversion = run_notebook([TRAINS, cell, "print('AFTER THE EXIT', flush=True)\n"], tmp_path, timeout=120)
    assert "nbddp_rest_on_rank0()" in conversion.script
    assert (done.returncode == 0) == ok, done.explain()
    assert done.count("REST") == 1 and "AFTER THE EXIT" not in done.stdout, done.explain()
    assert done.seconds < 60, done.explain()
