"""Waits that outlast rank-0 work: ranks meet through the process group's key-value store, polled in short steps,
never in a collective of the group. A collective waits only as long as the group's timeout (NCCL's watchdog then
kills the rank); a rank polling the store can wait for hours, says once what it waits for, and still dies at once
when torchrun stops the job because rank 0 failed."""
import atexit
import os
import sys
import time

import torch.distributed

NBDDP_WAIT_NOTICE = float(os.environ.get("NBDDP_WAIT_NOTICE", "60"))  # seconds before a waiting rank says so
NBDDP_STORE_WAIT = os.environ.get("NBDDP_STORE_WAIT", "1").strip().lower() not in ("0", "false", "no", "off")
NBDDP_WAITS = [0]  # barriers this rank has passed; every rank counts the same ones
NBDDP_BARRIER_KEY = "nbddp/barrier/{}/{}"  # (barrier number, rank): that rank has reached it
NBDDP_ALONE = [False]  # rank 0 after training's end (group.nbddp_rest_on_rank0): no one to wait for
NBDDP_FAILED_KEY = "nbddp/failed"  # "rank|error" of the first rank that failed
NBDDP_GONE_KEY = "nbddp/failed/gone"  # "host|pid": that rank has said all it had to say (its traceback) and is leaving
NBDDP_GONE_WAIT = 30  # seconds a stopping rank waits for it at most (a rank killed without Python's exit says nothing)


def nbddp_store():
    """The process group's store, or None (no group, or a torch without it)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    try:
        return torch.distributed.distributed_c10d._get_default_store()
    except Exception:
        return None


def nbddp_say_failed(failure):
    """This rank failed: say so in the store, where the ranks waiting for it (on any machine) look."""
    store = nbddp_store()
    try:
        if store is not None and not store.check([NBDDP_FAILED_KEY]):
            store.set(NBDDP_FAILED_KEY, f"{torch.distributed.get_rank()}|{type(failure).__name__}: {failure}"[:400])
            atexit.register(_nbddp_say_gone, store)
    except Exception:  # the store's host is gone: nobody is left to tell
        pass


def _nbddp_say_gone(store):
    """At this failed rank's exit, once its traceback is out: the ranks it stopped may leave now. Leaving first, they
    would be the launcher's "first observed failure" and the report would blame a rank that only stopped."""
    try:
        store.set(NBDDP_GONE_KEY, f"{os.uname().nodename}|{os.getpid()}")
    except Exception:
        pass


def _nbddp_gone(store):
    """The failed rank said it leaves, and its process is gone where it ran here (its launcher saw it end first)."""
    try:
        host, pid = store.get(NBDDP_GONE_KEY).decode().split("|") if store.check([NBDDP_GONE_KEY]) else ("", "")
        if not pid or host != os.uname().nodename:
            return bool(pid)
        os.kill(int(pid), 0)
        return False
    except Exception:  # the store went with the failed rank, or its process is gone
        return True


def _nbddp_stop_if_failed(store):
    """Another rank failed (nbddp_say_failed): this one stops too, saying which and why. A launcher stops the
    ranks of its own machine when one fails, but not those of the other machines, which would wait forever."""
    if store is not None and store.check([NBDDP_FAILED_KEY]):
        rank, what = store.get(NBDDP_FAILED_KEY).decode().split("|", 1)
        if int(rank) != torch.distributed.get_rank():
            print(f"nbddp: rank {rank} failed ({what}); rank {torch.distributed.get_rank()} stops too (rank {rank}'s "
                  "output says more, on its machine)", file=sys.stderr, flush=True)
            deadline = time.monotonic() + NBDDP_GONE_WAIT
            while not _nbddp_gone(store) and time.monotonic() < deadline:  # its launcher usually stops this rank first
                time.sleep(0.1)
            raise SystemExit(1)


def nbddp_wait_until(ready, waiting_for):
    """Poll `ready()` in growing steps (1 ms to 0.5 s), stopping where another rank failed (checked from the first
    0.5 s step on); after NBDDP_WAIT_NOTICE seconds, print once the line that `waiting_for()` gives (None: say
    nothing)."""
    start, step, said, store = time.monotonic(), 0.001, False, nbddp_store()
    while not ready():
        if step >= 0.5:
            _nbddp_stop_if_failed(store)
        if not said and time.monotonic() - start >= NBDDP_WAIT_NOTICE:
            said, line = True, waiting_for()
            if line:
                print(f"nbddp: rank {torch.distributed.get_rank()} waiting for {line}", file=sys.stderr, flush=True)
        time.sleep(step)
        step = min(step * 2, 0.5)


def nbddp_store_barrier(what=None):
    """Every rank gets here, however long rank 0's work (`what`) takes; the lowest rank that waits says so once.
    False (the caller uses the group's own barrier) without a store or with NBDDP_STORE_WAIT=0. Rank 0 alone (after
    training's end) passes at once."""
    if NBDDP_ALONE[0]:
        return True
    store = nbddp_store()
    if store is None or not NBDDP_STORE_WAIT:
        return False
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    NBDDP_WAITS[0] += 1
    keys = [NBDDP_BARRIER_KEY.format(NBDDP_WAITS[0], r) for r in range(world)]
    store.set(keys[rank], "1")

    def waiting_for():
        absent = [r for r in range(world) if not store.check([keys[r]])]
        if not absent or rank != min(set(range(world)) - set(absent)):
            return None
        if absent == [0]:
            return "rank 0: " + (what or "rank 0's work")
        return f"rank{'s' if len(absent) > 1 else ''} {', '.join(map(str, absent))}" + (f" ({what})" if what else "")

    nbddp_wait_until(lambda: store.check(keys), waiting_for)
    return True
