"""Rank facts from torchrun's environment, this rank's device, the process group, and how the job starts.

The group's collectives (training) wait NBDDP_GROUP_TIMEOUT seconds for a late rank: 1800, the Trainer's own
ddp_timeout default (torch's NCCL default is 600 s); waits for rank-0 work go through the store. On several machines
the ranks of the first (group rank 0, whose launcher hosts torchrun's store under a static rendezvous) leave a second
after the others: each launcher meets the others at an exit barrier in that store, and one that comes last there
while the store's host has already left fails with a traceback after a job that went well."""
import atexit
import contextlib
import datetime
import functools
import importlib.util
import logging
import os
import sys
import time

import torch
import torch.distributed

from .launcher import NBDDP_LAUNCHED, nbddp_nproc, nbddp_say_missing, nbddp_self_launch
from .wait import (NBDDP_ALONE, NBDDP_BARRIER_KEY, NBDDP_WAITS, nbddp_say_failed, nbddp_store, nbddp_store_barrier,
                   nbddp_wait_until)

NBDDP_RANK = int(os.environ.get("RANK", "0"))
NBDDP_LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
NBDDP_WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
NBDDP_IS_MAIN = NBDDP_RANK == 0  # saving, pushing, generation and prints: once per job
NBDDP_IS_LOCAL_MAIN = NBDDP_LOCAL_RANK == 0  # files and caches: once per machine
NBDDP_DEVICE = f"cuda:{NBDDP_LOCAL_RANK}" if torch.cuda.is_available() else "cpu"
NBDDP_OWN_STORAGE = [False]  # this machine does not see rank 0's working folder (_nbddp_check_shared_folder)
NBDDP_CHECKED = [False]  # this rank ran that check (the process group was started by nbddp)
NBDDP_CHECKED_KEY, NBDDP_OWN_STORAGE_KEY = "nbddp/ranks-checked", "nbddp/machines-own-storage"  # counts
NBDDP_MODE = "ddp"  # "split": one process, the model over every GPU; "shard": its layers over the ranks (nbddp_fit)
NBDDP_GROUP_TIMEOUT = float(os.environ.get("NBDDP_GROUP_TIMEOUT", "1800"))
NBDDP_AT_START = []  # set-up every rank runs as the script starts (nbddp_start), in this order
NBDDP_SKIPPED = set()  # what this rank left to rank 0 (saves, files written as its own copy), said once at the end
NBDDP_AT_TEARDOWN = []  # checks every rank runs at the end of a script that did not fail, in this order
NBDDP_RANK_BLOCK = [0]  # > 0 in the body of the notebook's own test of the rank: its writes as written (one_writer)
NBDDP_DESTROY = [torch.distributed.destroy_process_group]  # torch's, not the notebook's (nbddp_keep_the_group)
NBDDP_REST_KEY = "nbddp/rest"  # how rank 0 ended the rest of the notebook: "ok" or "stopped"
nbddp_no_context = contextlib.nullcontext  # on the other ranks, for a rank-0-only context (a tracker's run)


def _nbddp_process_started():
    """When this process started, on the wall clock, from /proc (Linux); where that cannot be read, now."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            return time.time() - float(uptime.read().split()[0]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


NBDDP_STARTED = _nbddp_process_started()


def nbddp_start(mode="ddp", group=True, batch=None):
    """Start the job: as one plain process on several GPUs, start the DDP processes; then make plain "cuda" mean
    this rank's GPU, say how the job runs, and start the process group, so that the notebook's first line can use
    it (`group=False` where the notebook imports Unsloth: unsloth_group starts it right after that import).
    `batch`: the script's default for NBDDP_BATCH (global_batch.py)."""
    global NBDDP_MODE
    if batch:
        os.environ.setdefault("NBDDP_BATCH", batch)
    NBDDP_MODE, nproc = mode, nbddp_nproc()
    launched = any(name in os.environ for name in NBDDP_LAUNCHED)
    if mode in ("ddp", "shard") and nproc > 1 and not launched:
        nbddp_self_launch(nproc, mode)
    if nproc == 0 and not launched and NBDDP_WORLD_SIZE == 1:  # no GPU, no count asked for: say what runs instead
        print("nbddp: no GPU visible: one process on the CPU (NBDDP_NPROC=2 runs 2 processes with gloo; on Kaggle or "
              "Colab, turn the GPU accelerator on)", flush=True)
    if torch.cuda.is_available():
        torch.cuda.set_device(NBDDP_LOCAL_RANK)
    elif NBDDP_WORLD_SIZE > 1:
        # Without it, Hugging Face's Trainer on a machine without GPUs ignores torchrun: every rank trains alone.
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    if NBDDP_IS_MAIN and NBDDP_WORLD_SIZE > 1:
        print(f"nbddp: {NBDDP_WORLD_SIZE} processes, this one is rank 0 on {NBDDP_DEVICE}", flush=True)
    nbddp_quiet_others()
    # the notebook's spawned processes run what they are given, as from a kernel: not the script again, with its RANK
    sys.modules["__main__"].__spec__ = importlib.util.spec_from_loader("__main__", None)
    for setup in NBDDP_AT_START:
        setup()
    if group:
        nbddp_dist()


