"""Step: notebook-only front-ends. tqdm's notebook bars (`tqdm.notebook`, `tqdm.autonotebook`,
`tqdm_notebook`, `tnrange`) need ipywidgets and draw no text in a script: they become `tqdm.auto`, which draws text
bars in a script and widgets in a notebook. Import statements are read as written; a use through a module
(`tqdm.notebook.tqdm(...)`, `tq.tqdm_notebook(...)`) is found by what its name means (nbddp.meanings), and where
`tqdm.auto` is then not imported by the statement that binds the module, `import tqdm.auto` is added after it.
`ipywidgets` imports are a warning: a script shows no widgets."""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import dotted
from ..tree import Recording, TreeTransformer
from .base import TreeStep

AUTO = "tqdm.auto"
MENTIONS = frozenset({"tqdm", "ipywidgets"})  # and the names bound from them (tree.visit follows those)
NOTEBOOK_MODULES = frozenset({"tqdm.notebook", "tqdm.autonotebook"})
SUBMODULES = frozenset({"notebook", "autonotebook"})  # `from tqdm import notebook`, `tqdm.notebook`
CLASSES = {"tqdm_notebook": "tqdm", "tnrange": "trange"}  # tqdm's notebook names -> tqdm.auto's
CHANGED = "tqdm.auto: text progress bars in the script (widget bars still in a notebook)"
WIDGETS = ("ipywidgets: widgets do not show in a script; the code runs and each widget's value stays its default. "
           "Set the values the widgets chose in the code before running the script")


def _dotted_expr(path: str) -> cst.BaseExpression:
    parts = path.split(".")
    expr: cst.BaseExpression = cst.Name(parts[0])
    for part in parts[1:]:
        expr = cst.Attribute(expr, cst.Name(part))
    return expr


def _as(name: str, alias: str) -> cst.ImportAlias:
    return cst.ImportAlias(cst.Name(name), asname=None if alias == name else cst.AsName(cst.Name(alias)))


def _alias_name(alias: cst.ImportAlias) -> str:
    return alias.asname.name.value if alias.asname is not None else alias.name.value


class _Widgets(TreeTransformer):
    def __init__(self, tree, ctx):
        super().__init__(tree, ctx)
        self.needs: dict = {}  # an Import the analysis saw -> the name `import tqdm.auto` is added as

    def _widgets(self, module):
        if module == "ipywidgets" or (module or "").startswith("ipywidgets."):
            self.report.warn(self.cell, WIDGETS)

    def visit_Import(self, node):
        return False  # its dotted names are not uses

    def visit_ImportFrom(self, node):
        return False

    def leave_Import(self, original, updated):
        names = []
        for alias in updated.names:
            module = dotted(alias.name)
            self._widgets(module)
            if module in NOTEBOOK_MODULES:
                self.report.change(self.cell, f"import {module} → {CHANGED}")
                alias = alias.with_changes(name=_dotted_expr(AUTO))
            names.append(alias)
        changed = any(new is not old for new, old in zip(names, updated.names))
        return updated.with_changes(names=names) if changed else updated  # the analysis' own node where unchanged

    def leave_ImportFrom(self, original, updated):
        if updated.relative or updated.module is None:
            return updated
        module = dotted(updated.module)
        self._widgets(module)
        if module in NOTEBOOK_MODULES:
            self.report.change(self.cell, f"from {module} import … → {CHANGED}")
            return updated.with_changes(module=_dotted_expr(AUTO))
        if module != "tqdm" or isinstance(updated.names, cst.ImportStar):
            return updated
        kept, moved = [], []
        for alias in updated.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else None
            if name in CLASSES:
                moved.append(_as(CLASSES[name], _alias_name(alias)))
            elif name in SUBMODULES:
                kept.append(_as("auto", _alias_name(alias)))
            else:
                kept.append(alias.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        if not moved and not any(isinstance(a.name, cst.Name) and a.name.value in SUBMODULES for a in updated.names):
            return updated
        names = ", ".join(dotted(a.name) or "?" for a in updated.names)
        self.report.change(self.cell, f"from tqdm import {names} → {CHANGED}")
        statements = [updated.with_changes(names=kept, lpar=None, rpar=None)] if kept else []
        if moved:
            statements.append(cst.ImportFrom(module=_dotted_expr(AUTO), names=moved))
        if len(statements) == 1:
            return statements[0]
        return cst.FlattenSentinel([s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for s in statements])

    def leave_SimpleStatementLine(self, original, updated):
        if len(updated.body) == len(original.body):
            return updated
        # an import split in two: one statement a line, the cell's marker and comments on the first
        lines = [cst.SimpleStatementLine([s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)]) for s in updated.body]
        lines[0] = lines[0].with_changes(leading_lines=updated.leading_lines)
        lines[-1] = lines[-1].with_changes(trailing_whitespace=updated.trailing_whitespace)
        return cst.FlattenSentinel(lines)

    def leave_Attribute(self, original, updated):
        attr = original.attr.value
        if attr not in SUBMODULES and attr not in CLASSES or not isinstance(original.value, cst.Name):
            return updated
        if self.names.meanings(original.value) != frozenset({"tqdm"}):
            return updated
        imports = [b for b in self.names.bindings(original.value) if isinstance(b, cst.Import)]
        if not imports:
            return updated  # not a module the notebook imported
        shown = f"{original.value.value}.{attr}"
        if attr in SUBMODULES:
            new = updated.with_changes(attr=cst.Name("auto"))
            self.report.change(self.cell, f"{shown} → {original.value.value}.auto: text progress bars in the script")
        else:
            new = cst.Attribute(cst.Attribute(updated.value, cst.Name("auto")), cst.Name(CLASSES[attr]))
            self.report.change(self.cell, f"{shown} → {original.value.value}.auto.{CLASSES[attr]}: text progress "
                               "bars in the script")
        for node in imports:
            if not any(dotted(a.name) in NOTEBOOK_MODULES | {AUTO} for a in node.names):
                name = original.value.value
                self.needs[node] = None if name == "tqdm" else f"nbddp_{name}_auto"
        return new


class _AddAuto(Recording, cst.CSTTransformer):
    """`import tqdm.auto` after each statement that imports the tqdm a rewritten `….auto` use reads."""

    def __init__(self, names, needs):
        super().__init__()
        self.names, self.needs = names, needs

    def leave_SimpleStatementLine(self, original, updated):
        found = [self.needs[n] for n in map(self.names.orig, original.body) if n in self.needs]
        if not found:
            return updated
        alias = cst.ImportAlias(_dotted_expr(AUTO), asname=cst.AsName(cst.Name(found[0])) if found[0] else None)
        return cst.FlattenSentinel([updated, cst.SimpleStatementLine([cst.Import([alias])])])


class Widgets(TreeStep):
    name = "widgets"

    def run(self, tree, ctx) -> cst.Module:
        rewriter = _Widgets(tree, ctx)
        module = tree.visit(rewriter, mentions=MENTIONS)
        if rewriter.needs:
            module = module.visit(_AddAuto(tree.names, rewriter.needs))
        return module
