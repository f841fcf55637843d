"""When a job fails: torchrun's report read (which rank started it, its exit code, its traceback), torchrun's own
noise held back from the output, and the error a cell or `nbddp run` raises, its frames given as cell lines."""
from __future__ import annotations

import glob
import os
import re
import signal

from ..cells import cell_at
from ..errors import LaunchError

TRACEBACK_LINES = 12


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


# ---- torchrun's report ----

_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):(.*?)(?:^=+$|\Z)", re.S | re.M)
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", re.M)
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.M)
_SUMMARY_TRACEBACK = re.compile(r"^\s*traceback\s*:\s*(.*)$", re.M)
_FAILED_BOX = re.compile(r"^\S+ FAILED\s*$(.*)\Z", re.S | re.M)
#: what a rank says when another rank's failure took the job down under it
_PEER_LOST = re.compile(r"Connection (reset|closed) by peer|remote process exited|ProcessGroup.*(abort|terminated)|"
                        r"Socket Timeout|NCCL communicator was aborted", re.I)
_RANK_PREFIX = re.compile(r"^\[rank\s?\d+\]:? ?")  # torch's "[rank1]: " on uncaught errors, torchrun's "[rank 1] "
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.*)$')


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


def all_failures(text: str):
    """[(rank, local_rank, exitcode)] of every failed rank in torchrun's report, in its order."""
    box = _FAILED_BOX.search(text)
    if box is None:
        return []
    ranks, codes = list(_RANK.finditer(box.group(1))), list(_EXITCODE.finditer(box.group(1)))
    return [(int(r.group(1)), int(r.group(2)), int(c.group(1))) for r, c in zip(ranks, codes)]


def last_traceback(text: str, max_lines: int = TRACEBACK_LINES) -> str:
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


def last_lines(text: str, count: int = TRACEBACK_LINES) -> str:
    lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return "\n".join(lines[-count:])


def rank_log(log_dir, local_rank, stream="stderr"):
    """The newest `stderr.log` torchrun wrote for `local_rank` under `log_dir`, or None."""
    if not log_dir:
        return None
    found = glob.glob(os.path.join(glob.escape(str(log_dir)), "*", "attempt_*", str(local_rank), f"{stream}.log"))
    return max(found, key=os.path.getmtime) if found else None


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


def _rank_traceback(stderr_tail, log_dir, local_rank, summary=""):
    """A failed rank's traceback: from its log file, or, for the rank that wrote to the console, its output."""
    log = rank_log(log_dir, local_rank)
    if log:
        with open(log, encoding="utf-8", errors="replace") as fh:
            logged = fh.read()
        return last_traceback(logged) or last_lines(logged)
    return last_traceback(stderr_tail) or summary


def job_failure(stderr_tail: str, returncode: int, log_dir=None, script=None) -> LaunchError:
    """The error for a job that exited with `returncode` != 0, from the end of torchrun's stderr: the failed rank
    whose own error started it (a rank that only lost its peer at a collective, such as the teardown's barrier,
    comes after it)."""
    parsed = parse_failure(stderr_tail)
    if parsed is None:
        tail = last_lines(stderr_tail, 3).replace("\n", " | ")
        return LaunchError(f"torchrun exited with status {returncode}" + (f": {tail}" if tail else "")
                           + "; check the command and the output above")
    root = parsed[:3]
    failed = [root] + [f for f in all_failures(stderr_tail) if f != root]
    found = [(f, _rank_traceback(stderr_tail, log_dir, f[1], parsed[3] if f == root else "")) for f in failed]
    (rank, local_rank, exitcode), text = next(
        ((f, text) for f, text in found if text and not _PEER_LOST.search(text)), found[0])
    return RankFailedError(rank, exitcode, cell_frames(text, script), local_rank=local_rank)


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
