"""Running a torchrun job from a notebook kernel or a shell: stream its output live, stop every rank on interrupt,
and turn a failed rank into an exception. The argv comes from nbddp.launch; this module only runs it.

Shared by the `%%torchrun` magic (nbddp.magic) and `nbddp run` (nbddp.cli).
"""
from __future__ import annotations

import codecs
import glob
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time

from . import launch
from .errors import LaunchError

#: Seconds to wait after SIGINT, then after SIGTERM, before SIGKILL.
GRACE = (5.0, 3.0)
_TAIL_CHARS = 64 * 1024
_TRACEBACK_LINES = 12


class RankFailedError(LaunchError):
    """A rank of the job failed. `str()` is one line; `traceback` holds the tail of the rank's traceback."""

    def __init__(self, rank, exitcode, traceback="", local_rank=None):
        self.rank, self.exitcode, self.local_rank = rank, exitcode, local_rank
        self.traceback = traceback.rstrip()
        super().__init__(self.headline())

    def headline(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        if self.exitcode is not None and self.exitcode < 0:
            name = _signal_name(-self.exitcode)
            what = f"{who} was killed by signal {-self.exitcode} ({name})"
            if -self.exitcode == signal.SIGKILL:
                what += "; often the machine or the GPU ran out of memory"
        else:
            what = f"{who} failed with exit code {self.exitcode}"
        last = _exception_line(self.traceback)
        if last:
            what += f": {last}"
        return what + "; fix it and run again"

    def exit_status(self) -> int:
        """A shell exit status: the rank's own code, 128+N for signal N, else 1."""
        if self.exitcode is None or self.exitcode == 0:
            return 1
        return 128 - self.exitcode if self.exitcode < 0 else self.exitcode

    def _render_traceback_(self):
        """IPython shows these lines instead of nbddp's own stack (the rank's traceback is what matters)."""
        lines = [f"{type(self).__name__}: {self}"]
        if self.traceback:
            lines.append(f"rank {self.rank} traceback (last lines):")
            lines += ["    " + line for line in self.traceback.splitlines()]
        return lines


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def _exception_line(traceback_text: str) -> str:
    lines = [line for line in traceback_text.splitlines() if line.strip()]
    return lines[-1].strip() if lines and not lines[-1].startswith((" ", "\t")) else ""


# ---- pure helpers: how many processes, which environment, what failed ----

def resolve_nproc(value) -> int:
    """A positive count, or 'auto': the GPUs torch sees, or 2 CPU processes where there are none."""
    text = str(value).strip().lower()
    if text == "auto":
        import torch  # only here: the converter and the CLI's startup never import torch

        return torch.cuda.device_count() or 2
    try:
        count = int(text)
    except ValueError:
        raise LaunchError(f"the process count must be a whole number or 'auto', not {value!r}") from None
    if count < 1:
        raise LaunchError(f"the process count must be at least 1, not {count}")
    return count


def child_env(base=None, all_ranks=False) -> dict:
    """The kernel's environment plus what the job needs: unbuffered output, and NVLink multicast left off."""
    env = dict(os.environ if base is None else base)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # a value the user set is kept; nbddp itself only ever sets 0
    if all_ranks:
        env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = launch.RANK_PREFIX_TEMPLATE
    return env


_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):(.*?)(?:^=+$|\Z)", re.S | re.M)
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", re.M)
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.M)
_SUMMARY_TRACEBACK = re.compile(r"^\s*traceback\s*:\s*(.*)$", re.M)


def parse_failure(text: str):
    """(rank, local_rank, exitcode, summary_traceback) from torchrun's failure summary, or None."""
    found = None
    for match in _ROOT_CAUSE.finditer(text):
        found = match.group(1)
    if found is None:
        return None
    rank, exitcode, summary = _RANK.search(found), _EXITCODE.search(found), _SUMMARY_TRACEBACK.search(found)
    if not rank or not exitcode:
        return None
    tb = summary.group(1).strip() if summary else ""
    if tb.startswith("To enable traceback"):
        tb = ""
    return int(rank.group(1)), int(rank.group(2)), int(exitcode.group(1)), tb


