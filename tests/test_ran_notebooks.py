"""`%run other.ipynb` (nbddp.transforms.ran_notebooks): the other notebook's code cells stand in place of the line, as
IPython runs them in the notebook's namespace, and each of their statements is placed by what it does, as the
notebook's own are. Read from beside the notebook, never run; a notebook the converter cannot read, or one that runs
itself, is removed with a line that says so."""
from __future__ import annotations

import nbformat
import pytest

from conftest import make_notebook
from nbddp.errors import ConversionError
from nbddp.pipeline import convert_notebook

TRAIN = "from trl import SFTTrainer\ntrainer = SFTTrainer(model=model, train_dataset=rows[:BATCH])\ntrainer.train()\n"
HELPERS = [("markdown", "# what the notebooks share"), "import json\nBATCH = 4\ndef fmt(x):\n    return json.dumps(x)\n",
           "%run ping.ipynb\n"]
PING = ["import requests\nrequests.post('https://x/hook', json={'start': 1})\n", "rows = list(range(8))\n"]


def _convert(folder, *cells, **notebooks):
    for name, their_cells in notebooks.items():
        nbformat.write(make_notebook(*their_cells), folder / f"{name}.ipynb")
    path = folder / "main.ipynb"
    nbformat.write(make_notebook(*cells), path)
    conversion = convert_notebook(str(path))
    return [cell.source for cell in conversion.cells], str(conversion.report)


def test_the_cells_of_a_notebook_it_runs_stand_in_its_place_and_are_placed_by_what_they_do(tmp_path):
    cells, report = _convert(tmp_path, "import os\n%run helpers.ipynb\nprint(fmt(BATCH))\n", TRAIN,
                             helpers=HELPERS, ping=PING)
    first = cells[0]
    assert "# %run helpers.ipynb, cell 2\nimport json\nBATCH = 4\n" in first, first  # training reads BATCH
    assert "# %run helpers.ipynb, cell 3\n# %run ping.ipynb, cell 1\n" in first, first  # a notebook it runs, in turn
    assert "if NBDDP_IS_MAIN:\n    requests.post(" in first, first  # an effect: once
    assert "rows = list(range(8))\n" in first and "NBDDP_IS_MAIN:\n    rows" not in first, first  # training reads it
    assert "`%run helpers.ipynb`: its 2 code cells converted in its place" in report, report


def test_a_notebook_run_through_get_ipython_or_over_cells_is_read_the_same(tmp_path):
    cells, _ = _convert(tmp_path, "ip = get_ipython()\n", "ip.run_line_magic('run', 'ping.ipynb')\n", TRAIN.replace(
        "rows[:BATCH]", "rows"), ping=PING)
    assert "# %run ping.ipynb, cell 2\nrows = list(range(8))\n" in cells[1], cells[1]
    assert "run_line_magic" not in "".join(cells), cells


def test_a_notebook_the_converter_cannot_read_or_that_runs_itself_is_removed_and_said(tmp_path):
    cells, report = _convert(tmp_path, "%run missing.ipynb\n", "%run loop.ipynb\nX = 1\n", loop=["%run loop.ipynb\n"])
    assert "# nbddp: removed `%run missing.ipynb`" in cells[0], cells[0]
    assert "`%run missing.ipynb` removed: the converter cannot read that notebook" in report, report
    assert "# %run loop.ipynb, cell 1\n# nbddp: removed `%run loop.ipynb`" in cells[1], cells[1]  # once, not forever
    assert cells[1].endswith("X = 1\n"), cells[1]


def test_a_method_of_that_name_on_another_value_runs_no_notebook(tmp_path):
    """Only IPython's shell runs a notebook: `tool.run_line_magic('run', ...)` of another value is left as written."""
    cells, _ = _convert(tmp_path, "import mylib\ntool = mylib.Tool()\ntool.run_line_magic('run', 'ping.ipynb')\n",
                        ping=PING)
    assert "tool.run_line_magic('run', 'ping.ipynb')" in cells[0] and "# %run" not in cells[0], cells[0]


SETUP = ["import json\nBATCH = 4\nDOC = '''first\nsecond'''\n", "!echo ready\ndef fmt(x):\n    return json.dumps(x)\n"]


def test_a_notebook_run_inside_a_block_stands_in_the_block(tmp_path):
    cells, report = _convert(tmp_path, "import os\nif not os.path.exists('done'):\n    %run setup.ipynb\n",
                             "try:\n    get_ipython().run_line_magic('run', 'ping.ipynb')\nexcept OSError:\n    pass\n",
                             TRAIN, setup=SETUP, ping=PING)
    assert "if not os.path.exists('done'):\n    # %run setup.ipynb, cell 1\n    import json\n    BATCH = 4\n" \
           "    DOC = '''first\nsecond'''\n" in cells[0], cells[0]  # the string as it was
    assert "    # %run setup.ipynb, cell 2\n    nbddp_shell('echo ready')\n    def fmt(x):\n        return" in cells[0]
    assert "try:\n    # %run ping.ipynb, cell 1\n    import requests\n" in cells[1], cells[1]
    assert "    rows = list(range(8))\n" in cells[1], cells[1]
    assert "`%run setup.ipynb`: its 2 code cells converted in its place inside a block" in report, report


def test_a_notebook_run_inside_a_function_or_class_binds_the_notebook_s_names(tmp_path):
    cells, report = _convert(tmp_path, "ip = get_ipython()\ndef prepare(flag):\n    if flag:\n"
                                       "        ip.run_line_magic('run', 'setup.ipynb')\n    return BATCH\n"
                                       "prepare(True)\n",
                             "class Kit:\n    %run ping.ipynb\n", TRAIN, setup=SETUP, ping=PING)
    assert "    if flag:\n        # %run setup.ipynb, cell 1\n        global BATCH, DOC, fmt, json\n" \
        "        import json\n" in cells[0], cells[0]  # IPython binds them in the notebook's namespace
    assert "class Kit:\n    # %run ping.ipynb, cell 1\n    global requests, rows\n" in cells[1], cells[1]
    assert "inside a function, its names the notebook's (`global`)" in report, report
    compile("".join(cells), "script", "exec")


def test_a_notebook_run_inside_a_function_that_uses_its_names_as_its_own_is_said(tmp_path):
    cells, report = _convert(tmp_path, "def prepare():\n    BATCH = 2\n    %run setup.ipynb\n    return BATCH\n",
                             setup=SETUP)
    assert "global" not in cells[0] and "# %run setup" not in cells[0], cells[0]
    assert "`%run setup.ipynb` inside a function: its cells bind names the function also uses" in report, report


def test_a_cell_of_the_notebook_it_runs_that_is_not_python_stops_the_conversion_naming_that_cell(tmp_path):
    broken = [("markdown", "# set-up"), "x = 1\n", "def broken(:\n    pass\n"]
    for cell in ("%run broken.ipynb\n", "if True:\n    %run broken.ipynb\n"):
        with pytest.raises(ConversionError) as stop:
            _convert(tmp_path, cell, broken=broken)
        assert str(stop.value) == "cell 1: `%run broken.ipynb`: cell 3 of broken.ipynb, line 1: not valid Python " \
                                  "(invalid syntax); fix it in broken.ipynb", str(stop.value)
