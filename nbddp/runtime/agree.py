"""Ranks agree, checked: after each Trainer.train() and at the end of the script, every rank sends the store a
checksum of the weights it trained (per tensor, a float64 sum and sum of absolute values) and rank 0 says in one line
that they agree, or warns, naming the ranks that differ. Under DDP they agree to the last bit; they differ when a
model was trained outside DDP (a loop of the notebook's own on each rank) or on data or seeds that differ by rank;
then it also names the notebook's own values (numbers, strings and their containers) that differ from rank 0's.

Trained weights are those of the model a Trainer trained and the parameters of every optimizer that stepped (a
global hook of torch's optimizers). The end-of-script check looks at optimizers that stepped since the last check,
so rank-0-only work after train() (inference, a merged save) is not mistaken for divergence."""
import functools
import hashlib
import json
import math
import sys
import weakref

import torch
import torch.distributed
from torch.optim.optimizer import register_optimizer_step_post_hook

from .group import NBDDP_AT_TEARDOWN, NBDDP_IS_MAIN, NBDDP_RANK, NBDDP_WORLD_SIZE
from .hooks import NBDDP_IMPORTS, _nbddp_choice, nbddp_say
from .wait import nbddp_store, nbddp_store_barrier

NBDDP_CHECK_AGREEMENT = NBDDP_WORLD_SIZE > 1 and _nbddp_choice("NBDDP_CHECK_AGREEMENT") is not False
_NBDDP_TRAINED = {"params": {}, "stepped": set(), "checks": 0}  # optimizer id -> its parameters (weak references)


def nbddp_weight_stats(params):
    """Per tensor [float64 sum, float64 sum of |x|], in chunks (no float64 copy of a large weight)."""
    stats = []
    for param in params:
        flat, total = param.detach().reshape(-1), [0.0, 0.0]
        for chunk in flat.split(1 << 24):
            pair = torch.stack([chunk.sum(dtype=torch.float64), chunk.abs().sum(dtype=torch.float64)]).tolist()
            total = [total[0] + pair[0], total[1] + pair[1]]
        stats.append(total)
    return stats


def _nbddp_close(mine, first, rtol):
    """One tensor's [sum, sum of |x|] on two ranks, the same beyond rounding (rtol of their |x| sums)."""
    scale = mine[1] + first[1]
    return all(a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= rtol * scale
               for a, b in zip(mine, first))


def nbddp_tensors_that_differ(mine, first, rtol=1e-6):
    """The indices of the tensors whose stats differ between a rank's and rank 0's (all of them where the ranks hold
    different numbers of tensors)."""
    if len(mine) != len(first):
        return list(range(max(len(mine), len(first))))
    return [i for i, (m, f) in enumerate(zip(mine, first)) if not _nbddp_close(m, f, rtol)]


def nbddp_ranks_that_differ(stats, rtol=1e-6):
    """The ranks whose per-tensor stats differ from rank 0's."""
    return [rank for rank in range(1, len(stats)) if nbddp_tensors_that_differ(stats[rank], stats[0], rtol)]


def nbddp_what_differs(stats, names, rank, shown=3):
    """Which values rank `rank` holds otherwise than rank 0: the first tensors by name, each with both ranks' sums."""
    differ = nbddp_tensors_that_differ(stats[rank], stats[0])
    if len(stats[rank]) != len(stats[0]):
        return f"rank {rank} trained {len(stats[rank])} tensors, rank 0 {len(stats[0])}"
    said = [f"{names[i]} (sum {stats[rank][i][0]:.6g} against {stats[0][i][0]:.6g})" for i in differ[:shown]]
    more = f" and {len(differ) - shown} more of {len(names)}" if len(differ) > shown else f" of {len(names)}"
    return f"on rank {rank}: {', '.join(said)}{more} tensors"


