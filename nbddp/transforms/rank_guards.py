"""Step: saving, pushing, generation, display and GPU-memory prints run on global rank 0 only.

Each run of such statements becomes `if NBDDP_IS_MAIN: ...` followed by `nbddp_barrier()`, so that the other ranks
wait, and a later load of the saved files works everywhere. Values those statements produce exist on rank 0
only, so later statements that read them (across cells) are guarded too. Code in def bodies and `if False:`
blocks is left alone, and code already under a rank test gets no second guard.
"""
from __future__ import annotations

import libcst as cst

from ..cst import (DESCEND, LEAVE, TAKE, call_stmt, callee_owner, callee_tail, dotted, is_if_false, is_rank_test,
                   live_calls, parse, regroup, statement_blocks)
from .base import Transform, cell_number
from .dataflow import header_of, reads_writes

SAVE_PREFIXES = ("save_pretrained", "push_to_hub", "save_lora", "save_model")
MAIN_ONLY = frozenset({"generate", "fast_generate", "for_inference", "TextStreamer", "print_trainable_parameters"})
HANDED_OVER = frozenset({"generate", "fast_generate"})  # Thread(target=model.generate), partial(model.generate, ...)
GENERATION_TASKS = frozenset({"text-generation", "text2text-generation", "image-text-to-text", "summarization",
                              "translation", "automatic-speech-recognition", "text-to-audio", "text-to-speech"})
DISPLAY_MODULE = "IPython.display"  # Audio, Image, Markdown… from here only display; datasets.Audio is data
CUDA_MEMORY = frozenset({
    "max_memory_reserved", "max_memory_allocated", "memory_reserved", "memory_allocated",
    "get_device_properties", "memory_summary", "mem_get_info",
})
COLLECTIVE = frozenset({"train", "evaluate", "predict", "barrier", "all_reduce", "broadcast", "gather",
                        "from_pretrained", "get_peft_model", "nbddp_barrier", "load_dataset", "map", "filter"})


def is_collective(call: cst.Call) -> bool:
    """Work every rank must do together: guarding it on rank 0 would hang or desynchronise the job."""
    tail = callee_tail(call) or ""
    return tail in COLLECTIVE or tail.endswith("Trainer")


class _DisplayNames(cst.CSTVisitor):
    """Names bound by `from IPython.display import …` / `import IPython.display as ipd`."""

    def __init__(self, names: set[str], modules: set[str]):
        self.names, self.modules = names, modules

    def visit_ImportFrom(self, node):
        if dotted(node.module) == DISPLAY_MODULE and not isinstance(node.names, cst.ImportStar):
            self.names.update((a.asname.name.value if a.asname else a.name.value) for a in node.names)

    def visit_Import(self, node):
        for alias in node.names:
            if dotted(alias.name) == DISPLAY_MODULE:
                self.modules.add(alias.asname.name.value if alias.asname else DISPLAY_MODULE)


def _is_print(stmt) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, cst.Call) and callee_tail(stmt.body[0].value) == "print"
            and isinstance(stmt.body[0].value.func, cst.Name))


class RankGuards(Transform):
    name = "rank-guards"

    def preprocess(self, nb, ctx):
        self.tainted: set[str] = set()  # names bound on rank 0 only, so far in the notebook
        self.display_names = {"display"}  # Jupyter's built-in display(), plus IPython.display imports
        self.display_modules: set[str] = set()
        self.helpers: set[str] = set()
        self.helpers = self._generating_helpers(nb)
        return super().preprocess(nb, ctx)

    def _generating_helpers(self, nb) -> set[str]:
        """Functions the notebook defines whose bodies save, push or generate and do no collective work: a call to
        one at top level is rank-0 work too (found to a fixed point, so helpers of helpers count)."""
        bodies = {}

        class _Defs(cst.CSTVisitor):
            def visit_FunctionDef(self, node):
                calls = []

                class _Calls(cst.CSTVisitor):
                    def visit_Call(self, call):
                        calls.append(call)

                node.body.visit(_Calls())
                bodies[node.name.value] = calls
                return False

        for cell in nb.cells:
            parse(cell.source, cell=cell_number(cell), step=self.name).visit(_Defs())
        found: set[str] = set()
        while True:
            self.helpers = found
            more = {name for name, calls in bodies.items() if name not in found
                    and any(self.main_only_reason(c) for c in calls) and not any(is_collective(c) for c in calls)}
            if not more:
                return found
            found = found | more

    def main_only_reason(self, call: cst.Call) -> str | None:
        tail = callee_tail(call) or ""
        if tail.startswith(SAVE_PREFIXES) or tail in MAIN_ONLY or tail.endswith("Streamer"):
            return tail
        if isinstance(call.func, cst.Name) and tail in self.helpers:
            return f"{tail}(), which generates or saves"
        for arg in call.args:  # generation handed over rather than called: Thread(target=model.generate)
            if isinstance(arg.value, cst.Attribute) and arg.value.attr.value in HANDED_OVER:
                return f"{tail}({dotted(arg.value) or arg.value.attr.value})"
        if tail == "pipeline":
            task = next((a.value for a in call.args if a.keyword is None or a.keyword.value == "task"), None)
            if isinstance(task, cst.SimpleString) and task.evaluated_value in GENERATION_TASKS:
                return f"pipeline({task.evaluated_value!r})"
        if tail in CUDA_MEMORY and callee_owner(call) == "cuda":
            return "GPU memory stats"
        func = call.func
        if isinstance(func, cst.Name) and tail in self.display_names:
            return tail
        if isinstance(func, cst.Attribute) and dotted(func.value) in self.display_modules:
            return tail
        return None

    def preprocess_cell(self, cell, ctx):
        module = parse(cell.source, cell=cell_number(cell), step=self.name)
        module.visit(_DisplayNames(self.display_names, self.display_modules))
        main_only_reason = self.main_only_reason
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
                if not why and any(is_collective(c) for c in calls):
                    ctx.report.warn(cell_number(cell), f"uses {', '.join(sorted(header_reads & self.tainted))}, which "
                                    "only rank 0 computed, in work every rank must do; left unguarded: check it")
                    self.tainted -= writes
                    return LEAVE
                used.update(header_reads & self.tainted)
                why.append("uses")
            if not blocks and _is_print(stmt) and ctx.options.main_prints and not {callee_tail(c) for c in calls} \
                    & COLLECTIVE:
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
