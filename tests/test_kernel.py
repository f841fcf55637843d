"""`%%torchrun` in a real Jupyter kernel (ipykernel, driven by jupyter_client as JupyterLab, Kaggle and Colab drive
it), on CPU with 2 gloo ranks: what the cell shows, and what is left when the kernel dies."""
import contextlib
import os
import signal
import sys
import time

import psutil
import pytest

from nbddp.executor import alive

pytestmark = pytest.mark.ddp



class Kernel:
    """One ipykernel in `cwd`; run(code) -> the cell's output messages (stream, error, ...)."""

    def __init__(self, cwd, env=None):
        from jupyter_client.manager import start_new_kernel

        kernel_env = {k: v for k, v in os.environ.items() if not k.startswith(("NBDDP_", "OMP_"))}
        kernel_env.update({"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})})
        self.km, self.kc = start_new_kernel(kernel_name="python3", cwd=str(cwd), env=kernel_env)
        self.run("%load_ext nbddp")

    def run(self, code, timeout=240):
        messages = []
        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=lambda msg: messages.append(msg))
        return reply["content"]["status"], messages

    def start(self, code):
        """Send a cell and return without waiting for it."""
        self.kc.execute(code)

    def pid(self):
        return self.km.provisioner.process.pid

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def streamed(messages):
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")


@pytest.fixture
def kernel(tmp_path):
    (tmp_path / "tmp").mkdir()
    k = Kernel(tmp_path, env={"TMPDIR": str(tmp_path / "tmp")})
    yield k
    if k.km.is_alive():
        k.close()


def test_the_process_group_is_up_at_the_cells_first_line(kernel):
    status, messages = kernel.run(
        "%%torchrun 2\n"
        "import torch, torch.distributed as dist\n"
        "t = torch.ones(1)\n"
        "if dist.is_initialized():\n"
        "    dist.all_reduce(t)\n"
        "print('sum', t.item(), 'initialized', dist.is_initialized())\n")
    out = streamed(messages)
    assert status == "ok", out
    assert "sum 2.0 initialized True" in out


def test_the_process_group_starts_right_after_the_cells_import_unsloth(tmp_path):
    (tmp_path / "unsloth").mkdir()
    (tmp_path / "unsloth" / "__init__.py").write_text("import torch.distributed as dist\n"
                                                      "GROUP_DURING_IMPORT = dist.is_initialized()\n")
    kernel = Kernel(tmp_path, env={"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])})
    try:
        status, messages = kernel.run("%%torchrun 2\nimport unsloth\nimport torch.distributed as dist\n"
                                      "print('during', unsloth.GROUP_DURING_IMPORT, 'after', dist.is_initialized())\n")
        assert status == "ok" and "during False after True" in streamed(messages), streamed(messages)
    finally:
        kernel.close()


def test_all_ranks_shows_every_ranks_prints_and_no_omp_banner(kernel):
    status, messages = kernel.run("%%torchrun 2 --all-ranks\nimport os\nprint('hello from rank', os.environ['RANK'])\n"
                                  "if os.environ['RANK'] == '0':\n    print('\\rbar 1', end='')\n    print('\\rbar 2')\n")
    out = streamed(messages)
    assert status == "ok", out
    assert "hello from rank 0" in out.splitlines() and "[rank 1] hello from rank 1" in out.splitlines()
    assert "\rbar 1\rbar 2\n" in out  # rank 0's progress bar as it drew it
    assert "OMP_NUM_THREADS=" in out  # said once, by nbddp
    assert "Setting OMP_NUM_THREADS environment variable for each process" not in out  # torchrun's banner


def test_a_burst_of_output_arrives_in_few_messages(kernel):
    status, messages = kernel.run("%%torchrun 2\nfor i in range(20000):\n    print(i)\n")
    out = streamed(messages)
    assert status == "ok" and "\n19999\n" in out
    assert sum(m["msg_type"] == "stream" for m in messages) < 40


def sleeping_ranks(kernel, folder):
    """Start a 2-rank job that sleeps in the kernel; the ranks' process ids once both run."""
    kernel.start("%%torchrun 2\nimport os, time\nopen(f'pid-{os.getpid()}', 'w').close()\ntime.sleep(300)\n")
    deadline = time.monotonic() + 120
    while len(list(folder.glob("pid-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    ranks = [int(p.name[4:]) for p in folder.glob("pid-*")]
    assert len(ranks) == 2, "the ranks did not start"
    return ranks


def test_a_killed_kernel_takes_its_job_with_it_and_its_log_folder(kernel, tmp_path):
    ranks = sleeping_ranks(kernel, tmp_path)
    dead = [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("nbddp-logs-")]
    assert dead
    kernel.km.shutdown_kernel(now=True)  # a forced restart: the kernel is killed, nothing in it runs again
    deadline = time.monotonic() + 60  # torchrun stops its ranks when its parent dies, and each rank watches the kernel
    # (runtime/owner.py)
    while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in ranks if alive(pid)], "a rank outlived the kernel"
    again = Kernel(tmp_path, env={"TMPDIR": str(tmp_path / "tmp")})  # the next job clears the dead kernel's logs
    try:
        status, messages = again.run("%%torchrun 2\nx = 1\n")
        assert status == "ok", streamed(messages)
        left = [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("nbddp-logs-")]
        assert not set(dead) & set(left) and len(left) == 1, (dead, left)  # only the new job's, kept for its end line
    finally:
        again.close()


def test_ranks_leave_with_a_killed_kernel_also_when_their_launcher_is_stuck(kernel, tmp_path):
    ranks = sleeping_ranks(kernel, tmp_path)
    launcher = psutil.Process(ranks[0]).ppid()
    os.kill(launcher, signal.SIGSTOP)  # torchrun can no longer stop them: the ranks watch the kernel themselves
    try:
        kernel.km.shutdown_kernel(now=True)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in ranks if alive(pid)], "a rank outlived the kernel"
    finally:
        for pid in [launcher, *ranks]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a_failing_rank_shows_its_own_traceback_in_cell_lines_and_not_torchruns(kernel):
    status, messages = kernel.run("%%torchrun 2\nimport os\nx = 1\nif os.environ['RANK'] == '1':\n"
                                  "    raise KeyError('missing-key')\n")
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    shown = streamed(messages) + "".join("\n".join(e["traceback"]) for e in errors)
    assert status == "error" and errors and errors[0]["ename"] == "RankFailedError", shown
    headline = errors[0]["evalue"]  # rank 0 also fails, later, at the teardown's barrier: rank 1 is the cause
    assert headline.startswith("rank 1 ") and "KeyError: 'missing-key'" in headline, shown[-2500:]
    assert "this cell, line 5: raise KeyError('missing-key')" in shown  # counted as the cell shows its lines
    assert "ChildFailedError" not in shown and "Root Cause" not in shown
