"""Part of the rank-guards step: the notebook's own training callbacks. Their hooks run on every rank (the trainer
calls them there, and what they decide, `control.should_training_stop`, must agree), so they stay; but a line in a
hook that only calls a library training's own objects do not come from (a webhook's `requests.post(...)`, a chat
message, a notification) is an effect, and runs on rank 0 alone, without a wait (it runs every logging step).
"""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import DESCEND, TAKE, code_of, regroup, statement_blocks
from ..entries import is_entry, library_of, parts
from ..rank_conditions import is_rank_test

CALLBACKS = frozenset({"transformers.TrainerCallback", "lightning.Callback", "pytorch_lightning.Callback"})
ONCE = "once"


def is_callback(node: cst.ClassDef, names) -> bool:
    """A class of the notebook's derived from a trainer's callback class (through its bases' meanings)."""
    return any(is_entry(m, CALLBACKS) for base in node.bases for m in names.meanings(base.value))


def _effect(stmt, names, libraries, packages) -> str | None:
    """The callee's name of a line that only calls a function of a library the notebook imports (`packages`) and
    training does not come from (`libraries`)."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    call = small.value if isinstance(small, cst.Expr) else None
    if not isinstance(call, cst.Call):
        return None
    meanings = names.meanings(call.func)
    called = {library_of(m) for m in meanings}
    if not called <= packages or called & libraries:
        return None
    return parts(code_of(call.func))[-1]


def callback(guards, node: cst.ClassDef, libraries, packages) -> cst.ClassDef:
    """The callback with each hook's effects under `if NBDDP_IS_MAIN:`."""
    def effects_in(stmt) -> bool:
        return _effect(stmt, guards.names, libraries, packages) is not None or any(
            effects_in(s) for block in statement_blocks(stmt) for s in block.body)

    def select(stmt, nested):
        what = _effect(stmt, guards.names, libraries, packages)
        if is_rank_test(stmt, guards.names):  # already per rank (converting converted code)
            return guards.select(stmt, nested)
        if what is None:
            return DESCEND if statement_blocks(stmt) and effects_in(stmt) else guards.select(stmt, nested)
        guards.taken[id(stmt.body)] = (frozenset({ONCE}), what)
        guards.reasons.setdefault(guards.cell, []).append(f"{what}() in the callback's {node.name.value} hooks")
        return TAKE

    body = []
    for stmt in node.body.body:
        if isinstance(stmt, cst.FunctionDef):
            stmt = stmt.with_changes(body=stmt.body.with_changes(body=regroup(stmt.body.body, select, guards.wrap,
                                                                                True, guards.names.origin)))
        body.append(stmt)
    return node.with_changes(body=node.body.with_changes(body=body))
