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

from .glue import alive, send, start_torchrun


class Processes:
    def __init__(self, argv, env):
        self.argv, self.env = argv, env
        self.proc = None
        self.ranks = {}  # rank -> pid

    def start(self):
        self.proc = start_torchrun(self.argv, self.env)
        for pipe in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(pipe.fileno(), False)
        return self

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
        pids = list(self.ranks.values())
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            if self.proc.poll() is None:
                send(os.killpg, self.proc.pid, sig)
            for pid in pids:
                send(os.killpg, pid, sig) or send(os.kill, pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and (self.proc.poll() is None or any(map(alive, pids))):
                time.sleep(0.05)
            if self.proc.poll() is not None and not any(map(alive, pids)):
                break
        for pipe in (self.proc.stdout, self.proc.stderr):
            pipe.close()
