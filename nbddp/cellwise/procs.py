"""The processes of a session: torchrun (in a session of its own, so that the kernel's interrupt does not reach
it: torchrun would stop its ranks) and its ranks, which it also starts in sessions of their own.

The kernel signals the ranks by their process ids (each rank says its id when it connects). torchrun gets SIGTERM
when the kernel dies (PR_SET_PDEATHSIG, Linux) and then stops its ranks; a rank also leaves by itself when its
connection to the kernel closes.
"""
from __future__ import annotations

import os
import signal
import time

from .glue import JobProcesses, send, start_torchrun


class Processes:
    def __init__(self, argv, env):
        self.argv, self.env = argv, env
        self.proc = self.tree = None
        self.ranks = {}  # rank -> pid

    def start(self):
        self.proc = start_torchrun(self.argv, self.env)
        self.tree = JobProcesses(self.proc)
        for pipe in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(pipe.fileno(), False)
        return self

    def joined(self, rank, pid):
        """A rank connected: its pid, and the process tree seen now, so that the end finds the rank even where
        torchrun is gone by then."""
        self.ranks[rank] = pid
        self.tree.live()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def interrupt(self, ranks):
        """SIGINT to these ranks (KeyboardInterrupt in the cell they run)."""
        for rank in ranks:
            if rank in self.ranks:
                send(os.kill, self.ranks[rank], signal.SIGINT)

    def end(self, grace=5.0):
        """Stop torchrun and every rank: SIGTERM (torchrun stops its ranks), then SIGKILL to what is left."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            self.tree.signal(sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and not self.tree.gone():
                time.sleep(0.05)
            if self.tree.gone():
                break
        for pipe in (self.proc.stdout, self.proc.stderr):
            pipe.close()
