"""Step: dataset loading and mapping run main-process-first; unseeded splits and shuffles get a fixed seed.

Rank 0 of each node fills the datasets cache, then the other ranks read it instead of all writing it at once.
A split or shuffle without a seed would differ between ranks, so every rank would train on other data. What is
dataset work is nbddp.vocabulary's DATA: `load_dataset`, a dataset's `.map`/`.filter`, `train_test_split`; the
builtins `map(...)`/`filter(...)` are not; a call of the notebook's own function that only prepares data
(`dataset = get_questions()`, nbddp.effects' prepares_data) is too.
"""
from __future__ import annotations

import libcst as cst

from ..cells import starts_cell
from ..cst_helpers import (DESCEND, LEAVE, TAKE, add_keyword, code_of, dotted, is_if_false, keyword, live_calls,
                           regroup, statement_blocks)
from ..entries import MAIN_FIRST, SEED_KEYWORDS
from ..entry_match import Table
from ..vocabulary import COLLECTIVE, DATA, SEEDED, known, matches, parts
from .base import CallRewriter, TreeStep, call_kinds

FIRST = "nbddp_main_process_first"
ORDERED = Table(MAIN_FIRST)
SEEDS = {name: Table([e for e in entries if "()" not in e], [e for e in entries if "()" in e])  # functions, methods
         for name, entries in SEED_KEYWORDS.items()}


def wraps_first(stmt) -> bool:
    """nbddp's own `with nbddp_main_process_first():`."""
    return isinstance(stmt, cst.With) and any(
        isinstance(item.item, cst.Call) and dotted(item.item.func) == FIRST for item in stmt.items)


def _is_ordered_with(stmt, names) -> bool:
    """`with accelerator.main_process_first():` (nbddp's own, or a library's: nbddp.entries.MAIN_FIRST)."""
    return wraps_first(stmt) or isinstance(stmt, cst.With) and any(
        isinstance(item.item, cst.Call) and any(ORDERED.match(m, known(m, names.packages))
                                                for m in names.meanings(item.item.func)) for item in stmt.items)


def _sets_up_what_training_reads(tree, stmt) -> bool:
    """A top-level statement every rank runs as set-up of a library whose calls make values training reads, not one
    of training's own (nbddp.needs: `nltk.download(...)` before `rows = [nltk.word_tokenize(t) ...]`)."""
    libraries = tree.plan.setup.get(id(tree.names.orig(stmt)))
    return bool(libraries) and not set(libraries) <= tree.plan.libraries


def _seed_keyword(names, call):
    """The keyword that seeds this split or shuffle (nbddp.entries.SEED_KEYWORDS), else None."""
    for meaning in names.meanings(call.func):
        for name, table in SEEDS.items():
            if matches(table, meaning, names.packages):
                return name
    return None


class _Seeds(CallRewriter):
    def leave_Call(self, original, updated):
        name = _seed_keyword(self.names, original)
        shuffle = parts(code_of(updated.func))[-1] == "shuffle"  # `shuffle(x)` given a generator or a buffer size
        if name is None or (shuffle and any(a.keyword is None for a in updated.args)):
            return updated
        if keyword(updated, name) is not None or any(a.star == "**" for a in updated.args):
            return updated
        tail = parts(code_of(updated.func))[-1]
        self.report.change(self.cell, f"{tail}() had no seed: {name}={self.options.seed} so every rank gets the same data")
        return add_keyword(updated, name, cst.Integer(str(self.options.seed)))


class DataPrep(TreeStep):
    name = "data-prep"
    inserts = (FIRST,)

    def run(self, tree, ctx):
        module = tree.visit(_Seeds(tree, ctx), frozenset({SEEDED}))
        effects = tree.effects
        wrapped: dict = {}
        cell = [None]

        def kinds(call):
            """The call's own kinds; DATA for a function of the notebook's that only prepares data."""
            own = call_kinds(tree.names, call)
            return own | {DATA} if DATA not in own and effects.prepares_data(call) else own

        def select(stmt, nested):
            cell[0] = starts_cell(stmt) or cell[0]
            tree.at = stmt
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or is_if_false(stmt) or \
                    _is_ordered_with(stmt, tree.names):
                return LEAVE
            if not nested and ctx.options.whole and _sets_up_what_training_reads(tree, stmt):
                return TAKE  # a download or a registry another library's later calls read: reported by the plan
            found = [kinds(c) for c in live_calls(stmt)]
            if not any(DATA in k for k in found):
                return LEAVE
            if not statement_blocks(stmt) and any(COLLECTIVE in k and DATA not in k for k in found):
                return LEAVE  # e.g. SFTTrainer(train_dataset=ds.map(f)): all ranks must build/train together
            return DESCEND if statement_blocks(stmt) else TAKE

        def wrap(group, nested):
            data = [stmt for stmt in group if nested or not _sets_up_what_training_reads(tree, stmt)]
            if data:
                wrapped[cell[0]] = wrapped.get(cell[0], 0) + len(data)
            with_item = cst.WithItem(cst.Call(cst.Name(FIRST)))
            block = cst.With(items=[with_item], body=cst.IndentedBlock(body=group))
            tree.names.origin[block] = tree.names.orig(group[0])  # where the plan placed what it holds
            return [block]

        module = module.with_changes(body=regroup(module.body, select, wrap, origin=tree.names.origin))
        for number, count in wrapped.items():
            ctx.report.change(number, f"dataset loading/mapping ({count} statement(s)) runs main-process-first")
        return module
