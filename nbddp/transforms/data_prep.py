"""Step: dataset loading and mapping run main-process-first; unseeded splits and shuffles get a fixed seed.

Rank 0 of each node fills the datasets cache, then the other ranks read it instead of all writing it at once.
A split or shuffle without a seed would differ between ranks, so every rank would train on other data.
"""
from __future__ import annotations

import libcst as cst

from ..cst import DESCEND, LEAVE, TAKE, add_keyword, callee_owner, callee_tail, is_if_false, keyword, live_calls, regroup, statement_blocks
from .base import CallRewriter, CstTransform

DATA_CALLS = frozenset({"load_dataset", "load_from_disk", "map", "filter", "train_test_split"})
FIRST = "nbddp_main_process_first"
# Work every rank does at the same time (collectives inside): never inside a main-process-first block.
TOGETHER = frozenset({"train", "evaluate", "predict", "from_pretrained", "get_peft_model", "barrier", "nbddp_barrier"})
ALREADY_ORDERED = frozenset({FIRST, "main_process_first", "local_main_process_first"})


def _is_ordered_with(stmt) -> bool:
    return isinstance(stmt, cst.With) and any(
        isinstance(item.item, cst.Call) and callee_tail(item.item) in ALREADY_ORDERED for item in stmt.items
    )


class _Seeds(CallRewriter):
    def leave_Call(self, original, updated):
        tail = callee_tail(updated)
        is_method = callee_owner(updated) is not None or isinstance(updated.func, cst.Attribute)
        if tail == "train_test_split":
            name = "seed" if is_method else "random_state"
        elif tail == "shuffle" and is_method and not any(a.keyword is None for a in updated.args):
            name = "seed"
        else:
            return updated
        if keyword(updated, name) is not None or any(a.star == "**" for a in updated.args):
            return updated
        self.report.change(self.cell, f"{tail}() had no seed: {name}={self.options.seed} so every rank gets the same data")
        return add_keyword(updated, name, cst.Integer(str(self.options.seed)))


class DataPrep(CstTransform):
    name = "data-prep"
    triggers = tuple(DATA_CALLS) + ("shuffle",)

    def rewrite(self, module, cell_no, ctx):
        module = module.visit(_Seeds(cell_no, ctx))
        wrapped = []

        def select(stmt):
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or is_if_false(stmt) or _is_ordered_with(stmt):
                return LEAVE
            tails = {callee_tail(c) or "" for c in live_calls(stmt)}
            if not tails & DATA_CALLS:
                return LEAVE
            if not statement_blocks(stmt) and any(t in TOGETHER or t.endswith("Trainer") for t in tails):
                return LEAVE  # e.g. SFTTrainer(train_dataset=ds.map(f)): all ranks must build/train together
            return DESCEND if statement_blocks(stmt) else TAKE

        def wrap(group):
            wrapped.append(len(group))
            with_item = cst.WithItem(cst.Call(cst.Name(FIRST)))
            return [cst.With(items=[with_item], body=cst.IndentedBlock(body=group))]

        module = module.with_changes(body=regroup(module.body, select, wrap))
        if wrapped:
            ctx.report.change(cell_no, f"dataset loading/mapping ({sum(wrapped)} statement(s)) runs main-process-first")
        return module
