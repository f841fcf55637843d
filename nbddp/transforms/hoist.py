"""Part of the rank-guards step: a collective inside what prints, displays, logs or saves runs on every rank first.

`print(trainer.evaluate())`, `print(f"{trainer.evaluate()}")`, `display(trainer.predict(ds).metrics)`,
`wandb.log(trainer.evaluate())`, `trainer.predict(ds).to_json(path)`: the collective is bound to a temporary on every rank (`nbddp_evaluate =
trainer.evaluate()`), and the statement that shows it reads the temporary, so the rank-guards step can put it on
rank 0 alone. Inside lambdas and comprehensions nothing moves (the collective may read their variables).
"""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import code_of, is_if_false
from ..rank_conditions import is_rank_test
from ..tree import TreeTransformer
from ..vocabulary import DISPLAY, PRINT, PUSH, SAVE, TRACK, parts

SHOWS = frozenset({PRINT, DISPLAY, TRACK, SAVE, PUSH})
SCOPES = (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


class _Extract(cst.CSTTransformer):
    def __init__(self, effects):
        super().__init__()
        self.effects, self.found = effects, []

    def on_visit(self, node):
        if isinstance(node, SCOPES):
            return False
        if isinstance(node, cst.Call) and self.effects.collective(node):
            return False  # the outermost collective moves whole
        return super().on_visit(node)

    def leave_Call(self, original, updated):
        if not self.effects.collective(original):
            return updated
        base = f"nbddp_{parts(code_of(original.func))[-1]}"
        taken = {name for name, _ in self.found}
        name = base if base not in taken else f"{base}_{len(taken) + 1}"
        self.found.append((name, updated))
        return cst.Name(name)


class _Hoist(TreeTransformer):
    def __init__(self, tree, ctx, effects):
        super().__init__(tree, ctx)
        self.effects, self.hoisted = effects, set()
        self.shows = SHOWS if ctx.options.main_prints else SHOWS - {PRINT}
        end = tree.plan.end if ctx.options.whole else None  # after training's end rank 0 runs alone: nothing to move
        self.after = {id(stmt) for stmt in tree.first.body[end + 1:]} if end is not None else set()

    def on_visit(self, node):
        if isinstance(node, cst.BaseStatement) and id(self.names.orig(node)) in self.after:
            return False
        return super().on_visit(node)

    def visit_FunctionDef(self, node):
        return self.effects.mixed(node, self.options.main_prints)

    def visit_If(self, node):
        return not (is_if_false(node) or is_rank_test(node, self.names))

    def leave_SimpleStatementLine(self, original, updated):
        if id(self.names.orig(original)) in self.after or len(updated.body) != 1 or not isinstance(updated.body[0], cst.Expr) or \
                not isinstance(updated.body[0].value, cst.Call):
            return updated
        call = updated.body[0].value
        if not self.effects.of_call(call) & self.shows or self.effects.collective(call):
            return updated
        extract = _Extract(self.effects)
        func = call.func  # `trainer.predict(ds).to_json(path)`: the collective is the receiver
        if isinstance(func, cst.Attribute):
            func = func.with_changes(value=func.value.visit(extract))
        args = [arg.visit(extract) for arg in call.args]
        if not extract.found:
            return updated
        shown = ", ".join(code_of(c.func) for _, c in extract.found)
        self.report.change(self.cell, f"{shown}(...) runs on every rank, what shows its result on rank 0 only")
        assigns = [cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], value)])
                   for name, value in extract.found]
        assigns[0] = assigns[0].with_changes(leading_lines=updated.leading_lines)
        shown_stmt = updated.with_changes(leading_lines=(), body=[updated.body[0].with_changes(
            value=call.with_changes(func=func, args=args))])
        self.hoisted.add(id(shown_stmt.body))
        for stmt in assigns + [shown_stmt]:  # each is the statement the analysis read
            self.names.origin[stmt] = self.names.orig(original)
        return cst.FlattenSentinel(assigns + [shown_stmt])


def hoist(tree, ctx, effects, hoisted: set) -> cst.Module:
    """The tree with collectives moved out of what shows them; `hoisted` gets the ids of the showing statements'
    bodies (a loop holding one is looked into by the rank-guards step)."""
    rewrite = _Hoist(tree, ctx, effects)
    module = tree.visit(rewrite, SHOWS)
    hoisted |= rewrite.hoisted
    return module
