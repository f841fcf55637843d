"""Part of the rank-guards step: the notebook's own training callbacks and Lightning modules. Their methods run on
every rank (the trainer calls them there, and what they decide, `control.should_training_stop`, must agree), so they
stay; but a line in them that only calls a library none of training's, Python's own or a computing one's (a
webhook's `requests.post(...)`, a chat message, a notification: nbddp.needs' plan, `nested_once`) is an effect, and
runs on rank 0 alone, without a wait (it runs every logging step). In a logging handler of the notebook's, also
on the rank whose own test (`if dist.get_rank() == 1:`) logs the record: `if NBDDP_IS_MAIN or nbddp_in_rank_block():`.
"""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import TAKE, code_of, regroup
from ..entries import parts
from ..inside import is_handler_class
from ..training_end import IN_RANK_BLOCK

ONCE = "once"


def callback(guards, node: cst.ClassDef) -> cst.ClassDef:
    """The callback with each hook's effects under `if NBDDP_IS_MAIN:` (the lines nbddp.needs' plan found)."""
    handler = is_handler_class(node, guards.names)

    def select(stmt, nested):  # the rank guards' own, but for the effects' wording
        if not (isinstance(stmt, cst.SimpleStatementLine) and id(stmt) in guards.nested_once):
            return guards.select(stmt, nested)
        what = parts(code_of(stmt.body[0].value.func))[-1]
        guards.taken[id(stmt.body)] = (frozenset({ONCE}), what)
        guards.reasons.setdefault(guards.cell, []).append(
            f"{what}() in the {'logging handler' if handler else 'callback'}'s {node.name.value} hooks")
        return TAKE

    def wrap(group, nested):  # a handler's: the records the notebook's own rank test logs, sent by that rank too
        out = guards.wrap(group, nested)
        test = cst.BooleanOperation(out[0].test, cst.Or(), cst.Call(cst.Name(IN_RANK_BLOCK)))
        return [out[0].with_changes(test=test), *out[1:]]

    body = []
    for stmt in node.body.body:
        if isinstance(stmt, cst.FunctionDef):
            stmt = stmt.with_changes(body=stmt.body.with_changes(body=regroup(
                stmt.body.body, select, wrap if handler else guards.wrap, True, guards.names.origin)))
        body.append(stmt)
    return node.with_changes(body=node.body.with_changes(body=body))
