"""The header's install list puts in the notebook's own string variables (nbddp.install_values): before/after per
spelling, and what must stay a placeholder."""
from __future__ import annotations

import pytest

from conftest import make_notebook
from nbddp.pipeline import convert_notebook


def _installs(*cells):
    conversion = convert_notebook(make_notebook(*cells))
    return conversion.report.installs, conversion.script, conversion.report.format()


@pytest.mark.parametrize("cells, expected", [
    (["v = 'vllm==0.9'\n!pip install {v} unsloth\n"], ["pip install vllm==0.9 unsloth"]),
    (["import torch\nmajor = torch.__version__[:3]\n"  # a conditional over a version check: each branch
      "xf = 'xformers==0.0.34' if major == '2.9' else 'xformers'\n", "!pip install -q $xf\n"],
     ["pip install -q xformers==0.0.34", "pip install -q xformers"]),
    (["try:\n    import numpy; _np = f'numpy=={numpy.__version__}'\nexcept ImportError:\n    _np = 'numpy'\n"
      "base = 'torch'\npinned = f'{base}vision'\n",  # over cells, an f-string of a variable, a try
      "%pip install {_np} {pinned}\n"], ["pip install numpy torchvision"]),
    (["a, b = ('vllm==1', 'triton') if gpu else ('vllm==2', 'triton')\nif True:\n    !uv pip install {a} {b}\n"],
     ["uv pip install vllm==1 triton", "uv pip install vllm==2 triton"]),
])
def test_the_notebooks_string_variables_are_put_in(cells, expected):
    installs, script, report = _installs(*cells)
    assert installs == expected
    assert "{name} parts" not in script and "{name} parts" not in report


@pytest.mark.parametrize("cell, kept", [
    ("!pip install {pkg}\n", "pip install {pkg}"),                                  # bound nowhere
    ("def f():\n    local = 'x'\n!pip install {local}\n", "pip install {local}"),  # a function's own
    ("v = make_version()\n!pip install lib=={v}\n", "pip install lib=={v}"),      # computed at run time
])
def test_what_nbddp_cannot_read_stays_a_placeholder_and_the_header_says_so(cell, kept):
    installs, script, report = _installs(cell)
    assert installs == [kept]
    assert "{name} parts are its own variables" in script and "{name} parts are the notebook's own" in report
