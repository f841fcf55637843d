"""Of the notebook's top-level statements, those that only call another library for their effect:

    acts_alone(body, scan, names) -> {id: paths} of the lines that nbddp.inside's `effect_only` finds (they call a
                                     library none of training's, Python's own or a computing one's, a web hook, a
                                     notifier, an upload, a download through urllib; drop the values; change, bind,
                                     set up and read nothing of the notebook's or the rank), and that ask nothing
                                     (a prompt or a login: nbddp.vocabulary.prompt) and are handed no function of the
                                     notebook's (the library may run it);
                                     paths: the literal paths their calls are given (not a URL), which a machine
                                     without rank 0's storage gets a copy of

The plan (nbddp.needs) runs such a line once wherever it can say what training needs (before training's end it is
a statement training does not need). Where it cannot, nothing training could need comes of it either: in a notebook
with no training the analysis can see, and in a `%ddp` session's cells as they come (later cells unknown), rank 0
runs these alone and the other ranks wait for it (nbddp.transforms.whole). A program started counts as such a call
(nbddp.entries.STARTS_PROGRAMS; not an install). Python's other own calls (a folder made, an exit, a sleep) stay on
every rank there, as the notebook's process would run them.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import libcst as cst

from .changes import SHOWS
from .inside import effect_only
from .vocabulary import MAIN_ONLY, prompt


def _shows_a_call(stmt) -> bool:
    """A cell's last line, which the script shows (`nbddp_show(...)`), counts where what it shows is a call
    (`nbddp_show(f(x))`, not `nbddp_show([f(x) for x in xs])`): the same line, converted once or twice."""
    values = [small.value for small in stmt.body if isinstance(small, cst.Expr)]
    return all(isinstance(v.args[0].value, cst.Call) for v in values if isinstance(v, cst.Call)
               and isinstance(v.func, cst.Name) and v.func.value in SHOWS and v.args)


def _handed(call, names) -> bool:
    """The call is given a function or class of the notebook's (or a lambda), which the library may run: what that
    does (train, on every rank) is the call's too."""
    return any(isinstance(arg.value, cst.Lambda) or names.definitions(arg.value) for arg in call.args)


def acts_alone(body, scan, names) -> dict:
    found = {}
    for stmt in body:
        if not isinstance(stmt, cst.SimpleStatementLine) or not effect_only(stmt, scan) or not _shows_a_call(stmt) or \
                scan.kinds(stmt) & MAIN_ONLY:  # (the vocabulary's rank-0 work: the rank guards take it by its kind)
            continue
        calls = scan.seen(stmt).calls
        if any(prompt(names.meanings(call.func), False, scan.packages) or _handed(call, names) for call in calls):
            continue
        paths = {c[5:] for c in scan.facts(stmt)[1] | scan.seen(stmt).loads if c.startswith("file:")}
        found[id(stmt)] = sorted(p for p in paths if len(urlsplit(p).scheme) < 2)  # (`C:` is a drive)
    return found
