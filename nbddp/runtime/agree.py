"""Ranks agree, checked: after each Trainer.train() and at the end of the script, every rank sends the store a
checksum of the weights it trained (per tensor, a float64 sum and sum of absolute values) and rank 0 says in one line
that they agree, or warns, naming the ranks that differ. Under DDP they agree to the last bit; they differ when a
model was trained outside DDP (a loop of the notebook's own on each rank) or on data or seeds that differ by rank.

Trained weights are those of the model a Trainer trained and the parameters of every optimizer that stepped (a
global hook of torch's optimizers). The end-of-script check looks at optimizers that stepped since the last check,
so rank-0-only work after train() (inference, a merged save) is not mistaken for divergence."""
import functools
import json
import math
import weakref

import torch
import torch.distributed
from torch.optim.optimizer import register_optimizer_step_post_hook

from .group import NBDDP_AT_TEARDOWN, NBDDP_IS_MAIN, NBDDP_WORLD_SIZE
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


def nbddp_ranks_that_differ(stats, rtol=1e-6):
    """The ranks whose per-tensor stats differ from rank 0's (beyond rounding: rtol of the tensors' |x| sums)."""
    def close(a, b, scale):
        return a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= rtol * scale

    def same(mine, first):
        return len(mine) == len(first) and all(
            close(m[0], f[0], m[1] + f[1]) and close(m[1], f[1], m[1] + f[1]) for m, f in zip(mine, first))

    return [rank for rank in range(1, len(stats)) if not same(stats[rank], stats[0])]


def nbddp_check_agreement(params, when):
    """Every rank calls it at the same point; rank 0 says whether the ranks hold the same `params`."""
    store = nbddp_store()
    if store is None or not NBDDP_CHECK_AGREEMENT:
        return None
    unique = list(dict.fromkeys(p for p in params if p is not None and p.requires_grad))  # tensors hash by identity
    _NBDDP_TRAINED["checks"] += 1
    _NBDDP_TRAINED["stepped"].clear()
    key, world = f"nbddp/agree/{_NBDDP_TRAINED['checks']}", torch.distributed.get_world_size()
    try:  # a check must not fail the training it follows: a rank that cannot read its weights says why instead
        mine = nbddp_weight_stats(unique)
    except Exception as exc:
        mine = f"rank {torch.distributed.get_rank()}: {type(exc).__name__}: {exc}"
    store.set(f"{key}/{torch.distributed.get_rank()}", json.dumps(mine))
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
        nbddp_say(key, f"warning: after {when}, {ranks} other weights than rank 0 ({size}). Usual causes: "
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
            nbddp_check_agreement(list(self.model.parameters()), "train()")
            return result

        checked_train._nbddp_checked = True
        module.Trainer.train = checked_train


def _nbddp_watch_training():
    if NBDDP_CHECK_AGREEMENT:
        register_optimizer_step_post_hook(_nbddp_stepped)
        NBDDP_AT_TEARDOWN.append(_nbddp_check_at_teardown)
    NBDDP_IMPORTS.watch("transformers.trainer", _nbddp_patch_trainer_train)


_nbddp_watch_training()
