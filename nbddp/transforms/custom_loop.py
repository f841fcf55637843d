"""Step: a training loop of the notebook's own (a backward pass and an optimizer's step, no Trainer) trains one model
on every rank.

A training loop is a `for`/`while` whose body, through the notebook's functions too, does nbddp.vocabulary's
BACKWARD and STEP (nbddp.effects). Before the outermost such loop (not one that makes its model anew each pass, as a
search over settings does: the loop inside it, after the model is made), `nbddp_ddp(model)` routes the model's training
forward through DDP; the model is the one whose `.parameters()` the stepped optimizer was built from, followed
through the notebook's assignments (nbddp.meanings) and, for a loop inside the notebook's own function whose optimizer
is a parameter, through the calls of that function (made anywhere, also in another of the notebook's functions,
whose own parameter is then followed in turn). The data the innermost loop around the backward iterates
becomes `nbddp_distributed(...)`, each rank's share of a DataLoader. Where the model cannot be told, the script
stops before the loop (`nbddp_unsynced_loop`) rather than train one copy per rank. A notebook that distributes its
training itself (accelerate, torch's DDP or FSDP, Lightning's Fabric) is left alone.
"""
from __future__ import annotations

import libcst as cst

from ..cells import starts_cell
from ..cst_helpers import call_stmt, code_of, dotted, live_calls, name_nodes
from ..origins import same_statements
from ..rank_conditions import is_rank_test
from ..reads_writes import reads_writes
from ..vocabulary import BACKWARD, OWN_DDP, STEP, parts
from ..walk import walk
from .base import TreeStep, TreeTransformer

WRAP, DEAL, STOP = "nbddp_ddp", "nbddp_distributed", "nbddp_unsynced_loop"
PARAMETERS = frozenset({"parameters", "named_parameters"})
PASS_THROUGH = frozenset({"enumerate", "tqdm", "iter", "trange"})  # wrap what they iterate
FOLLOW = 3  # assignments followed from an optimizer to the parameters it was built from


