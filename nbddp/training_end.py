"""Where training ends: of the notebook's top-level statements, the last one every rank must run together. After it,
rank 0 runs the rest of the notebook alone (nbddp_rest_on_rank0, the runtime's line, written by the rank guards).

    training_end(body, kinds, names) -> (index of the last such statement or None, the notebook has the line already)

The last statement that trains or talks to every rank (nbddp.vocabulary's TRAINS: a trainer's work, a backward pass
or an optimizer step, torch.distributed's or accelerate's collectives, through the notebook's own functions); a
model loaded after it only to try it out does not count (with no training at all, the last model load ends it); and
a later statement that reads the rank or the world size (the notebook's own per-rank logic: `if rank == 1: ...`,
accelerate's `process_index`) moves the end to it, so it runs on every rank as written.
"""
from __future__ import annotations

import libcst as cst

from .cst_helpers import is_if_false
from .vocabulary import SYNC, TRAINS

REST = "nbddp_rest_on_rank0"  # the runtime's line where training ends (nbddp/runtime/group.py)


IN_RANK_BLOCK = "nbddp_in_rank_block"  # a logging handler's guard: `if NBDDP_IS_MAIN or nbddp_in_rank_block():`


def is_own_test(test) -> bool:
    """`NBDDP_IS_MAIN`, or a logging handler's `NBDDP_IS_MAIN or nbddp_in_rank_block()`: nbddp's own tests."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
        return is_own_test(test.left) and isinstance(test.right, cst.Call) and \
            isinstance(test.right.func, cst.Name) and test.right.func.value == IN_RANK_BLOCK
    return isinstance(test, cst.Name) and test.value == "NBDDP_IS_MAIN"


def is_own_guard(stmt) -> bool:
    """nbddp's own guard of rank-0 work (converting converted code)."""
    return isinstance(stmt, cst.If) and is_own_test(stmt.test)


def is_rest(stmt) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and isinstance(s.value.func, cst.Name)
        and s.value.func.value == REST for s in stmt.body)


def training_end(body, kinds, reads_rank):
    """(index, marked); `kinds(stmt)`: what a statement's calls do (nbddp.vocabulary's kinds); `reads_rank(stmt)`:
    what it reads of the job's shape (nbddp.rank_conditions)."""
    trains = loads = None
    for i, stmt in enumerate(body):
        if is_rest(stmt):
            return i, True
        if is_if_false(stmt):
            continue
        found = kinds(stmt)
        if TRAINS in found:
            trains = i
        elif SYNC in found:
            loads = i
    end = trains if trains is not None else loads
    if end is None:
        return None, False
    for i in range(len(body) - 1, end, -1):
        if not is_if_false(body[i]) and not isinstance(body[i], (cst.FunctionDef, cst.ClassDef)) and \
                reads_rank(body[i]):
            return i, False
    return end, False
