"""The kernel's side of a `%ddp` session: torchrun started once, one connection per rank, each cell sent to every
rank and its outcome gathered.

While a cell runs, one loop (in the kernel's main thread, so that the kernel's interrupt lands in it) waits on
torchrun's output pipes and every rank's connection together. Rank 0 writes to torchrun's own stdout and stderr,
which stream into the cell as they come, a few writes a second; the other ranks write to torchrun's log files (shown
prefixed `[rank N]` with `--all-ranks`, torchrun's `--tee`). Rank 0 flushes its output before each message it sends,
and the kernel reads what the pipes hold before it acts on a message, so a display comes after what was printed
before it.

What a cell's answers mean (done, failed, interrupted, a rank that cannot stop): cellrun.py. A rank's process
that dies, or torchrun gone, ends the session, and the cell says so.

Between cells nothing reads the pipes: a rank that prints more than a pipe holds (64 KiB) between cells, from a
thread of its own, waits until the next cell starts.
"""
from __future__ import annotations

import os
import selectors
import tempfile
import threading
import time
from queue import Empty, Queue

from . import wire
from .cellrun import CellRun, ended
from .glue import LOG_PREFIX, JobOutput, rank_log, session_launch, sweep_log_dirs
from .procs import Processes

START_WAIT = 600.0  # torch's import and the process group, on every rank


