"""End to end on CPU: a notebook that ends itself early (`sys.exit()`, `exit()`, `raise SystemExit`, at the top level
or in a block) ends every rank of a 2-process job: nothing after it runs, the job ends at once with the notebook's
status (0, or a failure for a non-zero one; torchrun reports a failed rank as status 1)."""
from __future__ import annotations

import pytest

from e2e import notebook_job, run_jobs

pytestmark = pytest.mark.ddp


EARLY = [
    ("import sys\nprint('before', flush=True)\nsys.exit(0)\n", True),
    ("done = True\nif done:\n    exit()\n", True),
    ("raise SystemExit(3)\n", False),
]
TRAINS = "import torch\nmodel = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(model.parameters(), lr = 0.1)\n" \
         "for step in range(2):\n    model(torch.ones(4, 2)).sum().backward()\n    opt.step()\n    opt.zero_grad()\n"
REST = [
    ("import sys\nprint('REST', flush=True)\nsys.exit(0)\n", True),
    ("print('REST', flush=True)\nraise SystemExit(3)\n", False),
    ("print('REST', flush=True)\nraise RuntimeError('in the rest')\n", False),
]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Every case's job, each in its own folder; the three of each test at once (e2e.run_jobs: each job's seconds
    are its own, far below the bound): {cell: (the job, the conversion)}."""
    done = {}
    for first, cases in (("import torch\nt = torch.ones(1)\n", EARLY), (TRAINS, REST)):
        started, conversions = [], []
        for cell, _ in cases:
            launch, conversion = notebook_job([first, cell, "print('AFTER THE EXIT', flush=True)\n"],
                                              tmp_path_factory.mktemp("exit"))
            started.append(launch)
            conversions.append(conversion)
        done.update({cell: (job, conversion) for (cell, _), job, conversion
                     in zip(cases, run_jobs(started, timeout=120), conversions)})
    return done


@pytest.mark.parametrize("cell, ok", EARLY)
def test_an_early_exit_ends_every_rank_with_its_status(jobs, cell, ok):
    done, _ = jobs[cell]
    assert (done.returncode == 0) == ok, done.explain()
    assert "AFTER THE EXIT" not in done.stdout, done.explain()
    assert done.seconds < 60, done.explain()


@pytest.mark.parametrize("cell, ok", REST)
def test_an_exit_after_training_ends_the_ranks_waiting_for_rank_0(jobs, cell, ok):
    """After training's end rank 0 runs on alone; its exit or error there ends the other ranks too (they wait for it
    at the script's end), with its status, at once."""
    done, conversion = jobs[cell]
    assert "nbddp_rest_on_rank0()" in conversion.script
    assert (done.returncode == 0) == ok, done.explain()
    assert done.count("REST") == 1 and "AFTER THE EXIT" not in done.stdout, done.explain()
    assert done.seconds < 60, done.explain()
