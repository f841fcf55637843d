"""The processes of a job: torchrun and its ranks (psutil walks the tree), whether one still runs, signals to all
of them, and torchrun dying with the kernel that started it."""
from __future__ import annotations

import os
import signal
import subprocess

import psutil

from ..errors import LaunchError

_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def alive(pid: int) -> bool:
    """The process runs (an exited one that its parent has not reaped yet does not)."""
    try:
        return psutil.Process(pid).status() not in _GONE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: it exists
        return True


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() not in _GONE  # is_running: the pid is not a new process's
    except psutil.NoSuchProcess:
        return False


class JobProcesses:
    """torchrun (`launcher`, the Popen that leads a session of its own) and every descendant seen while it ran: a
    rank whose torchrun is already gone is still found, and signalled."""

    def __init__(self, launcher: subprocess.Popen):
        self.launcher, self.root = launcher, launcher.pid
        self.top, self.seen = psutil.Process(self.root), {}

    def gone(self) -> bool:
        """torchrun has exited (and is reaped) and no process of the job is left."""
        return self.launcher.poll() is not None and not self.live()

    def live(self) -> list[psutil.Process]:
        """The job's processes still running, the tree walked again while torchrun runs."""
        try:
            if _running(self.top):
                for proc in [self.top, *self.top.children(recursive=True)]:
                    self.seen.setdefault(proc.pid, proc)
        except psutil.NoSuchProcess:
            pass
        self.seen = {pid: proc for pid, proc in self.seen.items() if _running(proc)}
        return list(self.seen.values())

    def signal(self, sig) -> None:
        """`sig` to torchrun's process group and to each rank's (a rank leads its own session; its children share
        it), and to each process itself."""
        send(os.killpg, self.root, sig)
        for proc in self.live():
            if proc.pid != self.root:
                send(os.killpg, proc.pid, sig)
                send(os.kill, proc.pid, sig)


def send(kill, pid, sig) -> bool:
    """`kill(pid, sig)` (os.kill or os.killpg); False where the process or group is gone."""
    try:
        kill(pid, sig)
        return True
    except OSError:
        return False


def start_torchrun(argv, env) -> subprocess.Popen:
    """torchrun in a session of its own (the kernel's interrupt does not reach it: nbddp stops the job itself), its
    output piped, dying with the process that starts it."""
    try:
        env = {**(os.environ if env is None else env), "NBDDP_OWNER": str(os.getpid())}  # runtime/owner.py
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, preexec_fn=die_with_parent)
    except OSError as exc:
        raise LaunchError(f"cannot start torchrun ({exc.strerror}): {argv[0]}") from None


def die_with_parent():
    """In the launcher, before it runs: SIGTERM when the process that started it dies (a killed or crashed kernel),
    on which torchrun stops its ranks. Linux only; elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
