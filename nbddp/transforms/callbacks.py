"""Part of the rank-guards step: the notebook's own training callbacks and Lightning modules. Their methods run on
every rank (the trainer calls them there, and what they decide, `control.should_training_stop`, must agree), so they
stay; but a line in them that only calls a library none of training's, Python's own or a computing one's (a
webhook's `requests.post(...)`, a chat message, a notification: nbddp.needs' plan, `nested_once`) is an effect, and
runs on rank 0 alone, without a wait (it runs every logging step).
"""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import TAKE, code_of, regroup
from ..entries import parts

ONCE = "once"


def callback(guards, node: cst.ClassDef) -> cst.ClassDef:
    """The callback with each hook's effects under `if NBDDP_IS_MAIN:` (the lines nbddp.needs' plan found)."""
    def select(stmt, nested):  # the rank guards' own, but for the effects' wording
        if not (isinstance(stmt, cst.SimpleStatementLine) and id(stmt) in guards.nested_once):
            return guards.select(stmt, nested)
        what = parts(code_of(stmt.body[0].value.func))[-1]
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
