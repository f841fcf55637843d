"""Assemble the script: the notebook's cells (with `# %% cell N` markers) inside the templates' skeleton."""
from __future__ import annotations

import libcst as cst

from .cst import parse
from .transforms.base import cell_number


class _BareBlankLines(cst.CSTTransformer):
    """Blank lines get no indentation (no trailing spaces in the script)."""

    def leave_EmptyLine(self, original, updated):
        return updated.with_changes(indent=False) if updated.comment is None else updated


def body_block(cells) -> str:
    """All cells as one indented block (for the skeleton's `try:`); comments and layout kept."""
    statements, pending = [], []
    for cell in cells:
        module = parse(cell.source, cell=cell_number(cell), step="render").visit(_BareBlankLines())
        if statements or pending:
            pending.append(cst.EmptyLine(indent=False))
        pending.append(cst.EmptyLine(comment=cst.Comment(f"# %% cell {cell_number(cell)}")))
        pending += list(module.header)
        for stmt in module.body:
            statements.append(stmt.with_changes(leading_lines=tuple(pending) + tuple(stmt.leading_lines)))
            pending = []
        pending += list(module.footer)
    if not statements:
        statements.append(cst.SimpleStatementLine([cst.Pass()], leading_lines=tuple(pending)))
        pending = []
    while pending and pending[-1].comment is None:
        pending.pop()  # no trailing blank lines before `finally:`
    return cst.Module([]).code_for_node(cst.IndentedBlock(body=statements, footer=tuple(pending)))


def _docstring(text) -> str:
    return str(text).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("nbddp.templates", "."),
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    env.filters["docstring"] = _docstring
    return env


def _is_future(stmt) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, cst.ImportFrom) and isinstance(s.module, cst.Name) and s.module.value == "__future__"
        for s in stmt.body)


def hoist_futures(cells) -> tuple[list, list[str]]:
    """The cells without their top-level `from __future__ import ...` lines, and those lines once each: Python takes
    them only at the top of a file."""
    futures, out = [], []
    for cell in cells:
        module = parse(cell.source, cell=cell_number(cell), step="render")
        kept = [stmt for stmt in module.body if not _is_future(stmt)]
        if len(kept) != len(module.body):
            futures += [cst.Module([stmt.with_changes(leading_lines=())]).code.strip()
                        for stmt in module.body if _is_future(stmt)]
            cell = cell.copy()
            cell.source = module.with_changes(body=kept).code if kept else "pass\n"
        out.append(cell)
    return out, list(dict.fromkeys(futures))


def render_script(cells, runtime, **context) -> str:
    """The script: `runtime` (module -> why) picks the nbddp/runtime modules it carries, inlined."""
    from .inline import render

    cells, futures = hoist_futures(cells)
    return environment().get_template("ddp_script.py.j2").render(body=body_block(cells), runtime=render(runtime),
                                                                  start=runtime.start(), futures=futures, **context)
