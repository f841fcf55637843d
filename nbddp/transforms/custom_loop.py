"""Step: a training loop of the notebook's own (`loss.backward()` and an optimizer's `.step()`, no Trainer) trains one
model on every rank.

Before the outermost loop that trains, `nbddp_ddp(model)` routes the model's training forward through DDP (the model
is the one whose parameters the stepped optimizer was built from, followed through the notebook's assignments and,
for a loop inside the notebook's own function, through the calls of that function); the data the innermost loop
iterates becomes `nbddp_distributed(...)`, each rank's share of a DataLoader. Where the model cannot be told, the
script stops before the loop (`nbddp_unsynced_loop`) rather than train one copy per rank. Notebooks that distribute
their own training (accelerate, torch's DDP, Lightning) are left alone.
"""
from __future__ import annotations

import libcst as cst

from ..cst import call_stmt, callee_tail, code_of, dotted, is_if_false, is_rank_test, parse
from .base import Transform, cell_number

WRAP, DEAL, STOP = "nbddp_ddp", "nbddp_distributed", "nbddp_unsynced_loop"
OWN_DISTRIBUTION = frozenset({"DistributedDataParallel", "DDP", "Accelerator", "Fabric", "notebook_launcher",
                              "FullyShardedDataParallel"})
PARAMETERS = frozenset({"parameters", "named_parameters"})
PASS_THROUGH = frozenset({"enumerate", "tqdm", "iter", "trange", "auto_tqdm"})  # wrap what they iterate


def _calls(node) -> list[cst.Call]:
    """Calls in `node`, not inside a nested def, lambda or class."""
    found = []

    class _Calls(cst.CSTVisitor):
        def visit_Call(self, call):
            found.append(call)

        def visit_FunctionDef(self, _):
            return False

        def visit_ClassDef(self, _):
            return False

        def visit_Lambda(self, _):
            return False

    node.visit(_Calls())
    return found


def _is_backward(call) -> bool:
    """`loss.backward()` (keywords allowed, no positional argument: `accelerator.backward(loss)` is not one)."""
    return callee_tail(call) == "backward" and isinstance(call.func, cst.Attribute) and not any(
        a.keyword is None for a in call.args)


def _stepped(call) -> list[str]:
    """The optimizer names a `.step()` call steps: `opt.step()`, `scaler.step(opt)`."""
    if callee_tail(call) != "step" or not isinstance(call.func, cst.Attribute):
        return []
    owner = dotted(call.func.value)
    names = [dotted(a.value) for a in call.args if a.keyword is None]
    return [n for n in names + [owner] if n]


def _trains(loop) -> list[str] | None:
    """The names a loop steps (`opt.step()`, `scaler.step(opt)`) where it also calls backward; else None."""
    calls = _calls(loop)
    stepped = [name for c in calls for name in _stepped(c)]
    return stepped if stepped and any(_is_backward(c) for c in calls) else None


class _Facts(cst.CSTVisitor):
    """Across the notebook: optimizers (name -> the model whose parameters they take), functions (name -> params),
    the arguments of each call of a notebook function, and whether the notebook distributes training itself."""

    def __init__(self):
        self.optimizers: dict[str, str] = {}
        self.functions: dict[str, list[str]] = {}
        self.call_args: dict[str, list[dict[str, str]]] = {}
        self.own = False

    def visit_Assign(self, node):
        targets = [dotted(t.target) for t in node.targets]
        owners = [dotted(c.func.value) for c in _calls(node.value)
                  if callee_tail(c) in PARAMETERS and isinstance(c.func, cst.Attribute)]
        if owners and owners[0]:
            for target in targets:
                if target:
                    self.optimizers[target] = owners[0]

    def visit_FunctionDef(self, node):
        self.functions[node.name.value] = [p.name.value for p in node.params.params]

    def visit_Call(self, node):
        if (callee_tail(node) or "") in OWN_DISTRIBUTION:
            self.own = True
        if isinstance(node.func, cst.Name):
            self.call_args.setdefault(node.func.value, []).append(
                {i: dotted(a.value) for i, a in enumerate(node.args) if a.keyword is None} |
                {a.keyword.value: dotted(a.value) for a in node.args if a.keyword is not None})

    def model_in(self, function, optimizers) -> str | None:
        """The model a loop trains, seen from `function` (None: top level): the optimizer's model, or in a function,
        the parameter that each call passes the optimizer's model as (or that model itself, as a global)."""
        for name in optimizers:
            if name in self.optimizers and function is None:
                return self.optimizers[name]
            if function is None:
                continue
            params = self.functions.get(function, [])
            for args in self.call_args.get(function, []):
                bound = {p: args.get(i, args.get(p)) for i, p in enumerate(params)}
                if name in params and bound.get(name) in self.optimizers:
                    model = self.optimizers[bound[name]]
                    return next((p for p, value in bound.items() if value == model), model)
            if name in self.optimizers and name not in params:
                return self.optimizers[name]
        return None