class _Rewrite(TreeTransformer):
    def __init__(self, tree, ctx):
        super().__init__(tree, ctx)
        self.effects = tree.effects
        self.functions: list[cst.FunctionDef] = []
        self.holds: dict = {}  # a function -> whether it holds a training loop (_holds_loop)
        self.converts: dict = {}  # a loop -> whether it is the training loop to convert (_converts)

    def _trains(self, node) -> bool:
        """A loop that trains: a backward pass and an optimizer step in its body, also through the notebook's
        functions it calls, but not those that hold a training loop of their own (`for epoch in range(n):
        run_epoch(...)`: the loop inside run_epoch is the one converted)."""
        if not isinstance(node, (cst.For, cst.While)):
            return False
        done = set()
        for call in live_calls(node.body):
            definitions = self.names.definitions(call.func)
            if not (definitions and all(map(self._holds_loop, definitions))):
                done |= self.effects.of_call(call)
        return BACKWARD in done and (STEP in done or bool(self._built_from_parameters(node)))

    def _holds_loop(self, definition) -> bool:
        """The notebook's function has a training loop of its own in its body."""
        definition = self.names.orig(definition)
        if definition not in self.holds:
            self.holds[definition] = False  # a recursive function: not known yet
            self.holds[definition] = isinstance(definition, cst.FunctionDef) and any(
                self._trains(loop) for loop in _loops(definition.body))
        return self.holds[definition]

    def _caller(self, arg):
        """The notebook's function whose parameter `arg` reads, where nothing there rebinds it: its value is what
        the calls of that function pass (nbddp.meanings follows it)."""
        bound = self.names.bindings(arg) if isinstance(arg, cst.Name) else []
        functions = {self.names.function_of(node) if isinstance(node, cst.Param) else None for node in bound}
        return functions.pop() if len(functions) == 1 else None

    def visit_FunctionDef(self, node):
        self.functions.append(self.names.orig(node))

    def leave_FunctionDef(self, original, updated):
        self.functions.pop()
        return updated

    def visit_ClassDef(self, node):
        return False  # methods of a Trainer subclass and the like: the Trainer distributes them

    def visit_If(self, node):
        return not is_rank_test(node, self.names)

    def visit_For(self, node):
        return not self._converts(node)  # a training loop is rewritten whole, from the block that holds it

    def visit_While(self, node):
        return not self._converts(node)

    def _converts(self, loop) -> bool:
        """A loop that trains, and the one to convert: not one that makes its model anew each pass (`for lr in
        lrs: net = Net(); ...`: the loop inside it, after the model is made, is)."""
        key = self.names.orig(loop)  # (asked when the loop is visited and again when its block is left)
        if key not in self.converts:
            model = self._model(loop) if self._trains(loop) else ""
            made = set().union(*(reads_writes(s)[1] for s in loop.body.body)) if model else set()
            self.converts[key] = model != "" and (model is None or model.split(".")[0] not in made)
        return self.converts[key]

    def _body(self, body):
        out = []
        for stmt in body:
            self.cell = starts_cell(stmt) or self.cell  # the cell the loop is in (the module's body comes last)
            if self._converts(stmt) and not (out and _called(out[-1]) in (WRAP, STOP)):  # not converted already
                out += self._plan(stmt)
            else:
                out.append(stmt)
        return out

    def leave_IndentedBlock(self, original, updated):
        return updated.with_changes(body=self._body(updated.body))

    def leave_Module(self, original, updated):
        return updated.with_changes(body=self._body(updated.body))

    # ---- one loop ----

    def _calls_in(self, loop) -> list[cst.Call]:
        """The loop's calls, and those of the notebook's functions it calls, transitively."""
        found, seen, todo = [], set(), list(live_calls(loop.body))
        while todo:
            call = todo.pop(0)
            found.append(call)
            for definition in self.names.definitions(call.func):
                if definition not in seen:
                    seen.add(definition)
                    todo += live_calls(definition.body)
        return found

    def _optimizers(self, loop) -> list[cst.BaseExpression]:
        """The optimizer expressions the loop steps, itself or in the notebook's functions it calls: `opt` in
        `opt.step()` and in `scaler.step(opt)`, and an optimizer of a library nbddp has no entry for."""
        found = []
        for call in self._calls_in(loop):
            if STEP in self.names.kinds(call.func) and isinstance(call.func, cst.Attribute):
                found += [a.value for a in call.args if a.keyword is None] + [call.func.value]
        return found + self._built_from_parameters(loop)

    def _built_from_parameters(self, loop) -> list[cst.BaseExpression]:
        """`opt` of `opt.step()` where `opt` was built from a model's `.parameters()`: torch's optimizer protocol,
        whatever library the optimizer comes from (`Lion(model.parameters())`, `create_optimizer(model)` aside)."""
        return [call.func.value for call in self._calls_in(loop) if isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "step" and self._model_of(call.func.value) is not None]

    def _model_of(self, optimizer, depth: int = 0) -> str | None:
        """`model` for an optimizer (its name, or the call that makes it) built from `model.parameters()` anywhere in
        its arguments, also through the names they read (`params = [p for p in model.parameters() if
        p.requires_grad]`, parameter groups)."""
        for call in live_calls(optimizer):
            if isinstance(call.func, cst.Attribute) and call.func.attr.value in PARAMETERS:
                return dotted(call.func.value)
        reads = [n for n in name_nodes(optimizer)
                 if self.names.orig(n) in self.names.referents]  # not `x.attr`'s attr; a node a step rewrote, too
        for name in reads if depth < FOLLOW else ():
            value = self.names.value(name)
            model = self._model_of(value, depth + 1) if value is not None else None
            if model:
                return model
        return None

    def _model(self, loop) -> str | None:
        for optimizer in self._optimizers(loop):
            model = self._model_of(optimizer)
            if model:
                return model
            if self.functions and isinstance(optimizer, cst.Name):
                model = self._through_calls(self.functions[-1], optimizer.value)
                if model:
                    return model
        return None

    def _through_calls(self, function, param, depth: int = 0) -> str | None:
        """The model a function's optimizer parameter `param` trains, from the calls of that function: the parameter
        each call passes that model as (or the model's own name, read as a global in the function); a call that
        passes on a parameter of the function it is made in is followed to that function's calls."""
        for _, bound in self.names.sites(function):
            optimizer = bound.get(param)  # a name, or the optimizer made in the call's arguments
            model = self._model_of(optimizer) if optimizer is not None else None
            caller = self._caller(optimizer) if model is None and depth < FOLLOW else None
            if caller is not None:
                model = self._through_calls(caller, optimizer.value, depth + 1)
            if model:
                return next((p for p, arg in bound.items() if dotted(arg) == model), model)
        return None

    def _data(self, loop):
        """The innermost `for` around the backward, and the expression in its iterable that yields the batches."""
        inner = None
        for node in (n for n in _loops(loop) if isinstance(n, cst.For)):
            if BACKWARD in self.effects.of_node(node.body):
                inner = node
        if inner is None:
            return None
        data = inner.iter
        while isinstance(data, cst.Call) and data.args and any(
                parts(m)[-1] in PASS_THROUGH for m in self.names.meanings(data.func)):
            data = data.args[0].value
        if isinstance(data, cst.Call) and any(parts(m)[-1] in ("range", DEAL) for m in self.names.meanings(data.func)):
            return None
        return inner, data

    def _plan(self, loop):
        """The loop's statements: the helper's line, then the loop; each is, for later steps, the loop as it was."""
        placed = self._placed(loop)
        self.names.origin[placed[0]] = self.names.orig(loop)
        same_statements(self.names, loop, placed[-1])
        return placed

    def _placed(self, loop):
        model = self._model(loop)
        if model is None:
            self.report.warn(self.cell, "a training loop (a backward pass, then an optimizer step) whose model nbddp "
                             "cannot tell: the script stops before it on several processes rather than train one "
                             "copy per rank; wrap the model in DistributedDataParallel yourself")
            where = f"the training loop of cell {self.cell}"
            return [call_stmt(STOP, cst.SimpleString(repr(where))).with_changes(leading_lines=loop.leading_lines),
                    loop.with_changes(leading_lines=())]
        text = f"a training loop of its own: {model} trains through DDP ({WRAP}({model}) before the loop)"
        found = self._data(loop)
        if found is None:
            self.report.warn(self.cell, f"{text}, but nbddp cannot tell which data the loop reads: every rank "
                             "trains on the same batches (one model, no speed-up): loop over a DataLoader by "
                             "name (`for batch in loader:`) so nbddp can deal it to the ranks")
        else:
            inner, data = found
            dealt = cst.Call(cst.Name(DEAL), args=[cst.Arg(data)])
            new_iter = dealt if data is inner.iter else inner.iter.deep_replace(data, dealt)
            loop = loop.deep_replace(inner, inner.with_changes(iter=new_iter))
            text += f", each rank reads its own share of {code_of(data)} ({DEAL})"
        self.report.change(self.cell, text)
        return [call_stmt(WRAP, cst.parse_expression(model)).with_changes(leading_lines=loop.leading_lines),
                loop.with_changes(leading_lines=())]


def _loops(node) -> list:
    """The `for` and `while` loops in a statement or block, outermost first, not inside a nested def."""
    found = []

    class _Loops(cst.CSTVisitor):
        def visit_For(self, loop):
            found.append(loop)

        visit_While = visit_For

        def visit_FunctionDef(self, _):
            return False

    walk(node, _Loops())
    return found


def _called(stmt) -> str | None:
    """`f` for a statement that is only a call `f(...)`."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    return dotted(small.value.func) if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) else None


class CustomLoop(TreeStep):
    name = "custom-loop"
    inserts = (WRAP, DEAL, STOP)
    rewriter = _Rewrite

    def run(self, tree, ctx):
        facts = frozenset().union(*map(tree.facts, tree.module.body))
        if BACKWARD not in facts or OWN_DDP in facts:
            return tree.module
        return super().run(tree, ctx)  # the whole tree: a loop may train through a function another cell defines
