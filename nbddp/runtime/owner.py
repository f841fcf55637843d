"""A rank of a converted script started from a notebook kernel or a shell (`%%torchrun`, `nbddp run`) leaves when that
process is gone, whatever its launcher does: a killed kernel's torchrun is told to stop its ranks, but one that is
itself stuck or gone would leave them running with nobody to read them. NBDDP_OWNER holds the process id (the
executor sets it); a rank checks it every NBDDP_OWNER_POLL seconds and, once it is gone, sends itself SIGTERM (and
leaves 5 s later if a handler of the notebook kept it)."""
import os
import signal
import threading
import time

from .group import NBDDP_AT_START

NBDDP_OWNER_POLL = 1.0


def nbddp_owner_alive(pid):
    """The process runs (one that has exited but is not reaped yet does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):  # gone, or no /proc (macOS)
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _nbddp_leave_without_owner(pid):
    while nbddp_owner_alive(pid):
        time.sleep(NBDDP_OWNER_POLL)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    os._exit(128 + signal.SIGTERM)


def nbddp_watch_owner():
    owner = os.environ.get("NBDDP_OWNER", "")
    if owner.isdigit() and int(owner) != os.getpid():
        threading.Thread(target=_nbddp_leave_without_owner, args=(int(owner),), name="nbddp-owner",
                         daemon=True).start()


NBDDP_AT_START.append(nbddp_watch_owner)
