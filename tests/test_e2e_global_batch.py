"""End to end on CPU: the example notebook with `gradient_accumulation_steps = 2`, converted by default, trains on 2
gloo ranks with the losses of one process, step by step (the notebook's global batch kept: each rank accumulates 1);
converted with `--scale-batch`, the 2 ranks train twice the samples a step, as DDP alone does.
"""
from __future__ import annotations

import sys

import pytest

from e2e import MAX_STEPS, PER_DEVICE, ROWS, SCRIPT, assert_clean_exit, run_jobs
from nbddp.pipeline import convert_notebook
from nbddp.transforms.base import Options
from tinymodels import EXAMPLE_NOTEBOOK

pytestmark = pytest.mark.ddp
ACCUMULATION = 2


def _notebook():
    import nbformat

    nb = nbformat.read(str(EXAMPLE_NOTEBOOK), as_version=4)
    for cell in nb.cells:
        cell.source = cell.source.replace("gradient_accumulation_steps = 1,", f"gradient_accumulation_steps = {ACCUMULATION},")
    assert any(f"gradient_accumulation_steps = {ACCUMULATION}," in cell.source for cell in nb.cells)
    return nb


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three jobs, each in its own folder, at once (e2e.run_jobs): nothing here reads time."""
    names, started = [], []
    for name, options, nproc in (("one", Options(), 1), ("kept", Options(), 2), ("scaled", Options(scale_batch=True), 2)):
        cwd = tmp_path_factory.mktemp(name)
        (cwd / SCRIPT).write_text(convert_notebook(_notebook(), options=options).script, encoding="utf-8")
        argv = [sys.executable, SCRIPT] if nproc == 1 else \
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", SCRIPT]
        names.append(name)
        started.append((argv, cwd, {"NBDDP_NPROC": str(nproc)}))
    return dict(zip(names, run_jobs(started)))


def test_two_ranks_train_the_notebooks_batch_with_one_process_losses(runs):
    one, kept = runs["one"], runs["kept"]
    assert_clean_exit(one)
    assert_clean_exit(kept)
    assert kept.count("nbddp: 2 processes keep the notebook's batch of 4: gradient_accumulation_steps 2 -> 1 per "
                      "rank") == 1, kept.explain()
    ones, twos = one.trainer_logs(), kept.trainer_logs()
    assert len(ones) == len(twos) == MAX_STEPS, kept.explain()
    epoch = MAX_STEPS * PER_DEVICE * ACCUMULATION / ROWS  # the same samples: the same epoch
    assert ones[-1]["epoch"] == twos[-1]["epoch"] == pytest.approx(epoch)
    for a, b in zip(ones, twos):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3), (ones, twos)


def test_scale_batch_trains_twice_the_samples_a_step(runs):
    scaled = runs["scaled"]
    assert_clean_exit(scaled)
    assert scaled.count("nbddp: 2 processes train 2 x 2 x 2 = 8 samples a step (NBDDP_BATCH=scale; the notebook "
                        "of 4)") == 1, scaled.explain()
    assert scaled.trainer_logs()[-1]["epoch"] == pytest.approx(MAX_STEPS * PER_DEVICE * ACCUMULATION * 2 / ROWS)