def _nbddp_plain(value, depth=0) -> bool:
    """A number, a string, or a container of them not too big to compare."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return True
    if depth >= 3 or not isinstance(value, (tuple, list, set, frozenset, dict)) or len(value) > 10_000:
        return False
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    return all(_nbddp_plain(item, depth + 1) for item in items)


def nbddp_notebook_values():
    """{name: digest} of the notebook's plain values (`__main__`'s, not nbddp's); "rank" for an int equal to this
    process's rank (each rank's own number differs on purpose)."""
    found = {}
    for name, value in list(vars(sys.modules["__main__"]).items()):
        if not name.startswith(("_", "nbddp_", "NBDDP_")) and _nbddp_plain(value):
            text = repr(sorted(map(repr, value))) if isinstance(value, (set, frozenset)) else repr(value)
            found[name] = "rank" if type(value) is int and value == NBDDP_RANK else \
                hashlib.sha1(text.encode(errors="replace")).hexdigest()[:16]
    return found


def _nbddp_values_that_differ(store, key, rank, shown=5):
    mine, first = (json.loads(store.get(f"{key}/{r}/values")) for r in (rank, 0))
    names = sorted(name for name in mine.keys() & first.keys() if mine[name] != first[name])
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"; the notebook's values that differ on rank {rank}: {', '.join(names[:shown])}{more}" if names else ""


def nbddp_check_agreement(params, when):
    """Every rank calls it at the same point; rank 0 says whether the ranks hold the same `params` ((name, tensor)
    pairs, or tensors: then named by their place and shape), and where they differ, which ones."""
    store = nbddp_store()
    if store is None or not NBDDP_CHECK_AGREEMENT:
        return None
    named, seen = [], set()
    for name, param in (item if isinstance(item, tuple) else (None, item) for item in params):
        if param is not None and param.requires_grad and id(param) not in seen:  # a tied weight counts once
            seen.add(id(param))
            named.append((name, param))
    unique = [p for _, p in named]
    names = [name or f"tensor {i} of shape {tuple(p.shape)}" for i, (name, p) in enumerate(named)]
    _NBDDP_TRAINED["checks"] += 1
    _NBDDP_TRAINED["stepped"].clear()
    key, world = f"nbddp/agree/{_NBDDP_TRAINED['checks']}", torch.distributed.get_world_size()
    try:  # a check must not fail the training it follows: a rank that cannot read its weights says why instead
        mine = nbddp_weight_stats(unique)
    except Exception as exc:
        mine = f"rank {torch.distributed.get_rank()}: {type(exc).__name__}: {exc}"
    store.set(f"{key}/{torch.distributed.get_rank()}", json.dumps(mine))
    store.set(f"{key}/{torch.distributed.get_rank()}/values", json.dumps(nbddp_notebook_values()))
    nbddp_store_barrier("the check that the ranks agree")
    if not NBDDP_IS_MAIN:
        return None
    stats = [json.loads(store.get(f"{key}/{rank}")) for rank in range(world)]
    unread = [got for got in stats if isinstance(got, str)]
    if unread:
        return nbddp_say(key, f"warning: after {when}, the ranks' weights were not compared ({unread[0]})")
    if not any(stats):
        return []
    differ = nbddp_ranks_that_differ(stats)
    size = f"{sum(p.numel() for p in unique):,} trained values in {len(unique)} tensors"
    if differ:
        ranks = f"ranks {', '.join(map(str, differ))} hold" if len(differ) > 1 else f"rank {differ[0]} holds"
        which = "; ".join(nbddp_what_differs(stats, names, rank) + _nbddp_values_that_differ(store, key, rank)
                          for rank in differ[:2])
        nbddp_say(key, f"warning: after {when}, {ranks} other weights than rank 0 ({size}): {which}. Usual causes: "
                       "training outside DDP or the Trainer (a loop of the notebook's own on each rank), or data or "
                       "seeds that differ by rank. Rank 0's copy is the one saved (NBDDP_CHECK_AGREEMENT=0: no check)")
    else:
        nbddp_say(key, f"ranks agree after {when}: all {world} hold the same weights ({size})")
    return differ


def _nbddp_stepped(optimizer, args, kwargs):
    _NBDDP_TRAINED["stepped"].add(id(optimizer))
    if not getattr(optimizer, "_nbddp_seen", False):
        optimizer._nbddp_seen = True
        _NBDDP_TRAINED["params"][id(optimizer)] = [weakref.ref(p) for g in optimizer.param_groups for p in g["params"]]


def _nbddp_check_at_teardown():
    """Optimizers that stepped since the last check, on any rank (every rank exchanges, so the waits match)."""
    if NBDDP_CHECK_AGREEMENT:
        trained = _NBDDP_TRAINED["params"]
        params = [ref() for key, refs in trained.items() if key in _NBDDP_TRAINED["stepped"] for ref in refs]
        nbddp_check_agreement(params, "the script's own training steps")


def _nbddp_patch_trainer_train(module):
    train = module.Trainer.train
    if NBDDP_CHECK_AGREEMENT and not getattr(train, "_nbddp_checked", False):
        @functools.wraps(train)
        def checked_train(self, *args, **kwargs):
            result = train(self, *args, **kwargs)
            nbddp_check_agreement(list(self.model.named_parameters()), "train()")
            return result

        checked_train._nbddp_checked = True
        module.Trainer.train = checked_train


def _nbddp_watch_training():
    if NBDDP_CHECK_AGREEMENT:
        register_optimizer_step_post_hook(_nbddp_stepped)
        NBDDP_AT_TEARDOWN.append(_nbddp_check_at_teardown)
    NBDDP_IMPORTS.watch("transformers.trainer", _nbddp_patch_trainer_train)


_nbddp_watch_training()
