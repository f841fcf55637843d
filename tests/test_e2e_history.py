"""IPython's output and input history, a cell's shown value of any shape, and IPython called by name
(`get_ipython().run_cell_magic(...)`, a saved `shell = get_ipython()`, its methods under names of their own, with
arguments the notebook computes), in a converted notebook run as a 2-process
torchrun job (gloo), against a real Jupyter kernel running the same cells (the oracle): what each rank binds from
`_`, `__`, `___`, `_N`, `Out[N]`, `In`, `_iN`, and what the magics wrote and set, is what the kernel has, and what
the cells show is shown once (issue 49)."""
from __future__ import annotations

import json

import pytest

from e2e import assert_clean_exit, notebook_job, start_jobs

pytestmark = pytest.mark.ddp

CELLS = [
    "import json, os\nx = 21\nd = {'k': 'v'}\n",
    "x * 2\n",                          # shown: Out[2]
    "y = _ + 1\nseen = {'y': y, 'out2': Out[2], 'under2': _2}\n",
    "x, y\n",                           # a tuple without parentheses
    "d['k']\n",                         # a subscript
    "x > 3\n",                          # a comparison
    "f'{x}!'\n",                        # an f-string
    "*[1, 2], 3\n",                     # a starred form
    "def grab():\n    return ___, __, _\n",
    "seen.update(last3=grab(), inputs=len(In), i2=_i2.strip(), out_keys=sorted(Out), before=_i.strip(), here=In[-1])\n",
    # IPython called by name, as nbconvert and older notebooks spell magics; through a saved shell, over cells
    "get_ipython().run_cell_magic('writefile', 'helper_mod.py', 'VALUE = 7\\n')\n",
    "shell = get_ipython()\n",
    "shell.run_line_magic('env', 'GREETING=hi')\nimport helper_mod\nseen.update(helper=helper_mod.VALUE, "
    "greeting=os.environ['GREETING'])\n",
    # a cell magic's own line, expanded as IPython expands it
    "%%bash -s \"$x\" {x * 2}\necho bash-args $1 $2\n",
    "%%writefile note_{x}.txt\nhello\n",
    "seen['note'] = open(f'note_{x}.txt').read()\n",
    # IPython's methods through names of their own, with arguments the notebook computes (in a function, in a loop)
    "run = shell.run_line_magic\nrun('env', 'ALIASED=yes')\nsh = get_ipython().system\n",
    "def write(path, text):\n    get_ipython().run_cell_magic('writefile', path, text)\n"
    "write(f'computed_{x}.txt', 'computed\\n')\nfor word in ['a', 'b']:\n    sh(f'echo {word} $x >> system.txt')\n",
    "seen.update(aliased=os.environ['ALIASED'], computed=open('computed_21.txt').read(), "
    "system=open('system.txt').read())\n",
    # %env and %cd of lines computed when the script runs: in a loop, in a function
    "def into(folder):\n    shell.run_line_magic('cd', folder)\nos.makedirs('sub_21', exist_ok=True)\n"
    "for k, v in {'COMPUTED_A': x, 'COMPUTED_B': 'two words'}.items():\n    run('env', f'{k}={v}')\n"
    "into(f'sub_{x}')\nseen.update(env_a=os.environ['COMPUTED_A'], env_b=os.environ['COMPUTED_B'], "
    "folder=os.path.basename(os.getcwd()))\ninto('..')\n",
    "with open(f\"rank{os.environ.get('RANK', 'kernel')}.json\", 'w') as fh:\n    json.dump(seen, fh)\n",
]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The notebook's job, started in the background (e2e.start_jobs: neither reads time), and the kernel's run of the
    same cells while it runs: ((the job, the conversion), what the kernel saw)."""
    cwd = tmp_path_factory.mktemp("history")
    launch, conversion = notebook_job(CELLS, cwd)
    started = start_jobs([launch])
    try:
        seen = _kernel_seen(tmp_path_factory)
        return (started.jobs()[0], conversion), seen
    finally:
        started.close()


@pytest.fixture(scope="module")
def kernel_seen(ran):
    return ran[1]


def _kernel_seen(tmp_path_factory):
    """The cells in a new kernel, in order, as a user runs them: what it bound, and the values it showed."""
    import os

    from jupyter_client.manager import start_new_kernel

    cwd = tmp_path_factory.mktemp("kernel")
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(cwd), env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    try:
        shown = []
        for cell in CELLS:
            messages = []
            reply = kc.execute_interactive(cell, timeout=60, output_hook=messages.append)
            assert reply["content"]["status"] == "ok", (cell, messages)
            shown += [m["content"]["data"]["text/plain"] for m in messages if m["msg_type"] == "execute_result"]
            shown += [line for m in messages if m["msg_type"] == "stream" and "bash-args" in m["content"]["text"]
                      for line in m["content"]["text"].splitlines()]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return json.loads((cwd / "rankkernel.json").read_text()), shown


@pytest.fixture(scope="module")
def job(ran):
    return ran[0]


def test_every_rank_binds_the_history_the_kernel_binds(job, kernel_seen):
    done, _ = job
    assert_clean_exit(done)
    for rank in range(2):
        seen = json.loads((done.cwd / f"rank{rank}.json").read_text())
        assert seen == kernel_seen[0], (rank, seen, kernel_seen[0])


def test_each_shown_value_is_shown_once_whatever_its_shape(job, kernel_seen):
    done, _ = job
    assert "bash-args 21 42" in kernel_seen[1] and "(21, 43)" in kernel_seen[1]  # what the kernel showed
    for text in kernel_seen[1]:
        lines = [line.split("]:", 1)[-1] for line in done.stdout.splitlines()]  # every rank's, prefixed
        assert lines.count(text) == 1, (text, done.explain())