_RANK_PREFIX = re.compile(r"^\[rank\s?\d+\]:? ?")  # torch's "[rank1]: " on uncaught errors, torchrun's "[rank 1] "


def last_traceback(text: str, max_lines: int = _TRACEBACK_LINES) -> str:
    """The last lines of the last Python traceback in `text`, skipping torchrun's own ChildFailedError."""
    lines = [_RANK_PREFIX.sub("", line) for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].startswith("Traceback (most recent call last):"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith((" ", "\t")) or not lines[j].strip()):
                j += 1
            block = lines[i:j + 1]
            if not any("ChildFailedError" in line for line in block):
                blocks.append(block)
            i = j + 1
        else:
            i += 1
    if not blocks:
        return ""
    block = [line for line in blocks[-1] if line.strip()]
    return "\n".join(block[-max_lines:])


def _last_lines(text: str, count: int = _TRACEBACK_LINES) -> str:
    lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return "\n".join(lines[-count:])


def rank_log(log_dir, local_rank, stream="stderr"):
    """The newest `stderr.log` torchrun wrote for `local_rank` under `log_dir`, or None."""
    if not log_dir:
        return None
    found = glob.glob(os.path.join(glob.escape(str(log_dir)), "*", "attempt_*", str(local_rank), f"{stream}.log"))
    return max(found, key=os.path.getmtime) if found else None


# ---- processes ----

