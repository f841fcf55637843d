"""File descriptor 0 of a multi-process job: rank 0 alone reads the real stdin, and every rank's descriptor 0 gives
the same bytes. torchrun hands every rank the same stdin: two ranks reading it would race for its lines, and a
library that reads descriptor 0 itself (a prompt toolkit's raw input, `os.read(0, ...)`) would block forever on a
pipe that nobody writes.

As the script starts, descriptor 0 of each rank becomes a pipe of nbddp's. On rank 0 a thread copies the real stdin
into it and, piece by piece, into the process group's store; on the other ranks a thread copies the store's pieces
into theirs. A stdin that is not a terminal and gives nothing for NBDDP_STDIN_QUIET seconds has ended: every rank's
readers then read the end of their input, never a hang. A terminal stays rank 0's own; the other ranks' descriptor 0
ends at once. The copying thread ends with the script's main thread, before Python's own end (a thread still in the
store's C++ code then aborts the process), and a full pipe that nobody reads holds it only while the script runs.
Python's readers (input, getpass, sys.stdin) ask through nbddp_ask (ask.py), which keeps every rank at
the same place in the stream."""
import contextlib
import os
import select
import threading
import time

from .group import NBDDP_AT_START, NBDDP_IS_MAIN, NBDDP_WORLD_SIZE
from .hooks import _nbddp_choice
from .wait import nbddp_store

NBDDP_STDIN_QUIET = float(os.environ.get("NBDDP_STDIN_QUIET", "5"))  # seconds of nothing that end a piped stdin
NBDDP_STDIN_KEY = "nbddp/stdin/{}"  # the n-th piece of rank 0's stdin; an empty piece ends it
NBDDP_STDIN = {"shared": False, "quiet": False}  # descriptor 0 is nbddp's pipe; rank 0's stdin ended by its quiet
_NBDDP_MAIN = threading.main_thread()


def nbddp_fd_line(fd):
    """A line of descriptor `fd`, read a byte at a time (what the next reader waits for stays in the pipe): its
    bytes, the newline kept; b"" at the end of the input."""
    line = b""
    while not line.endswith(b"\n") and (byte := os.read(fd, 1)):
        line += byte
    return line


def _nbddp_pipe_on_fd0():
    """Descriptor 0 reads a new pipe; its writing end, for the thread that fills it."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    os.dup2(read, 0)
    os.close(read)
    NBDDP_STDIN["shared"] = True
    return write


def _nbddp_the_store():
    """The process group's store, once the group is up (the thread starts before it); None if the script ends first."""
    while (store := nbddp_store()) is None and _NBDDP_MAIN.is_alive():
        time.sleep(0.05)
    return store


def _nbddp_fill(write, piece):
    """All of `piece` into the pipe, as room comes (its writing end does not block), while the script runs."""
    while piece and _NBDDP_MAIN.is_alive():
        if select.select([], [write], [], 0.1)[1]:
            piece = piece[os.write(write, piece):]


def _nbddp_relay(real, write):
    """Rank 0: the real stdin into descriptor 0's pipe, and each piece into the store as soon as the group is up,
    until the stdin ends or stays quiet (an empty piece ends it for every rank)."""
    pieces, sent, store, last = [], 0, None, time.monotonic()
    while real is not None and _NBDDP_MAIN.is_alive():
        piece = os.read(real, 65536) if select.select([real], [], [], 0.1)[0] else None
        if piece:
            _nbddp_fill(write, piece)
            last = time.monotonic()
        elif piece is None and time.monotonic() - last >= NBDDP_STDIN_QUIET:
            NBDDP_STDIN["quiet"], piece = True, b""
        if piece == b"":
            os.close(write), os.close(real)
            real = None
        if piece is not None:
            pieces.append(piece)
        store = store or nbddp_store()
        sent = _nbddp_publish(store, pieces, sent)
    _nbddp_publish(store or _nbddp_the_store(), pieces or [b""], sent)


def _nbddp_publish(store, pieces, sent):
    """The pieces from the `sent`-th on into the store (None: not up yet); how many the store holds now."""
    if store is None or not _NBDDP_MAIN.is_alive():
        return sent
    for n in range(sent, len(pieces)):
        store.set(NBDDP_STDIN_KEY.format(n), pieces[n])
    return len(pieces)


def _nbddp_replay(write):
    """Another rank: rank 0's pieces into this rank's descriptor 0, to their end."""
    store, n = _nbddp_the_store(), 0
    try:
        while store is not None and _NBDDP_MAIN.is_alive():
            if not store.check([NBDDP_STDIN_KEY.format(n)]):
                time.sleep(0.05)
            elif not (piece := store.get(NBDDP_STDIN_KEY.format(n))):
                break
            else:
                _nbddp_fill(write, piece)
                n += 1
    finally:
        os.close(write)


def _nbddp_run(target, *args):
    def run():
        with contextlib.suppress(Exception):  # the group or the reader is gone: nothing is left to copy
            target(*args)

    threading.Thread(target=run, name="nbddp-stdin").start()


def nbddp_share_stdin():
    """Descriptor 0 of every rank a pipe of nbddp's, fed from rank 0's stdin (NBDDP_INPUT=0: each rank its own)."""
    if NBDDP_WORLD_SIZE == 1 or _nbddp_choice("NBDDP_INPUT") is False:
        return
    if not NBDDP_IS_MAIN:
        return _nbddp_run(_nbddp_replay, _nbddp_pipe_on_fd0())
    try:
        real = None if os.isatty(0) else os.dup(0)  # a terminal stays rank 0's own
    except OSError:  # no stdin at all
        real = None
    _nbddp_run(_nbddp_relay, real, None if real is None else _nbddp_pipe_on_fd0())


NBDDP_AT_START.append(nbddp_share_stdin)
