"""A notebook that controls its own process (nbddp/transforms/process_control.py, and the IPython calls that restart
a kernel): before/after per spelling, including what must not change."""
from __future__ import annotations

import pytest

from test_idioms import cells, convert

CASES = [
    # Colab's restart after installs: os.kill of the notebook's own process, os._exit, the kernel's shutdown
    cells(["import os\nos.kill(os.getpid(), 9)\n"],
          ["import os\n# nbddp: removed `os.kill(os.getpid(), 9)`: a script has nothing to restart\n"],
          "os.kill of its own process"),
    cells(["from os import kill as k, getpid\nimport signal\nif True:\n    k(getpid(), signal.SIGKILL)\n"],
          ["from os import kill as k, getpid\nimport signal\nif True:\n"
           "    pass  # nbddp: removed `k(getpid(), signal.SIGKILL)`: a script has nothing to restart\n"],
          "through aliases, in a block"),
    cells(["import os\n", "installed = True\nif installed:\n    os._exit(0)\n"],
          ["import os\n", "installed = True\nif installed:\n"
                          "    pass  # nbddp: removed `os._exit(0)`: a script has nothing to restart\n"],
          "os._exit over two cells"),
    cells(["get_ipython().kernel.do_shutdown(True)\n"],
          ["pass  # nbddp: removed `get_ipython().kernel.do_shutdown(True)`: a script has no IPython kernel\n"],
          "the kernel's own shutdown"),
    # DataParallel around the model: the model itself under DDP
    cells(["import torch\nmodel = torch.nn.Linear(2, 2)\nif torch.cuda.device_count() > 1:\n"
           "    model = torch.nn.DataParallel(model)\n"],
          ["import torch\nmodel = torch.nn.Linear(2, 2)\nif torch.cuda.device_count() > 1:\n    model = model\n"],
          "DataParallel when it sees two GPUs"),
    cells(["from torch.nn import DataParallel as DP\n", "def wrap(m):\n    return DP(m, device_ids=[0, 1])\n"],
          ["from torch.nn import DataParallel as DP\n", "def wrap(m):\n    return m\n"],
          "an alias, inside a function"),
    # what must not change: another process's kill, a DataParallel of another library, exit codes of the notebook
    cells(["import os\nos.kill(pid, 15)\nx = 1\n"], ["import os\nos.kill(pid, 15)\nx = 1\n"], "another process"),
    cells(["import os\nif os.environ['RANK'] == '1':\n    os._exit(3)\n"],
          ["import os\nif os.environ['RANK'] == '1':\n    os._exit(3)\n"], "a rank that ends itself on purpose"),
    cells(["from mylib import DataParallel\nm = DataParallel(m)\n"], ["from mylib import DataParallel\nm = DataParallel(m)\n"],
          "not torch's"),
]


@pytest.mark.parametrize("befores, afters", CASES)
def test_process_control(befores, afters):
    converted, _ = convert(*befores)
    assert converted == afters
    again, _ = convert(*converted)
    assert again == afters  # converting converted code changes nothing more


def test_reading_module_of_the_dropped_wrapper_is_warned():
    _, report = convert("import torch\nmodel = torch.nn.DataParallel(net)\n", "model.module.save_pretrained('x')\n")
    assert any("reads `.module`" in note.text for note in report.warnings)
    assert any("DataParallel" in note.text and "own GPU" in note.text for note in report.changes)