def _proc_children() -> dict:
    """{ppid: [pid, ...]} from /proc (Linux); empty elsewhere."""
    children = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat, "rb") as fh:
                data = fh.read()
            fields = data[data.rindex(b")") + 2:].split()
            children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
        except (OSError, ValueError, IndexError):
            continue
    return children


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (the ranks run in sessions of their own, so a process-group signal
    to torchrun does not reach them)."""
    children, tree, todo = _proc_children(), [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, ()))
    return tree


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        return data[data.rindex(b")") + 2:].split()[0] not in (b"Z", b"X")
    except (OSError, ValueError):
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


class TorchrunJob:
    """One torchrun process (in a session of its own) and its ranks.

    `wait()` streams stdout and stderr to this process's sys.stdout/sys.stderr as the bytes arrive (no line
    buffering, so `\\r` progress bars pass through), then returns torchrun's exit status. On KeyboardInterrupt it
    stops every rank (`stop()`) and re-raises."""

    def __init__(self, argv, env=None, log_dir=None, grace=GRACE):
        self.argv, self.env, self.log_dir, self.grace = list(argv), env, log_dir, grace
        self.proc = None
        self.stderr_tail = ""
        self._seen = set()
        self._selector = None
        self._decoders = {}
        self._echo = True  # off once interrupted: torchrun's and the ranks' shutdown noise is drained, not shown

    def start(self):
        try:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise LaunchError(f"cannot start torchrun ({exc.strerror}): {self.argv[0]}") from None
        self._selector = selectors.DefaultSelector()
        for pipe, dest in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")):
            self._selector.register(pipe, selectors.EVENT_READ, dest)
            self._decoders[dest] = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return self

    def _pump(self, timeout: float) -> bool:
        """Copy what output is ready (waiting up to `timeout`); False once both pipes are closed."""
        if not self._selector.get_map():
            if timeout:
                time.sleep(min(timeout, 0.05))
            return False
        for key, _ in self._selector.select(timeout):
            data = os.read(key.fd, 65536)
            dest = key.data
            if not data:
                self._selector.unregister(key.fileobj)
                key.fileobj.close()
                text = self._decoders[dest].decode(b"", final=True)
            else:
                text = self._decoders[dest].decode(data)
            if text and self._echo:
                stream = sys.stdout if dest == "stdout" else sys.stderr
                stream.write(text)
                stream.flush()
                if dest == "stderr":
                    self.stderr_tail = (self.stderr_tail + text)[-_TAIL_CHARS:]
        return bool(self._selector.get_map())

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

    def _remember_tree(self):
        if self.proc.poll() is None:
            self._seen.update(process_tree(self.proc.pid))
        self._seen = {pid for pid in self._seen if _alive(pid)}
        return self._seen

    def _signal(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except OSError:
            pass
        for pid in self._remember_tree():
            if pid == self.proc.pid:
                continue
            for send in (os.killpg, os.kill):  # a rank leads its own session; its children share it
                try:
                    send(pid, sig)
                except OSError:
                    pass

    def _wait_gone(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            self.proc.poll()
            if self.proc.returncode is not None and not self._remember_tree():
                return True
            if time.monotonic() >= deadline:
                return False
            try:
                if self._selector is not None:
                    self._pump(0.05)
                else:
                    time.sleep(0.05)
            except (OSError, ValueError):
                time.sleep(0.05)

    def stop(self):
        """SIGINT to torchrun's process group and every rank, then SIGTERM, then SIGKILL, each after a short grace
        period; returns once no process of the job is left. A second interrupt goes straight to SIGKILL."""
        if self.proc is None:
            return
        self._remember_tree()
        print(f"\nnbddp: interrupted; stopping torchrun and its ranks ({len(self._seen)} processes)",
              file=sys.stderr, flush=True)
        self._echo = False
        try:
            for sig, grace in zip((signal.SIGINT, signal.SIGTERM), self.grace):
                self._signal(sig)
                if self._wait_gone(grace):
                    break
        except KeyboardInterrupt:
            pass
        for _ in range(50):
            if self.proc.poll() is not None and not self._remember_tree():
                break
            self._signal(signal.SIGKILL)
            time.sleep(0.1)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._close()

    def failure(self, returncode: int) -> LaunchError:
        """The error for a job that exited with `returncode` != 0."""
        parsed = parse_failure(self.stderr_tail)
        if parsed is None:
            tail = _last_lines(self.stderr_tail, 3).replace("\n", " | ")
            return LaunchError(f"torchrun exited with status {returncode}" + (f": {tail}" if tail else "")
                               + "; check the command and the output above")
        rank, local_rank, exitcode, summary = parsed
        text = ""
        log = rank_log(self.log_dir, local_rank)
        if log:
            with open(log, encoding="utf-8", errors="replace") as fh:
                logged = fh.read()
            text = last_traceback(logged) or _last_lines(logged)
        if not text:
            text = last_traceback(self.stderr_tail) or summary
        return RankFailedError(rank, exitcode, text, local_rank=local_rank)


def run_argv(argv, env=None, log_dir=None, grace=GRACE) -> None:
    """Run a torchrun argv to the end, streaming its output; raise RankFailedError/LaunchError if it fails."""
    job = TorchrunJob(argv, env=env, log_dir=log_dir, grace=grace).start()
    returncode = job.wait()
    if returncode:
        raise job.failure(returncode)


def run_script(script, nproc, *, extra=(), script_args=(), all_ranks=False, env=None, grace=GRACE) -> None:
    """Launch `script` on `nproc` processes per node with torchrun, stream the output (rank 0 only, or every rank
    prefixed `[rank N]` with all_ranks), and raise RankFailedError naming the rank that failed."""
    extra = list(extra)
    if launch.has_flag(extra, launch.NPROC_FLAGS):
        raise LaunchError("give the process count as N (or --nproc N), not as torchrun's --nproc-per-node")
    user_log_dir = launch.flag_value(extra, launch.LOG_DIR_FLAGS)
    with tempfile.TemporaryDirectory(prefix="nbddp-logs-") as tmp:
        log_dir = user_log_dir or tmp
        routing = launch.output_args(nproc, all_ranks=all_ranks, log_dir=log_dir, torchrun_args=extra)
        argv = launch.torchrun_argv(script, nproc, extra=[*routing, *extra], script_args=script_args)
        run_argv(argv, env=child_env(env, all_ranks=all_ranks), log_dir=log_dir, grace=grace)
