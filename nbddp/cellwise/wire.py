"""The connection between the kernel and one rank: a local socket (multiprocessing.connection, 127.0.0.1) with a
random authentication key, so that no other program on the machine can send a rank code to run.

The kernel listens; each rank connects once, says who it is, and then the two exchange small tuples
`(kind, fields)`. The address and the key reach the ranks through their environment (torchrun passes the kernel's
environment on), never on a command line.

kernel -> rank: CELL {id, name, label, code, source, modules}, GO {id, n}, STOP {}
rank -> kernel: HELLO {rank, local_rank, pid}, READY {}, DISPLAY {data, metadata, transient, update},
                BARRIER {id, n}, DONE {id}, FAILED {id, traceback, interrupted}
"""
from __future__ import annotations

import os
import signal
import threading
from multiprocessing.connection import Client, Listener

ADDRESS_ENV = "NBDDP_SESSION_ADDRESS"
KEY_ENV = "NBDDP_SESSION_KEY"

CELL, GO, STOP = "cell", "go", "stop"
HELLO, READY, DISPLAY, BARRIER, DONE, FAILED = "hello", "ready", "display", "barrier", "done", "failed"


def listen() -> tuple[Listener, dict]:
    """A listener on a free local port, and the environment entries that tell a rank how to reach it."""
    key = os.urandom(32)
    listener = Listener(("127.0.0.1", 0), authkey=key)
    host, port = listener.address
    return listener, {ADDRESS_ENV: f"{host}:{port}", KEY_ENV: key.hex()}


def connect(environ=None):
    """A rank's connection to the kernel, from the environment `listen` made (the key is then removed from it, so
    that the notebook's code and its subprocesses do not see it)."""
    environ = os.environ if environ is None else environ
    host, port = environ[ADDRESS_ENV].rsplit(":", 1)
    key = bytes.fromhex(environ.pop(KEY_ENV))
    environ.pop(ADDRESS_ENV, None)
    return Client((host, int(port)), authkey=key)


def send(conn, message):
    """Send one message whole: an interrupt (SIGINT) that comes meanwhile is held until it is sent, then raises as
    usual. A half-sent message would leave the other side unable to read any further."""
    main = threading.current_thread() is threading.main_thread()
    if main:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        conn.send(message)
    finally:
        if main:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
