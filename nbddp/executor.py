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
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from . import launch
from .cells import cell_at
from .errors import LaunchError

#: Seconds to wait after SIGINT, then after SIGTERM, before SIGKILL.
GRACE = (5.0, 3.0)
#: Seconds between two writes of the job's output (it comes in bursts: 20,000 lines would be hundreds of messages).
FLUSH_EVERY = 0.25
LOG_PREFIX = "nbddp-logs-"
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
        try:
            import torch  # only here: the converter and the CLI's startup never import torch
        except ImportError:
            raise LaunchError("'auto' counts the GPUs with torch, which is not installed here; give the number of "
                              "processes (--nproc N), or install torch") from None
        return torch.cuda.device_count() or 2
    try:
        count = int(text)
    except ValueError:
        raise LaunchError(f"the process count must be a whole number or 'auto', not {value!r}") from None
    if count < 1:
        raise LaunchError(f"the process count must be at least 1, not {count}")
    return count


def omp_threads(nproc: int) -> int:
    """CPU threads per process: the machine's cores shared out (torchrun would set 1 and print a banner)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, int(nproc)))


def child_env(base=None, all_ranks=False, nproc=1) -> dict:
    """The kernel's environment plus what the job needs: unbuffered output, NVLink multicast left off, and
    OMP_NUM_THREADS (a value the user set is kept)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # a value the user set is kept; nbddp itself only ever sets 0
    env.setdefault("OMP_NUM_THREADS", str(omp_threads(nproc)))
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


_FAILED_BOX = re.compile(r"^\S+ FAILED\s*$(.*)\Z", re.S | re.M)
#: what a rank says when another rank's failure took the job down under it
_PEER_LOST = re.compile(r"Connection (reset|closed) by peer|remote process exited|ProcessGroup.*(abort|terminated)|"
                        r"Socket Timeout|NCCL communicator was aborted", re.I)


def all_failures(text: str):
    """[(rank, local_rank, exitcode)] of every failed rank in torchrun's report, in its order."""
    box = _FAILED_BOX.search(text)
    if box is None:
        return []
    ranks, codes = list(_RANK.finditer(box.group(1))), list(_EXITCODE.finditer(box.group(1)))
    return [(int(r.group(1)), int(r.group(2)), int(c.group(1))) for r, c in zip(ranks, codes)]


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


def _die_with_parent():
    """In the launcher, before it runs: SIGTERM when the process that started it dies (a killed or crashed kernel),
    on which torchrun stops its ranks. Linux only; elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class LauncherNoise:
    """Holds back what torchrun itself writes when a rank fails: its own traceback (ending in ChildFailedError),
    the "Failures" report after it, and its logger's lines; a rank's output passes through as it comes (a held
    traceback block is let through once its exception line shows it is not torchrun's)."""

    def __init__(self):
        self.held, self.partial, self.done = [], "", False

    def feed(self, text: str) -> str:
        out = []
        for piece in (self.partial + text).splitlines(keepends=True):
            if not piece.endswith(("\n", "\r")):
                self.partial = piece
                break
            out.append(self._line(piece))
        else:
            self.partial = ""
        if self.partial and not self.held and not self.partial.startswith("Traceback"):
            out.append(self.partial)  # a progress bar still being drawn: shown now
            self.partial = ""
        return "".join(out)

    def _line(self, line: str) -> str:
        if self.done or "torch/distributed/elastic/" in line or line.rstrip("\r\n") == "=" * 60:
            return ""
        if line.startswith("Traceback (most recent call last):") or self.held:
            self.held.append(line)
            if self.held[1:] and not line.startswith((" ", "\t")) and line.strip():  # the exception line
                block, self.held = "".join(self.held), []
                if "ChildFailedError" in line:
                    self.done = True  # torchrun's own report follows, and then it exits
                    return ""
                return block
            return ""
        return line


def cell_frames(traceback_text: str, script) -> str:
    """Each frame of `traceback_text` that points into `script` given as the notebook cell and the line in it."""
    if not script or not os.path.isfile(script):
        return traceback_text
    with open(script, encoding="utf-8", errors="replace") as fh:
        lines = fh.read().splitlines()
    name = os.path.basename(script)
    out = []
    for line in traceback_text.splitlines():
        frame = _FRAME.match(line)
        where = cell_at(lines, int(frame.group(2))) if frame and os.path.basename(frame.group(1)) == name else None
        if where:
            number = int(frame.group(2))
            text = lines[number - 1].strip() if number <= len(lines) else ""
            line = f'  cell {where[0]}, line {where[1]}: {text}   ({name} line {number}, in {frame.group(3)})'
        out.append(line)
    return "\n".join(out)


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.*)$')