class Session:
    def __init__(self, nproc: int, all_ranks=False):
        self.nproc, self.all_ranks = nproc, all_ranks
        self.conns, self.output = {}, JobOutput()
        self.cells_run = 0
        self.dead = None  # why the session ended

    # ---- start and stop ----

    def start(self):
        sweep_log_dirs()  # a killed kernel's session left its own
        self.logs = tempfile.TemporaryDirectory(prefix=f"{LOG_PREFIX}{os.getpid()}-session-")
        listener, reach = wire.listen()
        job = session_launch(self.nproc, all_ranks=self.all_ranks, log_dir=self.logs.name)
        self.procs = Processes(job.argv, {**os.environ, **job.env, **reach}).start()
        accepted = Queue()

        def accept():
            try:
                for _ in range(self.nproc):
                    accepted.put(listener.accept())
            except OSError:
                pass

        threading.Thread(target=accept, daemon=True, name="nbddp-session-accept").start()
        self.selector = selectors.DefaultSelector()
        for pipe, dest in ((self.procs.proc.stdout, "stdout"), (self.procs.proc.stderr, "stderr")):
            self.selector.register(pipe, selectors.EVENT_READ, dest)
        deadline, ready = time.monotonic() + START_WAIT, set()
        try:
            while len(ready) < self.nproc:
                try:
                    conn = accepted.get_nowait()
                    kind, fields = conn.recv()
                    self.conns[fields["rank"]] = conn
                    self.procs.joined(fields["rank"], fields["pid"])
                    self.selector.register(conn, selectors.EVENT_READ, fields["rank"])
                except Empty:
                    pass
                for rank, message in self._events(0.1):
                    if message is None:
                        raise self._die(rank, f"rank {rank} ended while the session started")
                    if message[0] == wire.READY:
                        ready.add(rank)
                if not self.procs.running():
                    raise self._die(None, "torchrun exited while the session started")
                if time.monotonic() > deadline:
                    raise self._die(None, f"the ranks were not ready after {START_WAIT:.0f} s")
        except KeyboardInterrupt:
            self.end()
            raise
        finally:
            listener.close()
            self.output.flush()
        return self

    def end(self):
        if self.dead is None:
            self.dead = "stopped"
        self.output.echo = False
        for conn in self.conns.values():
            conn.close()
        if getattr(self, "selector", None) is not None:
            self.selector.close()
        self.procs.end()
        self.logs.cleanup()

    def stop(self):
        """`%ddp stop`: every rank closes the process group (a barrier) and leaves; then the processes go."""
        for conn in self.conns.values():
            try:
                wire.send(conn, (wire.STOP, {}))
            except OSError:
                pass
        deadline = time.monotonic() + 30
        while self.procs.running() and time.monotonic() < deadline:
            self._events(0.1)
        self.output.flush()
        self.end()

    # ---- one cell ----

    def run(self, fields: dict):
        """Run one converted cell on every rank; returns when every rank finished it, else raises."""
        for rank, message in self._events(0):  # what came between cells
            if message is None:
                raise self._die(rank, f"rank {rank}'s process ended between cells")
        self._send_all((wire.CELL, fields), "between cells")
        self.cells_run += 1
        cell = CellRun(fields["id"], self.conns)
        while cell.pending:
            try:
                for rank, message in self._events(0.2):
                    if message is None:
                        raise self._die(rank, f"rank {rank}'s process ended during the cell",
                                        cell.real_failures())
                    go = cell.message(rank, *message, time.monotonic())
                    if go is not None:
                        self._send_all((wire.GO, {"id": fields["id"], "n": go}), "during the cell")
                if not self.procs.running():
                    raise self._die(None, "torchrun exited during the cell", cell.real_failures())
                signal, late = cell.due(time.monotonic())
                self.procs.interrupt(signal)
                if late:
                    names = ", ".join(f"rank {r}" for r in sorted(cell.pending))
                    raise self._die(min(cell.pending), f"{names} did not stop (waiting in a collective?)",
                                    cell.real_failures(), ": the ranks can no longer agree")
            except KeyboardInterrupt:
                if cell.interrupts >= 2:
                    raise self._die(None, "interrupted three times", cell.real_failures()) from None
                self.procs.interrupt(cell.interrupted(time.monotonic()))
        self._settle()
        error = cell.outcome()
        if error is not None:
            raise error

    def _send_all(self, message, when):
        for rank, conn in self.conns.items():
            try:
                wire.send(conn, message)
            except OSError:
                raise self._die(rank, f"rank {rank}'s process ended {when}") from None

    # ---- events and output ----

    def _events(self, timeout):
        """Wait up to `timeout` for output or messages; output is written, messages returned as (rank, message),
        (rank, None) for a closed connection. A display is shown here, after the output that came before it."""
        out = []
        for key, _ in self.selector.select(timeout):
            if isinstance(key.data, str):
                self._read(key)
                continue
            try:
                message = key.fileobj.recv()
            except (EOFError, OSError):
                self.selector.unregister(key.fileobj)
                out.append((key.data, None))
                continue
            if message[0] == wire.DISPLAY:
                self._drain()
                self._show(message[1])
            else:
                out.append((key.data, message))
        self.output.flush(due=True)
        return out

    def _read(self, key):
        if not self.output.read(key.data, key.fileobj.fileno()):
            self.selector.unregister(key.fileobj)

    def _drain(self):
        for key in list(self.selector.get_map().values()):
            if isinstance(key.data, str):
                self._read(key)
        self.output.flush()

    def _settle(self):
        """The last output of a cell: rank 0's is in the pipes already; the other ranks' (--all-ranks) comes from
        torchrun tailing their log files, a moment later."""
        end = time.monotonic() + (0.5 if self.all_ranks else 0)
        while True:
            self._drain()
            if time.monotonic() >= end:
                return
            self._events(0.1)

    @staticmethod
    def _show(fields):
        from IPython.display import clear_output, publish_display_data

        if fields.get("clear"):
            clear_output(wait=fields["wait"])
        else:
            publish_display_data(fields["data"], fields["metadata"], transient=fields["transient"],
                                 update=fields["update"])

    def _die(self, rank, why, failures=None, tail=""):
        """End the session; the error to raise: the rank's own traceback where one is known."""
        self._drain()
        text = ""
        for failed, got in (failures or {}).items():
            if not got["interrupted"]:  # the rank whose own error left the others waiting
                rank, text = failed, got["traceback"]
                why += f" after rank {failed} failed"
                break
        if not text and rank == 0:  # rank 0 writes to the kernel's own pipes
            text = "\n".join(self.output.stderr_tail.splitlines()[-12:])
        elif not text and rank is not None:
            log = rank_log(self.logs.name, rank)  # one machine: the rank is its local rank
            if log:
                with open(log, encoding="utf-8", errors="replace") as fh:
                    text = "\n".join(fh.read().splitlines()[-12:])
        self.dead = why + tail
        self.end()
        return ended(rank, why + tail, text, self.nproc)
