"""A notebook that controls its own process (nbddp/transforms/process_control.py, and the IPython calls that restart
a kernel): before/after per spelling, including what must not change."""
from __future__ import annotations

import pytest

from nbddp.errors import ConversionError
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
    # a launcher inside the notebook: each rank of this job runs the function once
    cells(["from accelerate import notebook_launcher\n", "def train(a, b):\n    pass\n",
           "notebook_launcher(train, (1, 2), num_processes=2)\n"],
          ["from accelerate import notebook_launcher\n", "def train(a, b):\n    pass\n", "train(1, 2)\n"],
          "notebook_launcher over cells"),
    cells(["import accelerate as acc\nargs = (1,)\nfor fn in (first, second):\n"
           "    acc.notebook_launcher(function=fn, args=args, num_processes=2)\n"],
          ["import accelerate as acc\nargs = (1,)\nfor fn in (first, second):\n    fn(*args)\n"],
          "an alias, keywords, in a loop"),
    cells(["from accelerate import notebook_launcher as launch\ndef go():\n    launch(train)\n"],
          ["from accelerate import notebook_launcher as launch\ndef go():\n    train()\n"], "inside a function"),
    cells(["from mylib import notebook_launcher\ndef train():\n    pass\nnotebook_launcher(train)\nx = 1\n"],
          ["from mylib import notebook_launcher\ndef train():\n    pass\nnotebook_launcher(train)\nx = 1\n"],
          "not accelerate's"),
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


@pytest.mark.parametrize("cell, line", [
    ("import torch.multiprocessing as mp\n\ndef main():\n    mp.spawn(worker, args=(2,), nprocs=2)\n", 4),
    ("from torch.multiprocessing import start_processes\nstart_processes(worker, nprocs=2)\n", 2),
    ("x = 1\n!torchrun --nproc_per_node=2 train.py\n", 2),
    ("!{sys.executable} -m torch.distributed.run train.py\n", 1),
    ("!accelerate launch --num_processes 2 train.py\n", 1),
    ("%%bash\ncd work\ndeepspeed train.py\n", 3),
    # a program started through Python, by its words: a list, an alias, in a function, a string for the shell
    ("import subprocess\nsubprocess.run(['torchrun', '--nproc_per_node=2', 'train.py'], check=True)\n", 2),
    ("import sys\nfrom subprocess import check_call as sh\n\ndef go():\n"
     "    sh([sys.executable, '-m', 'torch.distributed.run', 'train.py'])\n", 5),
    ("import os\nn = 2\nos.system(f'accelerate launch --num_processes {n} train.py')\n", 3),
    ("import subprocess\nsubprocess.call('torchrun --nproc_per_node=2 train.py', shell=True)\n", 2),  # one string
    # processes the notebook starts itself, handed a function that starts a process group of its own
    ("import torch.distributed as dist\nfrom torch import multiprocessing as tmp\ndef worker(rank):\n"
     "    dist.init_process_group('gloo', rank=rank, world_size=2)\nfor r in range(2):\n"
     "    p = tmp.Process(target=worker, args=(r,))\n", 6),
    ("import multiprocessing as mp\nfrom torch.distributed import init_process_group as up\ndef join(rank):\n"
     "    up('gloo', rank=rank, world_size=2)\ndef worker(rank):\n    join(rank)\nwith mp.Pool(2) as pool:\n"
     "    pool.map(worker, [0, 1])\n", 8),  # through another of its functions
    ("from concurrent.futures import ProcessPoolExecutor\nimport torch.distributed as dist\n"
     "work = lambda r: dist.init_process_group('gloo', rank=r, world_size=2)\n"
     "with ProcessPoolExecutor(2) as ex:\n    list(ex.map(work, [0, 1]))\n", 5),  # a lambda
])
def test_a_launcher_that_starts_its_own_processes_stops_the_conversion_naming_its_line(cell, line):
    with pytest.raises(ConversionError) as stop:
        convert(cell)
    assert (stop.value.cell, stop.value.line) == (1, line)
    assert "of its own" in str(stop.value)


def test_commands_that_do_not_launch_are_left_to_run():
    converted, _ = convert("!python train.py\n!echo torchrun\n")
    assert converted == ["nbddp_shell('python train.py')\nnbddp_shell('echo torchrun')\n"]
    cell = "import subprocess\nsubprocess.run(['echo', 'torchrun'])\nsubprocess.run([launcher, 'train.py'])\n"
    converted = convert(cell)[0][0]  # a word, a command the converter cannot read: no stop
    assert "subprocess.run(['echo', 'torchrun'])" in converted and "run([launcher, 'train.py'])" in converted
