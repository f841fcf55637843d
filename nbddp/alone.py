"""Of the notebook's top-level statements, those that only act outside the process, by what they read and change:

    acts_alone(body, scan, names) -> {id: paths} of the statements that bind and change none of the notebook's
                                     values, set nothing up, read no rank, do no work of every rank (train, load, a
                                     collective, data work) and call something: a web hook, a download, a folder
                                     made, a file moved, a program started; paths: the literal paths their calls are
                                     given (not a URL), which a machine without rank 0's storage gets a copy of

The plan (nbddp.needs) runs such a statement once wherever it can say what training needs (before training's end it
is a statement training does not need). Where it cannot, nothing training could need comes of it either: in a
notebook with no training the analysis can see, and in a `%ddp` session's cells as they come (later cells unknown),
rank 0 runs these alone and the other ranks wait for it (nbddp.transforms.whole).
"""
from __future__ import annotations

from urllib.parse import urlsplit

import libcst as cst

from .cst_helpers import is_if_false
from .rank_conditions import is_rank_test
from .runtime import HELPERS
from .vocabulary import (BACKWARD, COLLECTIVE, CONFIG, DATA, LOAD, MAIN_ONLY, OWN_DDP, PEFT, SEEDED, STEP, SYNC,
                         TRAINS)

EVERY_RANK = frozenset({SYNC, TRAINS, COLLECTIVE, LOAD, PEFT, DATA, BACKWARD, STEP, CONFIG, OWN_DDP, SEEDED})
# (and the vocabulary's own rank-0 work, a save or a print: the rank guards take it by its kind, as everywhere)


def _nbddps(call) -> bool:
    """A line of nbddp's own (`nbddp_shell(...)` for a `!` line, its history, its barriers): placed by its step."""
    return isinstance(call.func, cst.Name) and call.func.value in HELPERS


def acts_alone(body, scan, names) -> dict:
    found = {}
    for stmt in body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or is_if_false(stmt) or is_rank_test(stmt, names):
            continue
        _, changes, seed, _ = scan.facts(stmt)
        calls = scan.seen(stmt).calls
        if seed or any(not c.startswith("file:") for c in changes) or not calls or \
                scan.kinds(stmt) & (EVERY_RANK | MAIN_ONLY) or any(_nbddps(call) for call in calls):
            continue
        paths = {c[5:] for c in changes | scan.seen(stmt).loads if c.startswith("file:")}
        found[id(stmt)] = sorted(p for p in paths if len(urlsplit(p).scheme) < 2)  # (`C:` is a drive)
    return found
