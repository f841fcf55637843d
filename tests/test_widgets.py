"""Before/after tests for notebook-only front-ends (issue 40, item 4): tqdm's notebook bars become tqdm.auto (text bars
in a script), each spelling written several ways (inside a function, through an alias, over two cells), with what must
NOT change beside it; ipywidgets imports are a warning. One real run checks the script draws a text bar."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import make_notebook
from nbddp.pipeline import convert_notebook
from test_idioms import cells, convert

CHANGES = [
    cells(["from tqdm.notebook import tqdm, trange\nfor _ in tqdm(trange(3)):\n    pass\n"],
          ["from tqdm.auto import tqdm, trange\nfor _ in tqdm(trange(3)):\n    pass\n"], "from tqdm.notebook"),
    cells(["from tqdm.autonotebook import tqdm as bar\n"], ["from tqdm.auto import tqdm as bar\n"], "from autonotebook"),
    cells(["import tqdm.notebook as tq\nx = tq.tqdm(range(2))\n"], ["import tqdm.auto as tq\nx = tq.tqdm(range(2))\n"],
          "import tqdm.notebook as"),
    cells(["from tqdm import tqdm_notebook\n"], ["from tqdm.auto import tqdm as tqdm_notebook\n"], "tqdm_notebook"),
    cells(["from tqdm import tnrange as tr, tqdm_notebook as tn\n"],
          ["from tqdm.auto import trange as tr, tqdm as tn\n"], "aliased tnrange, tqdm_notebook"),
    cells(["from tqdm import tqdm, tnrange\n"], ["from tqdm import tqdm\nfrom tqdm.auto import trange as tnrange\n"],
          "split from the plain tqdm"),
    cells(["from tqdm import notebook\nx = notebook.tqdm(1)\n"],
          ["from tqdm import auto as notebook\nx = notebook.tqdm(1)\n"], "from tqdm import notebook"),
    cells(["import tqdm.notebook\nx = tqdm.notebook.tqdm(1)\n"], ["import tqdm.auto\nx = tqdm.auto.tqdm(1)\n"],
          "import tqdm.notebook, attribute use"),
    cells(["import tqdm\nx = tqdm.tqdm_notebook(1)\ny = tqdm.tnrange(2)\n"],
          ["import tqdm\nimport tqdm.auto\nx = tqdm.auto.tqdm(1)\ny = tqdm.auto.trange(2)\n"], "module attributes"),
    cells(["import tqdm as t\nx = t.autonotebook.tqdm(1)\n"],
          ["import tqdm as t\nimport tqdm.auto as nbddp_t_auto\nx = t.auto.tqdm(1)\n"], "module alias"),
    cells(["def f():\n    import tqdm\n    return tqdm.notebook.tqdm(range(2))\n"],
          ["def f():\n    import tqdm\n    import tqdm.auto\n    return tqdm.auto.tqdm(range(2))\n"], "inside a function"),
    cells(["import tqdm\n", "def f(xs):\n    for x in tqdm.tqdm_notebook(xs):\n        pass\n"],
          ["import tqdm\nimport tqdm.auto\n", "def f(xs):\n    for x in tqdm.auto.tqdm(xs):\n        pass\n"],
          "two cells"),
    cells(["from tqdm.notebook import tqdm\n", "def f(xs):\n    return [x for x in tqdm(xs)]\n"],
          ["from tqdm.auto import tqdm\n", "def f(xs):\n    return [x for x in tqdm(xs)]\n"], "two cells, from"),
]

# what must not change, each beside a notebook bar that does
SAME = [
    cells(["from tqdm.notebook import trange\nfrom tqdm.auto import tqdm\nimport tqdm.auto as ta\n"],
          ["from tqdm.auto import trange\nfrom tqdm.auto import tqdm\nimport tqdm.auto as ta\n"], "tqdm.auto"),
    cells(["from tqdm import tqdm\nfrom tqdm.notebook import trange\nx = tqdm(range(3))\n"],
          ["from tqdm import tqdm\nfrom tqdm.auto import trange\nx = tqdm(range(3))\n"], "plain tqdm"),
    cells(["import tqdm.notebook\nnotebook = load()\nx = notebook.tqdm_notebook\ny = cfg.notebook\n"],
          ["import tqdm.auto\nnotebook = load()\nx = notebook.tqdm_notebook\ny = cfg.notebook\n"],
          "a variable named notebook"),
    cells(["from tqdm import tqdm, tnrange\nx = tqdm.notebook\n"],
          ["from tqdm import tqdm\nfrom tqdm.auto import trange as tnrange\nx = tqdm.notebook\n"],
          "tqdm the class, not the module"),
]


@pytest.mark.parametrize("before, after", CHANGES + SAME)
def test_rewrite(before, after):
    got, report = convert(*before)
    assert got == after
    assert [n for n in report.changes if ".auto" in n.text]
    again, report = convert(*got)  # idempotent: converting converted code changes nothing more
    assert again == got and not [n for n in report.changes if ".auto" in n.text]


def test_report_names_the_cell():
    _, report = convert("import os\n", "from tqdm.notebook import tqdm\n")
    notes = [n for n in report.changes if "tqdm.auto" in n.text]
    assert [n.cell for n in notes] == [2] and "text progress bars in the script" in notes[0].text


@pytest.mark.parametrize("source", ["import ipywidgets as w\ns = w.IntSlider(3)\n",
                                    "from ipywidgets import interact\n", "import ipywidgets.widgets\n"])
def test_ipywidgets_warns(source):
    got, report = convert(source)
    assert got == [source]
    notes = [n for n in report.warnings if "ipywidgets" in n.text]
    assert len(notes) == 1 and notes[0].cell == 1
    assert "do not show in a script" in notes[0].text and "default" in notes[0].text


def test_script_draws_a_text_bar(tmp_path):
    nb = make_notebook("from tqdm.notebook import tqdm\n", "for _ in tqdm(range(3)):\n    pass\n")
    (tmp_path / "script.py").write_text(convert_notebook(nb, script_name="script.py").script, encoding="utf-8")
    env = dict(os.environ, NBDDP_NPROC="1", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "3/3" in done.stderr, done.stderr[-3000:]
