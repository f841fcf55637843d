"""One cell on every rank, as the kernel follows it: who finished, who failed, who waits at nbddp's barrier, when
to interrupt the ranks still running, and what the cell raises. Pure bookkeeping (no processes, no sockets), driven
by kernel.Session.

- every rank done: the cell succeeds;
- a rank failed: the others get AGREE_WAIT seconds to fail too (an ordinary exception fails on every rank), then
  are interrupted (twice: the second SIGINT stops a rank at once, also inside a Trainer's loop); the cell raises
  RankFailedError with the first failing rank's traceback, and the session goes on;
- a barrier that cannot be passed (a rank finished the cell while others wait at nbddp's barrier for it): the
  waiting ranks are interrupted, and the cell raises RankFailedError saying so;
- the kernel's interrupt: SIGINT to every rank still running (inside a Trainer's loop they stop after the same
  step: stop.py); the cell raises KeyboardInterrupt; a second interrupt stops them at once;
- a rank that does not stop in time (it waits in a collective for a rank that failed): the session must end.
"""
from __future__ import annotations

from . import wire
from .glue import RankFailedError

AGREE_WAIT = 3.0  # after one rank fails, how long the others may take to fail on their own before the interrupt
STOP_WAIT = 60.0  # after the interrupt, how long the ranks may take to stop (a training step must end first)
FAILED_STOP_WAIT = 10.0  # after a rank failed and the others were interrupted, how long they may take to stop
AGAIN_STOP_WAIT = 5.0  # after a second interrupt


class CellRun:
    def __init__(self, cell_id, ranks):
        self.id, self.ranks = cell_id, frozenset(ranks)
        self.pending, self.failures, self.waiting = set(ranks), {}, {}
        self.signals = self.interrupts = 0
        self.stop_at = self.give_up_at = None
        self.unmatched = None  # (waiting rank, n, ranks gone) of a barrier that could not be passed

    def message(self, rank, kind, fields, now) -> int | None:
        """Take a rank's message; returns the barrier number every rank may now pass (send GO), if any."""
        if fields.get("id") != self.id:
            return None
        if kind == wire.BARRIER:
            self.waiting[rank] = fields["n"]
            if set(self.waiting) == self.ranks and len(set(self.waiting.values())) == 1:
                self.waiting.clear()
                return fields["n"]
        elif kind in (wire.DONE, wire.FAILED):
            self.pending.discard(rank)
            self.waiting.pop(rank, None)
            if kind == wire.FAILED:
                self.failures[rank] = fields
                self.stop_at = self.stop_at or now + AGREE_WAIT
        return None

    def due(self, now) -> tuple[set, bool]:
        """(ranks to interrupt now, whether the ranks still running waited too long: the session must end)."""
        if self.pending and self.pending <= set(self.waiting) and self.pending != self.ranks and self.stop_at is None:
            rank = min(self.pending)
            self.unmatched, self.stop_at = (rank, self.waiting[rank], sorted(self.ranks - self.pending)), now
        signal = set()
        if self.pending and self.stop_at is not None and self.signals < 2 and now >= self.stop_at:
            signal, self.signals = set(self.pending), self.signals + 1
            self.stop_at, self.give_up_at = now + 0.5, self.give_up_at or now + FAILED_STOP_WAIT
        return signal, bool(self.pending and self.give_up_at is not None and now >= self.give_up_at)

    def interrupted(self, now) -> set:
        """The kernel was interrupted: the ranks to send SIGINT to."""
        self.interrupts += 1
        self.signals = 2
        self.give_up_at = now + (STOP_WAIT if self.interrupts == 1 else AGAIN_STOP_WAIT)
        return set(self.pending)

    def real_failures(self) -> dict:
        return {rank: got for rank, got in self.failures.items() if not got["interrupted"]}

    def outcome(self) -> BaseException | None:
        """What the cell raises once every rank answered (None: it succeeded)."""
        failed = self.real_failures()
        if failed:
            first, got = next(iter(failed.items()))
            last = got["traceback"].strip().splitlines()[-1]
            others = sorted(set(failed) - {first})
            also = f" (also on rank {', '.join(map(str, others))})" if others else ""
            return _error(first, got["traceback"], f"rank {first} raised {last}{also}; the session goes on: fix "
                                                   "the cell and run it again")
        if self.unmatched and not self.interrupts:
            rank, n, gone = self.unmatched
            return _error(rank, "", f"rank {rank} waited at nbddp_barrier #{n} of the cell, which rank "
                                    f"{', '.join(map(str, gone))} never reached (it finished the cell); the session "
                                    "goes on: give every rank the same barriers")
        if self.failures or self.interrupts:
            stopped = KeyboardInterrupt()
            stopped._render_traceback_ = lambda: ["KeyboardInterrupt: the cell stopped on every rank; the session "
                                                  "goes on"]  # IPython shows this instead of nbddp's own stack
            return stopped
        return None


def _error(rank, traceback, headline) -> RankFailedError:
    """RankFailedError with nbddp's session wording (no process exited: there is no exit code to give)."""
    error = RankFailedError(rank, None, traceback)
    error.args = (headline,)
    return error


def ended(rank, why, traceback, nproc) -> RankFailedError:
    return _error(rank, traceback, f"{why}; the session has ended: %ddp {nproc} starts a new one")