def _data(loop) -> tuple[cst.For, cst.BaseExpression] | None:
    """The innermost `for` around the backward call, and the expression in its iterable that yields the batches."""
    inner = None

    class _Innermost(cst.CSTVisitor):
        def visit_For(self, node):
            nonlocal inner
            if any(_is_backward(c) for c in _calls(node.body)):
                inner = node

        def visit_FunctionDef(self, _):
            return False

    loop.visit(_Innermost())
    if inner is None:
        return None
    data = inner.iter
    while isinstance(data, cst.Call) and callee_tail(data) in PASS_THROUGH and data.args:
        data = data.args[0].value
    if isinstance(data, cst.Call) and callee_tail(data) in ("range", DEAL):
        return None
    return inner, data


def _called(stmt) -> str | None:
    """`f` for a statement that is only a call `f(...)`."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    return callee_tail(small.value) if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) else None


class _Rewrite(cst.CSTTransformer):
    def __init__(self, facts: _Facts, cell: int, report):
        self.facts, self.cell, self.report = facts, cell, report
        self.function: list[str] = []
        self.loops = 0

    def visit_FunctionDef(self, node):
        self.function.append(node.name.value)

    def leave_FunctionDef(self, original, updated):
        self.function.pop()
        return updated

    def visit_ClassDef(self, node):
        return False  # methods of a Trainer subclass and the like: the Trainer distributes them

    def visit_If(self, node):
        return not (is_if_false(node) or is_rank_test(node))

    def visit_For(self, node):
        return _trains(node) is None  # a training loop is rewritten whole, from its own block

    def visit_While(self, node):
        return _trains(node) is None

    def _body(self, body):
        out = []
        for stmt in body:
            optimizers = _trains(stmt) if isinstance(stmt, (cst.For, cst.While)) else None
            if optimizers is None:
                out.append(stmt)
                continue
            if out and _called(out[-1]) in (WRAP, STOP):
                out.append(stmt)  # converted already
                continue
            out += self._plan(stmt, optimizers)
        return out

    def _plan(self, loop, optimizers):
        where = f"the training loop of cell {self.cell}"
        model = self.facts.model_in(self.function[-1] if self.function else None, optimizers)
        if model is None:
            self.report.warn(self.cell, f"a training loop (backward, then {', '.join(optimizers)}.step) whose "
                             "model nbddp cannot tell: the script stops before it on several processes rather than "
                             "train one copy per rank; wrap the model in DistributedDataParallel yourself")
            return [call_stmt(STOP, cst.SimpleString(repr(where))), loop]
        found = _data(loop)
        text = f"a training loop of its own: {model} trains through DDP ({WRAP}({model}) before the loop)"
        if found is None:
            self.report.warn(self.cell, f"{text}, but nbddp cannot tell which data the loop reads: every rank "
                             "trains on the same batches (one model, no speed-up)")
        else:
            inner, data = found
            wrapped = cst.Call(cst.Name(DEAL), args=[cst.Arg(data)])
            loop = loop.deep_replace(inner, inner.with_changes(iter=inner.iter.deep_replace(data, wrapped)) if
                                     data is not inner.iter else inner.with_changes(iter=wrapped))
            text += f", each rank reads its own share of {code_of(data)} ({DEAL})"
        self.report.change(self.cell, text)
        lead = loop.leading_lines
        return [call_stmt(WRAP, cst.parse_expression(model)).with_changes(leading_lines=lead),
                loop.with_changes(leading_lines=())]

    def leave_IndentedBlock(self, original, updated):
        return updated.with_changes(body=self._body(updated.body))

    def leave_Module(self, original, updated):
        return updated.with_changes(body=self._body(updated.body))


class CustomLoop(Transform):
    name = "custom-loop"

    def preprocess(self, nb, ctx):
        if not any("backward" in cell.source for cell in nb.cells):
            return nb
        modules = [(cell, parse(cell.source, cell=cell_number(cell), step=self.name)) for cell in nb.cells]
        facts = _Facts()
        for _, module in modules:
            module.visit(facts)
        if facts.own:
            return nb
        for cell, module in modules:
            if "backward" in cell.source:
                new = module.visit(_Rewrite(facts, cell_number(cell), ctx.report))
                if new.code != cell.source:
                    cell.source = new.code
        return nb
