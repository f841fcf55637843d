"""End to end on CPU, 2 ranks (gloo), started by plain torchrun (no nbddp launcher sets anything): a notebook's own
multi-process code keeps its meaning and every rank computes the same values (issue 47).

The notebook trains with accelerate (its `prepare` is the data parallelism, its `wait_for_everyone` after the loop
meets every rank), then each rank records what it computed: after training, a test of the rank that runs on rank 1
only, and values each process would compute for itself that training reads (a set of strings' order, an unseeded
NumPy generator, generators and reseeds without a seed (Python's, NumPy's legacy and new, torch's; through
aliases, in a function, in a loop), samples a generator of the notebook's own draws from the OS's entropy, a uuid). A function training
needs makes its folders without exist_ok, on every rank; another sets a global that training reads, and one saves
features and returns their path, which training reads; another moves a file it then reads.
It writes a training script with `%%writefile` and runs it with `!python`, and starts it again through subprocess
from its own function, with a copy of its environment, through os.spawnv, os.posix_spawn, and a fork that starts it
(as pty.spawn and pexpect do): the script would join a process group of WORLD_SIZE processes if it saw this job's.
Its own multiprocessing starts processes with spawn and forkserver (a Pool, a ProcessPoolExecutor in a function,
Processes with a queue), which must run what they are given, not the script again. A notebook that trains nothing
keeps what programs it starts give back: each program runs once, and every rank gets its result.
"""
from __future__ import annotations

import json

import pytest

from e2e import assert_clean_exit, run_notebook

pytestmark = pytest.mark.ddp

CHILD = (
    "%%writefile child.py\n"
    "import os, sys\n"
    "if int(os.environ.get('WORLD_SIZE', '1')) > 1:  # a rank of some job: wait for the others\n"
    "    import torch.distributed as dist\n"
    "    dist.init_process_group('gloo')\n"
    "with open(f'child-{sys.argv[1]}.txt', 'a') as fh:\n"
    "    fh.write(os.environ.get('WORLD_SIZE', 'alone') + '\\n')\n"
)

