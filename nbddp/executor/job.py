"""One torchrun job from a notebook kernel or a shell: planned by the recipe (nbddp.launch), run with its output
streamed live, stopped whole on interrupt, and its log folder cleaned up, also after a kernel that died."""
from __future__ import annotations

import glob
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .. import launch
from ..errors import LaunchError
from .failures import job_failure
from .output import JobOutput
from .processes import JobProcesses, alive, start_torchrun

#: Seconds to wait after SIGINT, then after SIGTERM, before SIGKILL.
GRACE = (5.0, 3.0)
LOG_PREFIX = "nbddp-logs-"


def _gpu_count() -> int:
    try:
        import torch  # only here: the converter and the CLI's startup never import torch
    except ImportError:
        raise LaunchError("'auto' counts the GPUs with torch, which is not installed here; give the number of "
                          "processes (--nproc N), or install torch") from None
    return torch.cuda.device_count()


def resolve_nproc(value, device_count=None) -> int:
    """A positive count, or 'auto': one process per GPU (`device_count()`, by default torch's count), or 2 CPU
    processes where there is none."""
    return launch.parse_nproc(value, device_count or _gpu_count)


def log_dir(flags=()) -> str:
    """Where torchrun writes the other ranks' output: the user's --log-dir, else one folder per kernel (or shell)."""
    return launch.flag_value(flags, launch.LOG_DIR_FLAGS) or os.path.join(tempfile.gettempdir(),
                                                                         f"{LOG_PREFIX}{os.getpid()}")


def plan(script, nproc, *, extra=(), script_args=(), all_ranks=False, env=None) -> launch.Launch:
    """What `run_script` with the same arguments executes (and a dry run prints): this interpreter, this machine's
    cores, this process's environment (or `env`), and this process's log folder."""
    return launch.build(script, nproc, python=sys.executable, cpus=launch.cpu_count(),
                        env=os.environ if env is None else env, flags=extra, script_args=script_args,
                        all_ranks=all_ranks, log_dir=log_dir(extra))


def run_script(script, nproc, *, extra=(), script_args=(), all_ranks=False, env=None, grace=GRACE) -> None:
    """Launch `script` on `nproc` processes per node with torchrun (`plan`), stream the output (rank 0 only, or
    every rank prefixed `[rank N]` with all_ranks), and raise RankFailedError naming the rank that failed."""
    job = plan(script, nproc, extra=extra, script_args=script_args, all_ranks=all_ranks, env=env)
    folder, own = log_dir(extra), launch.flag_value(extra, launch.LOG_DIR_FLAGS) is None
    sweep_log_dirs()
    if own:  # the last job's logs stay until the next job here (its end line says where), or this process ends
        shutil.rmtree(folder, ignore_errors=True)
    run_argv(job.argv, env={**(os.environ if env is None else env), **job.env}, log_dir=folder, grace=grace,
             script=script)


def run_argv(argv, env=None, log_dir=None, grace=GRACE, script=None) -> None:
    """Run a torchrun argv to the end, streaming its output; raise RankFailedError/LaunchError if it fails."""
    job = TorchrunJob(argv, env=env, log_dir=log_dir, grace=grace, script=script).start()
    returncode = job.wait()
    if returncode:
        raise job.failure(returncode)


def sweep_log_dirs(root=None):
    """Remove the log folders of earlier jobs whose kernel (or shell) is gone: a killed kernel leaves its own."""
    for path in glob.glob(os.path.join(glob.escape(root or tempfile.gettempdir()), f"{LOG_PREFIX}*")):
        owner = os.path.basename(path)[len(LOG_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and int(owner) != os.getpid() and not alive(int(owner)):
            shutil.rmtree(path, ignore_errors=True)


class TorchrunJob:
    """One torchrun process (in a session of its own) and its ranks.

    `wait()` streams stdout and stderr to this process's sys.stdout/sys.stderr as the bytes arrive (no line
    buffering, so `\\r` progress bars pass through), then returns torchrun's exit status. On KeyboardInterrupt it
    stops every rank (`stop()`) and re-raises."""

    def __init__(self, argv, env=None, log_dir=None, grace=GRACE, script=None):
        self.argv, self.env, self.log_dir, self.grace, self.script = list(argv), env, log_dir, grace, script
        self.proc = self.processes = self._selector = None
        self.output = JobOutput()  # echo off once interrupted: the shutdown noise is drained, not shown

    def start(self):
        self.proc = start_torchrun(self.argv, self.env)
        self.processes = JobProcesses(self.proc)
        self._selector = selectors.DefaultSelector()
        for pipe, dest in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")):
            self._selector.register(pipe, selectors.EVENT_READ, dest)
        return self

    def _pump(self, timeout: float) -> bool:
        """Copy what output is ready (waiting up to `timeout`); False once both pipes are closed."""
        if not self._selector.get_map():
            if timeout:
                time.sleep(min(timeout, 0.05))
            return False
        for key, _ in self._selector.select(timeout):
            if not self.output.read(key.data, key.fd):
                self._selector.unregister(key.fileobj)
                key.fileobj.close()
        open_pipes = bool(self._selector.get_map())
        self.output.flush(due=open_pipes)
        return open_pipes

    def wait(self) -> int:
        try:
            while self._pump(0.2):
                pass
            return self.proc.wait()
        except KeyboardInterrupt:
            self.stop()
            raise
        finally:
            if self.proc.poll() is not None:
                self._close()

    def _close(self):
        if self._selector is not None:
            for key in list(self._selector.get_map().values()):
                self._selector.unregister(key.fileobj)
                key.fileobj.close()
            self._selector.close()
            self._selector = None

    def _wait_gone(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not self.processes.gone():
            if time.monotonic() >= deadline:
                return False
            try:
                if self._selector is not None:
                    self._pump(0.05)
                else:
                    time.sleep(0.05)
            except (OSError, ValueError):
                time.sleep(0.05)
        return True

    def stop(self):
        """SIGINT to torchrun's process group and every rank, then SIGTERM, then SIGKILL, each after a short grace
        period; returns once no process of the job is left. A second interrupt goes straight to SIGKILL."""
        if self.proc is None:
            return
        print(f"\nnbddp: interrupted; stopping torchrun and its ranks ({len(self.processes.live())} processes)",
              file=sys.stderr, flush=True)
        self.output.echo = False
        try:
            for sig, grace in zip((signal.SIGINT, signal.SIGTERM), self.grace):
                self.processes.signal(sig)
                if self._wait_gone(grace):
                    break
        except KeyboardInterrupt:
            pass
        for _ in range(50):
            if self.processes.gone():
                break
            self.processes.signal(signal.SIGKILL)
            time.sleep(0.1)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._close()

    def failure(self, returncode: int) -> LaunchError:
        """The error for a job that exited with `returncode` != 0 (see failures.job_failure)."""
        return job_failure(self.output.stderr_tail, returncode, self.log_dir, self.script)