def nbddp_quiet_others():
    """On ranks other than 0, what goes to stdout, progress bars (tqdm's, and every library's built on it) and logging
    below WARNING stay quiet: rank 0 shows them once (warnings, errors and nbddp's own notes go to stderr).
    NBDDP_ALL_RANKS=1 (`--all-ranks`) leaves every rank's."""
    if NBDDP_IS_MAIN or os.environ.get("NBDDP_ALL_RANKS", "0").strip().lower() not in ("0", "", "false", "no", "off"):
        return
    os.environ.setdefault("TQDM_DISABLE", "1")  # tqdm imported later, and child processes
    if importlib.util.find_spec("tqdm") is not None:  # torch has imported it already: its defaults are read
        import tqdm.std

        init = tqdm.std.tqdm.__init__

        def quiet_init(self, *args, **kwargs):
            init(self, *args, **{**kwargs, "disable": True})

        tqdm.std.tqdm.__init__ = functools.update_wrapper(quiet_init, init)
    logging.disable(logging.INFO)
    sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - for the life of the process


def nbddp_skipped(name, key=None):
    """What this rank left to rank 0: noted in the store for rank 0's end line, then, with `key`, a wait until rank 0
    has made the same call (or reached its next barrier without it)."""
    store = nbddp_store()
    if store is None:
        return
    if name not in NBDDP_SKIPPED:
        NBDDP_SKIPPED.add(name)
        store.set(f"nbddp/skip/{store.add('nbddp/skips', 1)}", f"{NBDDP_RANK} {name}")
    passed = NBDDP_WAITS[0]
    if key is not None:
        nbddp_wait_until(lambda: store.check([key]) or store.check([NBDDP_BARRIER_KEY.format(passed + 1, 0)]),
                         lambda: f"rank 0: {name}")


def nbddp_device_map(split="balanced"):
    """The whole model on this rank's own device; in split mode, `split` (the notebook's own placement)."""
    return split if NBDDP_MODE == "split" else {"": NBDDP_DEVICE}


def nbddp_dist():
    """True when running distributed; starts the process group if it is not up yet (nbddp_start starts it)."""
    if NBDDP_WORLD_SIZE == 1 or not torch.distributed.is_available():
        return False
    if not torch.distributed.is_initialized():
        cuda = torch.cuda.is_available()
        torch.distributed.init_process_group("nccl" if cuda else "gloo",
                                             device_id=torch.device(NBDDP_DEVICE) if cuda else None,
                                             timeout=datetime.timedelta(seconds=NBDDP_GROUP_TIMEOUT))
        _nbddp_check_shared_folder()
    return True


def nbddp_keep_the_group():
    """The notebook's own `init_process_group(...)` (code written for several processes) finds the job's group up
    and keeps it, saying so once; its `destroy_process_group()` of that group waits for the script's end, where the
    job's last barriers still need it."""
    c10d = torch.distributed.distributed_c10d
    init, destroy = c10d.init_process_group, c10d.destroy_process_group
    if NBDDP_WORLD_SIZE == 1 or getattr(init, "_nbddp_kept", False):
        return

    @functools.wraps(init)
    def init_process_group(backend=None, *args, **kwargs):
        if not torch.distributed.is_initialized():
            return init(backend, *args, **kwargs)
        if NBDDP_IS_MAIN:
            ours = torch.distributed.get_backend()
            asked = "" if backend in (None, "", ours) else \
                f"; it asks for {backend}, which this job's group does not use"
            print(f"nbddp: the notebook's init_process_group: the job's process group ({ours}) is up, kept{asked}",
                  flush=True)

    @functools.wraps(destroy)
    def destroy_process_group(group=None):
        if group is not None and group is not c10d.GroupMember.WORLD:
            destroy(group)

    init_process_group._nbddp_kept = True
    NBDDP_DESTROY[0] = destroy
    c10d.init_process_group = torch.distributed.init_process_group = init_process_group
    c10d.destroy_process_group = torch.distributed.destroy_process_group = destroy_process_group


NBDDP_AT_START.append(nbddp_keep_the_group)