class TorchrunJob:
    """One torchrun process (in a session of its own) and its ranks.

    `wait()` streams stdout and stderr to this process's sys.stdout/sys.stderr as the bytes arrive (no line
    buffering, so `\\r` progress bars pass through), then returns torchrun's exit status. On KeyboardInterrupt it
    stops every rank (`stop()`) and re-raises."""

    def __init__(self, argv, env=None, log_dir=None, grace=GRACE, script=None):
        self.argv, self.env, self.log_dir, self.grace, self.script = list(argv), env, log_dir, grace, script
        self._noise = LauncherNoise()
        self.proc = None
        self.stderr_tail = ""
        self._seen = set()
        self._selector = None
        self._decoders = {}
        self._echo = True  # off once interrupted: torchrun's and the ranks' shutdown noise is drained, not shown
        self._pending = {"stdout": "", "stderr": ""}  # output not yet written: a few writes a second at most
        self._flushed = 0.0

    def start(self):
        try:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_die_with_parent)
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
            if text and dest == "stderr":
                self.stderr_tail = (self.stderr_tail + text)[-_TAIL_CHARS:]
                text = self._noise.feed(text)
            if text and self._echo:
                self._pending[dest] += text
        open_pipes = bool(self._selector.get_map())
        if not open_pipes or time.monotonic() - self._flushed >= FLUSH_EVERY:
            self._flush()
        return open_pipes

    def _flush(self):
        """Write what came since the last write, as one message per stream (a notebook front end shows each
        write as one output message)."""
        self._flushed = time.monotonic()
        for dest, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            if self._pending[dest]:
                stream.write(self._pending[dest])
                stream.flush()
                self._pending[dest] = ""

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

    def _traceback(self, local_rank, summary=""):
        """A failed rank's traceback: from its log file, or, for the rank that wrote to the console, its output."""
        log = rank_log(self.log_dir, local_rank)
        if log:
            with open(log, encoding="utf-8", errors="replace") as fh:
                logged = fh.read()
            return last_traceback(logged) or _last_lines(logged)
        return last_traceback(self.stderr_tail) or summary

    def failure(self, returncode: int) -> LaunchError:
        """The error for a job that exited with `returncode` != 0: the failed rank whose own error started it (a
        rank that only lost its peer at a collective, such as the teardown's barrier, comes after it)."""
        parsed = parse_failure(self.stderr_tail)
        if parsed is None:
            tail = _last_lines(self.stderr_tail, 3).replace("\n", " | ")
            return LaunchError(f"torchrun exited with status {returncode}" + (f": {tail}" if tail else "")
                               + "; check the command and the output above")
        root = parsed[:3]
        failed = [root] + [f for f in all_failures(self.stderr_tail) if f != root]
        found = [(f, self._traceback(f[1], parsed[3] if f == root else "")) for f in failed]
        (rank, local_rank, exitcode), text = next(
            ((f, text) for f, text in found if text and not _PEER_LOST.search(text)), found[0])
        return RankFailedError(rank, exitcode, cell_frames(text, self.script), local_rank=local_rank)


def run_argv(argv, env=None, log_dir=None, grace=GRACE, script=None) -> None:
    """Run a torchrun argv to the end, streaming its output; raise RankFailedError/LaunchError if it fails."""
    job = TorchrunJob(argv, env=env, log_dir=log_dir, grace=grace, script=script).start()
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
    sweep_log_dirs()
    with tempfile.TemporaryDirectory(prefix=f"{LOG_PREFIX}{os.getpid()}-") as tmp:
        log_dir = user_log_dir or tmp
        routing = launch.output_args(nproc, all_ranks=all_ranks, log_dir=log_dir, torchrun_args=extra)
        argv = launch.torchrun_argv(script, nproc, extra=[*routing, *extra], script_args=script_args)
        run_argv(argv, env=child_env(env, all_ranks=all_ranks, nproc=nproc), log_dir=log_dir, grace=grace,
                 script=script)


def sweep_log_dirs(root=None):
    """Remove the log folders of earlier jobs whose kernel (or shell) is gone: a killed kernel leaves its own."""
    for path in glob.glob(os.path.join(glob.escape(root or tempfile.gettempdir()), f"{LOG_PREFIX}*-*")):
        owner = os.path.basename(path)[len(LOG_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and int(owner) != os.getpid() and not _alive(int(owner)):
            shutil.rmtree(path, ignore_errors=True)
