"""Shared fixtures for the converter tests: the corpus location, one cached conversion per corpus notebook,
and a tiny notebook builder. Keep this small; put fixtures only one file needs in that file."""
from __future__ import annotations

import functools
import os
from pathlib import Path

import nbformat
import pytest

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "notebooks" / "unsloth"
CORPUS_NOTEBOOKS = sorted(CORPUS.glob("*.ipynb"))


CORPUS_MISSING = (f"the Unsloth corpus is not at {CORPUS}: these tests read ../shared/notebooks/unsloth beside the "
                  "checkout (a clone without it skips them; CI has it)")


def need_corpus(name: str | None = None) -> Path:
    """The corpus folder (or one notebook of it): skipped where the clone has no ../shared beside it, a failure under
    CI (`CI` set), which must have it."""
    if not CORPUS_NOTEBOOKS:
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail(CORPUS_MISSING, pytrace=False)
        pytest.skip(CORPUS_MISSING)
    return CORPUS if name is None else CORPUS / f"{name}.ipynb"


def corpus_ids():
    return [p.stem for p in CORPUS_NOTEBOOKS]


@functools.lru_cache(maxsize=None)
def _converted(path: str):
    from nbddp.pipeline import convert_notebook

    return convert_notebook(path, script_name="train_ddp.py")


@pytest.fixture(scope="session")
def converted():
    """converted(path) -> Conversion, computed once per session and shared between test files."""
    need_corpus()
    return lambda path: _converted(str(path))


def make_notebook(*cells) -> nbformat.NotebookNode:
    """A v4 notebook; each cell is code source text, or ("markdown", text)."""
    nb = nbformat.v4.new_notebook()
    for cell in cells:
        if isinstance(cell, tuple):
            nb.cells.append(nbformat.v4.new_markdown_cell(cell[1]))
        else:
            nb.cells.append(nbformat.v4.new_code_cell(cell))
    return nb


@pytest.fixture(scope="session")
def ip():
    """The one global IPython test shell (IPython's own helper), with `%load_ext nbddp` done."""
    from IPython.testing import globalipapp

    globalipapp.start_ipython()  # None on a second call: the shell is global, so fetch it below
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "nbddp")
    return shell


@pytest.fixture(scope="session")
def example_ddp_job(tmp_path_factory):
    """The example notebook, converted by `nbddp convert` and run once by `torchrun --nproc_per_node=2` (gloo):
    the reference the end-to-end tests check (test_e2e_ddp.py) and the `%ddp` session's training is compared with
    (test_session.py)."""
    import sys

    import nbddp
    from e2e import SCRIPT, run_job
    from tinymodels import EXAMPLE_NOTEBOOK

    cwd = tmp_path_factory.mktemp("ddp")
    (cwd / SCRIPT).write_text(nbddp.convert(str(EXAMPLE_NOTEBOOK)), encoding="utf-8")
    return run_job([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", SCRIPT], cwd)


def pytest_collection_modifyitems(config, items):
    """The files that run multi-process jobs (marked `ddp`) first, each file's tests in their order: with the README's
    `-n 2 --dist loadfile` the quick files fill in at the end, so both workers finish together."""
    jobs = {item.path for item in items if item.get_closest_marker("ddp")}
    items.sort(key=lambda item: item.path not in jobs)