def _nbddp_check_shared_folder():
    """Several machines: rank 0 leaves a marker in its working folder, and each other machine's first rank looks
    for it in its own; where it is missing (no shared storage), that rank says what runs where. Every rank then
    counts itself in the store (share.py waits for the whole count)."""
    store = nbddp_store()
    if store is None:
        return
    several = NBDDP_WORLD_SIZE > int(os.environ.get("LOCAL_WORLD_SIZE", NBDDP_WORLD_SIZE))  # machines
    if NBDDP_IS_MAIN and several:
        marker = os.path.abspath(f".nbddp-shared-{os.getpid()}")
        try:
            open(marker, "w").close()  # noqa: SIM115
            atexit.register(lambda: os.path.exists(marker) and os.remove(marker))
        except OSError:  # a folder rank 0 cannot write to: nothing to tell
            marker = ""
        store.set("nbddp/shared-marker", os.path.basename(marker))
    elif NBDDP_IS_LOCAL_MAIN and several:
        nbddp_wait_until(lambda: store.check(["nbddp/shared-marker"]), lambda: "rank 0's start")
        marker = store.get("nbddp/shared-marker").decode()
        if marker and not os.path.exists(marker):
            NBDDP_OWN_STORAGE[0] = True
            store.add(NBDDP_OWN_STORAGE_KEY, 1)
            print(f"nbddp: rank {NBDDP_RANK}'s machine does not see rank 0's working folder (no shared storage): saves "
                  "and what runs once per job are on rank 0's machine only (what every rank loads after rank 0 saved "
                  "it is copied here); `!` commands, %%writefile, data preparation and files every rank writes run on "
                  "each machine", file=sys.stderr, flush=True)
    store.add(NBDDP_CHECKED_KEY, 1)
    NBDDP_CHECKED[0] = True


def nbddp_collective_barrier():
    """A barrier of the process group itself (bounded by its timeout)."""
    nccl = torch.distributed.get_backend() == "nccl"
    torch.distributed.barrier(device_ids=[NBDDP_LOCAL_RANK] if nccl else None)


def nbddp_barrier(what=None):
    """Wait until every rank gets here, however long the rank-0 work named by `what` takes (wait.py)."""
    if nbddp_dist() and not nbddp_store_barrier(what):
        nbddp_collective_barrier()


class NbddpRest(SystemExit):
    """Raised on the ranks other than 0 where training ends: they leave the notebook, wait in nbddp_teardown, and end
    with status 0."""


def nbddp_rest_on_rank0():
    """Training ends here: rank 0 runs the rest of the notebook alone (it waits for no one at nbddp's barriers), the
    other ranks go to the script's end, wait there for rank 0 however long it takes, and end with it."""
    if NBDDP_WORLD_SIZE > 1 and nbddp_dist():
        if not NBDDP_IS_MAIN:
            raise NbddpRest(0)
        NBDDP_ALONE[0] = True


def _nbddp_rest_ended(ok):
    """At the end: how the rest went on rank 0 ("ok", or stopped by an error or exit), told to the ranks waiting for
    it; True where the end-of-script checks run."""
    store = nbddp_store()
    if store is None:
        return ok
    if NBDDP_ALONE[0]:  # rank 0 after the rest
        NBDDP_ALONE[0] = False
        store.set(NBDDP_REST_KEY, "ok" if ok else "stopped")
        if not ok:  # the others read the outcome before rank 0's store goes
            deadline = time.monotonic() + 60
            nbddp_wait_until(lambda: int(store.add(f"{NBDDP_REST_KEY}/read", 0)) >= NBDDP_WORLD_SIZE - 1
                             or time.monotonic() > deadline, lambda: None)
        return ok
    nbddp_wait_until(lambda: store.check([NBDDP_REST_KEY]), lambda: "rank 0: the rest of the notebook")
    ok = store.get(NBDDP_REST_KEY).decode() == "ok"
    store.add(f"{NBDDP_REST_KEY}/read", 1)
    return ok


def _nbddp_all_started():
    """A rank that leaves early (an exit or error in the notebook's first lines) first waits, 60 s at most, until every
    rank has started the group: gloo's start fails on a rank whose peer has already left."""
    store, deadline = nbddp_store(), time.monotonic() + 60
    try:
        while (store is not None and NBDDP_CHECKED[0] and int(store.add(NBDDP_CHECKED_KEY, 0)) < NBDDP_WORLD_SIZE
               and time.monotonic() < deadline):
            time.sleep(0.01)
    except Exception:  # the store's host is gone: nobody is left starting
        pass


def nbddp_teardown():
    """Run the end-of-script checks, wait for every rank, then close the process group; a rank that failed skips
    the checks and the wait. The last, collective barrier keeps a store that rank 0 hosts up until every rank has
    left it. After training's end the other ranks wait here for rank 0 (nbddp_rest_on_rank0)."""
    if isinstance(sys.exc_info()[1], ModuleNotFoundError):
        nbddp_say_missing(sys.exc_info()[1])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        failure = sys.exc_info()[1]
        ok = failure is None or isinstance(failure, NbddpRest)
        if NBDDP_ALONE[0] or isinstance(failure, NbddpRest):
            ok = _nbddp_rest_ended(ok)
        elif not ok:
            nbddp_say_failed(failure)
            _nbddp_all_started()
        if ok:
            for check in NBDDP_AT_TEARDOWN:
                check()
            nbddp_barrier("the end of the script")
            nbddp_collective_barrier()
        NBDDP_DESTROY[0]()
        if os.environ.get("GROUP_RANK") == "0" and NBDDP_WORLD_SIZE > int(os.environ.get("LOCAL_WORLD_SIZE", 1)):
            time.sleep(1)  # the launcher that hosts torchrun's store comes last to its exit barrier (see the top)
