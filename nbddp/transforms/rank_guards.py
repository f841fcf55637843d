"""Step: saving, pushing, generation, display and GPU-memory prints run on global rank 0 only.

Each run of such statements becomes `if NBDDP_IS_MAIN: ...` followed by `nbddp_barrier()`, so that the other ranks
wait, and a later load of the saved files works everywhere. Values those statements produce exist on rank 0
only, so later statements that read them (across cells) are guarded too. Code in def bodies and `if False:`
blocks is left alone, and code already under a rank test gets no second guard.
"""
from __future__ import annotations

import libcst as cst

from ..cst import (DESCEND, LEAVE, TAKE, call_stmt, callee_owner, callee_tail, is_if_false, is_rank_test,
                   live_calls, regroup, statement_blocks)
from .base import Transform, cell_number
from .dataflow import header_of, reads_writes
from ..cst import parse

SAVE_PREFIXES = ("save_pretrained", "push_to_hub", "save_lora", "save_model")
MAIN_ONLY = frozenset({"generate", "fast_generate", "for_inference", "TextStreamer", "display", "Audio"})
CUDA_MEMORY = frozenset({
    "max_memory_reserved", "max_memory_allocated", "memory_reserved", "memory_allocated",
    "get_device_properties", "memory_summary", "mem_get_info",
})
COLLECTIVE = frozenset({"train", "evaluate", "predict", "barrier", "all_reduce", "broadcast", "gather",
                        "from_pretrained", "get_peft_model", "nbddp_barrier"})


def main_only_reason(call: cst.Call) -> str | None:
    tail = callee_tail(call) or ""
    if tail.startswith(SAVE_PREFIXES):
        return tail
    if tail in MAIN_ONLY:
        return tail
    if tail in CUDA_MEMORY and callee_owner(call) == "cuda":
        return "GPU memory stats"
    return None


def _is_print(stmt) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, cst.Call) and callee_tail(stmt.body[0].value) == "print"
            and isinstance(stmt.body[0].value.func, cst.Name))


class RankGuards(Transform):
    name = "rank-guards"

    def preprocess(self, nb, ctx):
        self.tainted: set[str] = set()  # names bound on rank 0 only, so far in the notebook
        return super().preprocess(nb, ctx)

    def preprocess_cell(self, cell, ctx):
        module = parse(cell.source, cell=cell_number(cell), step=self.name)
        reasons: list[str] = []
        used: set[str] = set()

        def select(stmt):
            reads, writes = reads_writes(stmt)
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or is_if_false(stmt):
                self.tainted -= writes
                return LEAVE
            if is_rank_test(stmt):
                self.tainted |= writes
                return LEAVE
            calls = live_calls(stmt)
            blocks = statement_blocks(stmt)
            header_calls = [c for h in header_of(stmt) for c in live_calls(h)]
            header_reads = set().union(*(reads_writes(h)[0] for h in header_of(stmt))) if blocks else reads
            why = [r for r in map(main_only_reason, header_calls if blocks else calls) if r]
            if header_reads & self.tainted:
                used.update(header_reads & self.tainted)
                why.append("uses")
            if not blocks and _is_print(stmt) and not {callee_tail(c) for c in calls} & COLLECTIVE:
                why.append("print")
            if why:
                reasons.extend(why)
                self.tainted |= writes
                return TAKE
            if blocks and (any(main_only_reason(c) for c in calls) or reads & self.tainted):
                return DESCEND
            self.tainted -= writes
            return LEAVE

        def wrap(group):
            guard = cst.If(test=cst.Name("NBDDP_IS_MAIN"), body=cst.IndentedBlock(body=group))
            return [guard, call_stmt("nbddp_barrier")]

        new = module.with_changes(body=regroup(module.body, select, wrap))
        if reasons:
            shown = ", ".join(dict.fromkeys(r for r in reasons if r != "uses"))
            text = "rank 0 only" + (f": {shown}" if shown else "")
            if used:
                text += f"; also what reads {', '.join(sorted(used))} (exists on rank 0 only)"
            ctx.report.change(cell_number(cell), text + "; the other ranks wait at a barrier")
            cell.source = new.code
        return cell
