"""What rank 0 made and every rank needs. Values: a statement training needs that generates, or reads the clock, a
uuid or the OS's entropy, runs on rank 0, and every rank gets the values it bound (nbddp_share_values); a value
training reads that every rank made with a library nbddp has no entries for (a run name, an id) is rank 0's on every
rank where it is plain and small (nbddp_same_values). Files: a notebook that builds or downloads a model, saves
it and loads it back (`save_pretrained("./base")`, then `from_pretrained("./base")`) saves it on rank 0 once; where a
machine of the job does not see rank 0's working folder (no shared storage: group._nbddp_check_shared_folder), the
saved files go to that machine's first rank over the process group, in chunks, after the others have waited for
rank 0's save. On one machine, or where every machine shares rank 0's storage, it does nothing."""
import os
import pickle
import re

import torch
import torch.distributed

from .agree import _nbddp_plain
from .group import (NBDDP_CHECKED, NBDDP_CHECKED_KEY, NBDDP_IS_LOCAL_MAIN, NBDDP_IS_MAIN, NBDDP_LOCAL_RANK,
                    NBDDP_OWN_STORAGE, NBDDP_OWN_STORAGE_KEY, NBDDP_RANK, NBDDP_WORLD_SIZE, nbddp_barrier, nbddp_dist)
from .hooks import nbddp_say
from .wait import nbddp_store, nbddp_wait_until

NBDDP_CHUNK = 64 * 2 ** 20  # bytes per broadcast


def _nbddp_some_machine_lacks_storage():
    """Whether a machine of this job does not see rank 0's working folder: each machine's first rank checked when
    the group started, and every rank counted itself in the store after its machine's check."""
    store = nbddp_store()
    if store is None or not NBDDP_CHECKED[0]:  # a group the notebook started itself: nothing was checked
        return False
    nbddp_wait_until(lambda: int(store.add(NBDDP_CHECKED_KEY, 0)) >= NBDDP_WORLD_SIZE, lambda: "the machines' checks")
    return int(store.add(NBDDP_OWN_STORAGE_KEY, 0)) > 0


def _nbddp_files_under(paths):
    """(path, size) of every file at or below these paths, as rank 0 sees them."""
    found = []
    for path in paths:
        if os.path.isfile(path):
            found.append((path, os.path.getsize(path)))
        for where, _, names in os.walk(path):
            found += [(os.path.join(where, n), os.path.getsize(os.path.join(where, n))) for n in sorted(names)]
    return found


def nbddp_share_files(*paths):
    """Every rank calls it after rank 0 saved `paths` (files or folders) and the others waited: the first rank of
    each machine without rank 0's storage writes the same files at the same paths, and every rank goes on once all
    copies are written."""
    if not (nbddp_dist() and _nbddp_some_machine_lacks_storage()):
        return
    manifest = [_nbddp_files_under(paths) if NBDDP_IS_MAIN else None]
    torch.distributed.broadcast_object_list(manifest, src=0)
    nccl = torch.distributed.get_backend() == "nccl"
    device = torch.device("cuda", NBDDP_LOCAL_RANK) if nccl else torch.device("cpu")
    receives = NBDDP_IS_LOCAL_MAIN and NBDDP_OWN_STORAGE[0]
    for path, size in manifest[0]:
        source = open(path, "rb") if NBDDP_IS_MAIN else None  # noqa: SIM115
        if receives:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        target = open(f"{path}.nbddp-part", "wb") if receives else None  # noqa: SIM115
        for offset in range(0, size, NBDDP_CHUNK):
            count = min(NBDDP_CHUNK, size - offset)
            chunk = (torch.frombuffer(bytearray(source.read(count)), dtype=torch.uint8).to(device) if source
                     else torch.empty(count, dtype=torch.uint8, device=device))
            torch.distributed.broadcast(chunk, src=0)
            if target:
                target.write(chunk.cpu().numpy().tobytes())
        for fh in (source, target):
            if fh:
                fh.close()
        if target:
            os.replace(f"{path}.nbddp-part", path)
    nbddp_barrier("the copies of what rank 0 saved")  # every copy whole before any rank loads it


def nbddp_share_values(namespace, *names):
    """Every rank calls it after rank 0 ran a statement for every rank and the others waited: rank 0's values of
    `names` in `namespace` (the notebook's globals), given to every rank (pickled over the process group). A value
    that cannot be pickled (a tracker's live run, a thread) stays rank 0's alone, and rank 0 says so."""
    if not nbddp_dist():
        return
    sent = [None]
    if NBDDP_IS_MAIN:
        sent[0], unsent = {}, []
        for name in (name for name in names if name in namespace):
            try:  # (read back here too: a tracker's config pickles, but reading it back recurses)
                sent[0][name] = pickle.dumps(namespace[name])
                pickle.loads(sent[0][name])
            except Exception:  # pickling fails in many ways (TypeError, PicklingError, AttributeError, RecursionError)
                sent[0].pop(name, None)
                unsent.append(f"{name} (a {type(namespace[name]).__name__})")
        if unsent:
            nbddp_say(f"unsent {unsent}", f"rank 0's {', '.join(unsent)} cannot be sent to the other ranks: they have "
                                          "none; make it on every rank if they need it")
    torch.distributed.broadcast_object_list(sent, src=0)
    namespace.update({name: pickle.loads(blob) for name, blob in sent[0].items()})


def nbddp_same_values(namespace, *names):
    """Every rank calls it after a line every rank ran whose values of `names` a library made that nbddp has no
    entries for (`run = namer.slug()`): rank 0's, where plain (strings, floats, containers of plain values) and under
    1 MiB pickled, replace each rank's own, so that what training reads is the same on every rank. An int or a flag
    stays each rank's (it may be the rank, or this rank's device, read through that library), and so do a string that
    is rank 0's with this rank's number in place of its 0 (`cuda:1`, `data-1.json`) and a path that exists on rank
    0's machine and not on this rank's."""
    if not nbddp_dist():
        return
    sent = [None]
    if NBDDP_IS_MAIN:
        plain = {name: namespace[name] for name in names if name in namespace and _nbddp_plain(namespace[name])
                 and type(namespace[name]) not in (int, bool)}
        paths = {name for name, value in plain.items() if isinstance(value, str) and os.path.exists(value)}
        sent = [(plain, paths) if len(pickle.dumps(plain)) < 2 ** 20 else ({}, set())]
    torch.distributed.broadcast_object_list(sent, src=0)
    plain, paths = sent[0]
    namespace.update({name: value for name, value in plain.items() if (name not in paths or os.path.exists(value))
                      and not _nbddp_spells_rank(namespace.get(name), value)})


def _nbddp_spells_rank(own, first):
    """`own` is rank 0's string `first` with this rank's number where rank 0's has its 0 (`cuda:1` for `cuda:0`,
    `data-1-of-2.json` for `data-0-of-2.json`): a string made from the rank, each rank's own."""
    if not (isinstance(own, str) and isinstance(first, str)) or own == first:
        return False
    mine, theirs = re.split(r"(\d+)", own), re.split(r"(\d+)", first)  # digit runs at the odd places
    ranks = {str(NBDDP_RANK), str(NBDDP_LOCAL_RANK)}
    return len(mine) == len(theirs) and all(a == b or (i % 2 and b == "0" and a in ranks)
                                            for i, (a, b) in enumerate(zip(mine, theirs)))