CELLS = [
    "import json, os, subprocess, sys\nimport numpy as np\nimport torch\nfrom accelerate import Accelerator\n"
    "import torch.distributed as dist\ndef setup(backend):\n    dist.init_process_group(backend = backend)\n"
    "setup('gloo')\nacc = Accelerator(cpu = True)\n",
    CHILD,
    "!python child.py shell\n",
    "def run_child(how):\n    subprocess.run([sys.executable, 'child.py', how], check = True, timeout = 60)\n"
    "run_child('subprocess')\n",
    "import subprocess as sp\nsp.run([sys.executable, 'child.py', 'envcopy'], env = dict(os.environ, OMP_NUM_THREADS = '1'), "
    "check = True, timeout = 60)\n",
    "def spawn_child(how):\n    os.spawnv(os.P_WAIT, sys.executable, [sys.executable, 'child.py', how])\nspawn_child('spawnv')\n",
    "def forked(how):  # as pty.spawn and pexpect start a program\n    pid = os.fork()\n    if pid == 0:\n"
    "        os.execv(sys.executable, [sys.executable, 'child.py', how])\n    os.waitpid(pid, 0)\nforked('forkexec')\n",
    "spawned = os.posix_spawn(sys.executable, [sys.executable, 'child.py', 'posix'], dict(os.environ))\n"
    "os.waitpid(spawned, 0)\n",
    "tags = {'alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta', 'eta', 'theta'}\norder = list(tags)\n"
    "rng = np.random.default_rng()\nnoise = rng.normal(size = 3).tolist()\n",
    "import random as rnd\nfrom numpy.random import RandomState, PCG64, Generator as NpGen, SeedSequence\n"
    "def draws():\n    picker, legacy = rnd.Random(), RandomState()\n    rnd.seed()\n    np.random.seed()\n"
    "    g = torch.Generator()\n    g.seed()\n    return [picker.random(), int(legacy.randint(0, 10**6)), rnd.random(), "
    "int(np.random.randint(0, 10**6)), torch.randperm(8, generator = g).tolist(), int(NpGen(PCG64()).integers(0, 10**6)), "
    "SeedSequence().entropy % 10**6, torch.seed() % 10**6]\n",
    "drawn = [draws() for _ in range(2)]\n",
    "import secrets, uuid\nclass Sampler:\n    def generate(self, n):\n        return [secrets.token_hex(4) for _ in range(n)]\n",
    "synthetic = Sampler().generate(3)\nrun_id = uuid.uuid4().hex\n",
    "import pathlib\ndef workdir(name):\n    os.makedirs(name)\n    (pathlib.Path(name) / 'logs').mkdir()\n    return name\n"
    "out_dir = workdir('out')\n",
    "%%writefile raw.txt\nhello\n",
    "%%writefile extra.txt\nworld\n",
    "import shutil\ndef prepare(src):\n    os.makedirs('moved', exist_ok = True)\n"
    "    dst = shutil.move(src, os.path.join('moved', 'raw.txt'))\n    extra = shutil.move('extra.txt', 'moved')\n"
    "    with open(dst) as fh, open(extra) as more:\n        return fh.read() + more.read()\n"
    "text = prepare('raw.txt')\n",
    "DATA = None\ndef refresh():\n    global DATA\n    DATA = sorted(tags)[:3]\nrefresh()\n",
    "def cache_feats(name):\n    os.makedirs(name, exist_ok = True)\n    path = pathlib.Path(name) / 'feats.npy'\n"
    "    np.save(path, np.ones(3))\n    return path\nfeats = cache_feats('cache')\n",
    "%%writefile work.py\ndef square(x):\n    return x * x\n\ndef put(queue, x):\n    queue.put(x * 2)\n",
    "import multiprocessing as mp\nimport work\nwith mp.get_context('spawn').Pool(2) as pool:\n"
    "    squares = pool.map(work.square, range(4))\n",
    "from concurrent.futures import ProcessPoolExecutor\ndef squared(xs):\n"
    "    with ProcessPoolExecutor(2, mp_context = mp.get_context('forkserver')) as ex:\n"
    "        return list(ex.map(work.square, xs))\nmore = squared([5, 6])\n",
    "spawner = mp.get_context('spawn')\nq = spawner.Queue()\n"
    "kids = [spawner.Process(target = work.put, args = (q, i)) for i in (1, 2)]\n"
    "for kid in kids:\n    kid.start()\nput_back = sorted(q.get() for _ in kids)\nfor kid in kids:\n    kid.join()\n",
    "torch.manual_seed(0)\nmodel = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr = 0.1)\n"
    "model, opt = acc.prepare(model, opt)\n",
    "for step in range(3):\n    x = torch.full((2, 4), float(acc.process_index + step + len(order[0])))\n"
    "    loss = model(x).pow(2).mean() + 0 * sum(noise) + 0 * len(synthetic + [run_id, out_dir] + drawn + DATA + [text])"
    " + 0 * float(np.load(feats).sum()) + 0 * sum(squares + more + put_back)\n    acc.backward(loss)\n    opt.step()\n    opt.zero_grad()\n",
    "acc.wait_for_everyone()\nweights = acc.unwrap_model(model).weight.tolist()\n",
    "with open(f'rank{acc.process_index}.json', 'w') as fh:\n"
    "    json.dump({'order': order, 'noise': noise, 'weights': weights, 'synthetic': synthetic, 'run': run_id,\n"
    "               'drawn': drawn, 'data': DATA, 'feats': str(feats),\n"
    "               'text': text, 'children': [squares, more, put_back]}, fh)\n",
    "if acc.process_index == 1:\n    open('rank1-after-training.txt', 'w').write('here')\n",
    "def second():\n    return acc.process_index == 1\nif second():\n    with open('second.txt', 'w') as fh:\n"
    "        fh.write('written by the second process')\n",
    "if acc.is_main_process:\n    print('the main process')\nelse:\n    open('others.txt', 'a').write('other')\n",
    "from torch.distributed import get_rank as who\ndef only_second():\n    if who() != 1:\n        return\n"
    "    with open('early.txt', 'w') as fh:\n        fh.write(f'rank {who()}')\nonly_second()\n",
    "@acc.on_last_process\ndef last():\n    open('last.txt', 'w').write(f'rank {acc.process_index}')\nlast()\n",
    "from torch.distributed import destroy_process_group as close_group\nclose_group()\nprint('DONE', flush = True)\n",
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("meaning")
    return run_notebook(CELLS, cwd, timeout=180)


def test_the_job_ends_without_a_hang(job):
    done, conversion = job
    assert_clean_exit(done)
    assert done.count("DONE") == 1, done.explain()
    assert done.count("the notebook's init_process_group: the job's process group (gloo) is up, kept") == 1, \
        done.explain()  # the notebook's own start of the group: the job's, kept (and its end at the script's end)
    script = conversion.script[conversion.script.index("# %% cell 1"):]
    assert script.index("acc.wait_for_everyone()") < script.index("if acc.process_index == 1:") < \
        script.index("nbddp_rest_on_rank0()"), "the rank test after the loop is before training's end"


def test_a_rank_test_after_training_runs_on_that_rank(job):
    done, _ = job
    assert (done.cwd / "rank1-after-training.txt").read_text() == "here", done.explain()
    assert (done.cwd / "second.txt").read_text() == "written by the second process", done.explain()  # not its copy
    assert (done.cwd / "others.txt").read_text() == "other", done.explain()  # the `else` of a rank-0 test
    assert (done.cwd / "early.txt").read_text() == "rank 1", done.explain()  # after the others' early return
    assert (done.cwd / "last.txt").read_text() == "rank 1", done.explain()  # accelerate's on_last_process


def test_every_rank_computes_the_same_values_and_trains_one_model(job):
    done, _ = job
    first, second = (json.loads((done.cwd / f"rank{r}.json").read_text()) for r in range(2))
    assert first["order"] == second["order"], "a set of strings iterated in another order on rank 1"
    assert first["noise"] == second["noise"], "np.random.default_rng() drew another seed on rank 1"
    assert first["data"] == second["data"] and first["data"], "a global the notebook's function sets is rank 0's only"
    assert first["feats"] == second["feats"] == "cache/feats.npy"
    assert first["text"] == second["text"] == "hello\nworld\n", "a file moved in a function training needs, on every rank"
    assert first["drawn"] == second["drawn"], "a generator or reseed without a seed drew from the OS on rank 1"
    assert first["drawn"][0] != first["drawn"][1], "every draw gave the same seed"
    assert first["synthetic"] == second["synthetic"] and first["run"] == second["run"], "generated or drawn anew"
    assert first["weights"] == second["weights"]


def test_processes_the_notebook_spawns_run_what_they_are_given(job):
    done, _ = job  # not the script again, with this rank's RANK and WORLD_SIZE (a hang before)
    for rank in range(2):
        record = json.loads((done.cwd / f"rank{rank}.json").read_text())
        assert record["children"] == [[0, 1, 4, 9], [25, 36], [2, 4]], done.explain()


def test_a_script_the_notebook_starts_is_one_process_of_its_own(job):
    done, conversion = job
    for how in ("shell", "subprocess", "envcopy", "spawnv", "forkexec", "posix"):
        assert (done.cwd / f"child-{how}.txt").read_text() == "alone\n", done.explain()  # once, not in the job
    assert "`!python child.py shell` runs a Python program: it starts in one process of its own" in \
        conversion.report.format()


PROGRAMS = [
    "%%writefile prep.py\nimport os\nfd = os.open('ran.log', os.O_WRONLY | os.O_APPEND | os.O_CREAT)\n"
    "os.write(fd, b'ran\\n')\nprint('prepared')\n",
    "import json, os, subprocess, sys\nrc = subprocess.run([sys.executable, 'prep.py'], capture_output = True, text = True)\n",
    "from subprocess import check_output as co\nout = co([sys.executable, 'prep.py'], text = True)\n",
    "for tag in ['a']:  # an argument the converter cannot read\n    subprocess.run([sys.executable, 'prep.py', tag + '1'])\n",
    "last_tag = tag * 2  # the loop's variable, read later\n",
    "with open(f\"seen-{os.environ['RANK']}.json\", 'w') as fh:\n"
    "    json.dump([rc.returncode, rc.stdout, out, last_tag], fh)\n",
]


def test_without_training_a_programs_result_is_rank_0s_on_every_rank(tmp_path):
    done, _ = run_notebook(PROGRAMS, tmp_path, timeout=120)
    assert_clean_exit(done)
    assert (tmp_path / "ran.log").read_text() == "ran\n" * 3, done.explain()  # each program once, not per rank
    for rank in range(2):
        assert json.loads((tmp_path / f"seen-{rank}.json").read_text()) == [0, "prepared\n", "prepared\n", "aa"]


NAMED = [
    "import os, namer\nrun = 'runs/' + namer.slug()\n",
    "import torch, torch.distributed as dist\nwidth = torch.ones(len(run))\ndist.all_reduce(width)\n",
    "with open(f'seen-{dist.get_rank()}.txt', 'w') as fh:\n    fh.write(run)\n",
]


def test_a_plain_value_another_library_makes_is_rank_0s_on_every_rank(tmp_path):
    """`namer` is a library nbddp has no entries for (installed, not beside the notebook): its slug is each
    process's own; training reads it, so every rank takes rank 0's."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "nb").mkdir()
    (tmp_path / "lib" / "namer.py").write_text("import os\n\ndef slug():\n    return os.urandom(4).hex()\n")
    done, _ = run_notebook(NAMED, tmp_path / "nb", timeout=120, env={"PYTHONPATH": str(tmp_path / "lib")})
    assert_clean_exit(done)
    seen = [(tmp_path / "nb" / f"seen-{rank}.txt").read_text() for rank in range(2)]
    assert seen[0] == seen[1] and seen[0].startswith("runs/"), seen


REGISTERED = [
    "import dsreg\ndsreg.register('mine', [1.0, 2.0])\n",
    "import torch, torch.distributed as dist\nrows = dsreg.load('mine')\nwidth = torch.tensor([sum(rows)])\n"
    "dist.all_reduce(width)\n",
    "with open(f'seen-{dist.get_rank()}.txt', 'w') as fh:\n    fh.write(str(width.item()))\n",
]


def test_the_set_up_of_a_library_whose_values_training_reads_runs_on_every_rank(tmp_path):
    """`dsreg` is a library nbddp has no entries for, with a registry of its own: what training reads comes from
    `dsreg.load`, so the `dsreg.register` before it runs on every rank (rank 1's load found nothing before)."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "nb").mkdir()
    (tmp_path / "lib" / "dsreg.py").write_text("REGISTRY = {}\n\ndef register(name, rows):\n    REGISTRY[name] = rows\n\n"
                                               "def load(name):\n    return list(REGISTRY[name])\n")
    done, _ = run_notebook(REGISTERED, tmp_path / "nb", timeout=120, env={"PYTHONPATH": str(tmp_path / "lib")})
    assert_clean_exit(done)
    assert [(tmp_path / "nb" / f"seen-{rank}.txt").read_text() for rank in range(2)] == ["6.0", "6.0"], done.explain()


def test_without_training_the_set_up_of_a_library_whose_values_every_rank_makes_runs_on_every_rank(tmp_path):
    """The same library with no training: what every rank loads from it was registered on every rank."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "nb").mkdir()
    (tmp_path / "lib" / "dsreg.py").write_text("REGISTRY = {}\n\ndef register(name, rows):\n    REGISTRY[name] = rows\n\n"
                                               "def load(name):\n    return list(REGISTRY[name])\n")
    cells = [REGISTERED[0], "import os\nrows = dsreg.load('mine')\n",
             "with open(f\"seen-{os.environ['RANK']}.txt\", 'w') as fh:\n    fh.write(str(sum(rows)))\n"]
    done, _ = run_notebook(cells, tmp_path / "nb", timeout=120, env={"PYTHONPATH": str(tmp_path / "lib")})
    assert_clean_exit(done)
    assert [(tmp_path / "nb" / f"seen-{rank}.txt").read_text() for rank in range(2)] == ["3.0", "3.0"], done.explain()


OWN_MODULE = [
    "%%writefile steps.py\nimport torch.distributed as dist\n\ndef _synced(model):\n"
    "    for p in model.parameters():\n        dist.all_reduce(p.grad)\n        p.grad /= dist.get_world_size()\n\n"
    "def run(model, opt, rounds):\n    for _ in range(rounds):\n        model(torch.ones(2, 4)).sum().backward()\n"
    "        _synced(model)\n        opt.step()\n        opt.zero_grad()\n    return [p.tolist() for p in model.parameters()]\n\n"
    "import torch\n",
    "import os, json, torch\nimport steps as st\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(4, 1)\n"
    "opt = torch.optim.SGD(model.parameters(), lr = 0.1)\nmodel(torch.zeros(1, 4)).sum().backward()\nopt.zero_grad()\n",
    "def train(rounds):\n    return st.run(model, opt, rounds)\nweights = train(2)\n",
    "with open('seen.json', 'w') as fh:\n    json.dump(weights, fh)\n",
]


def test_training_in_a_function_of_a_module_of_its_own_runs_on_every_rank(tmp_path):
    """The notebook writes steps.py and trains through its function (all_reduce inside): training ends there, not
    at the backward pass before it, so every rank runs it (before, rank 0 alone did and waited for rank 1: a hang)."""
    done, conversion = run_notebook(OWN_MODULE, tmp_path, timeout=60)
    assert_clean_exit(done)
    assert len(json.loads((tmp_path / "seen.json").read_text())) == 2, done.explain()
    script = conversion.script[conversion.script.index("# %% cell 1"):]
    assert "\n    weights = train(2)\n" in script and "nbddp_rest_on_rank0()" not in script.split("weights = train")[0]


SERVED = [
    "import dashlib, torch\nsrv = dashlib.serve()\n",
    "model = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(model.parameters(), lr = 0.1)\n"
    "for i in range(2):\n    model(torch.ones(1, 2)).sum().backward()\n    opt.step()\n    opt.zero_grad()\n"
    "    srv.push(i)\n",
]


def test_a_server_only_the_effects_inside_training_use_starts_once(tmp_path):
    """`dashlib` (a library nbddp has no entries for) listens on a port; only the loop's pushes use it: rank 0
    starts it (before, rank 1 started a second one on the same port and failed)."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "nb").mkdir()
    (tmp_path / "lib" / "dashlib.py").write_text(
        "import os, socket\n\nclass Server:\n    def __init__(self, port):\n        self.sock = socket.socket()\n"
        "        self.sock.bind(('127.0.0.1', port))\n        self.sock.listen()\n\n    def push(self, value):\n"
        "        with open('pushed.txt', 'a') as fh:\n            fh.write(f'{value}\\n')\n\n"
        f"def serve():\n    return Server({_free_port()})\n")
    done, _ = run_notebook(SERVED, tmp_path / "nb", timeout=60, env={"PYTHONPATH": str(tmp_path / "lib")})
    assert_clean_exit(done)
    assert (tmp_path / "nb" / "pushed.txt").read_text() == "0\n1\n", done.explain()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
