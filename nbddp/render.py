"""Assemble the script: the notebook's cells (with `# %% cell N` markers) inside the templates' skeleton."""
from __future__ import annotations

import hashlib
from pathlib import Path

import libcst as cst

from .cells import starts_cell
from .install_values import has_placeholders
from .writer import stamped


def body_block(module: cst.Module) -> str:
    """The notebook's tree (nbddp.tree: cells marked `# %% cell N`, blank lines bare) as one indented block for the
    skeleton's `try:`; comments and layout kept."""
    statements, pending = list(module.body), list(module.footer)
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


def hoist_futures(module: cst.Module) -> tuple[cst.Module, list[str]]:
    """The tree without its top-level `from __future__ import ...` lines, and those lines once each: Python takes
    them only at the top of a file. A statement's leading lines (a cell's marker) stay, before a `pass` where it was
    the cell's only statement."""
    futures, body, lead = [], [], ()
    for stmt in list(module.body) + [None]:
        if stmt is not None and _is_future(stmt):
            futures.append(cst.Module([stmt.with_changes(leading_lines=())]).code.strip())
            lead += tuple(stmt.leading_lines)
            continue
        if lead and (stmt is None or starts_cell(stmt) is not None):
            body.append(cst.SimpleStatementLine([cst.Pass()], leading_lines=lead))
        elif lead:
            stmt = stmt.with_changes(leading_lines=lead + tuple(stmt.leading_lines))
        lead = ()
        if stmt is not None:
            body.append(stmt)
    return module.with_changes(body=body), list(dict.fromkeys(futures))


def runtime_module_name(script_name) -> str:
    """The module name of the runtime file beside `script_name`: `train_ddp.py` -> `train_ddp_runtime`."""
    stem = "".join(c if c.isalnum() or c == "_" else "_" for c in Path(script_name).stem) or "script"
    return ("_" if stem[0].isdigit() else "") + stem + "_runtime"


def render_runtime(runtime, **context) -> tuple[str, str]:
    """(the runtime file's text, its id): the parts of nbddp/runtime the script needs, documentation kept."""
    from .inline import render

    block = render(runtime, docs=True)
    runtime_id = hashlib.sha256(block.encode()).hexdigest()[:12]
    text = environment().get_template("runtime.py.j2").render(runtime=block, runtime_id=runtime_id, **context)
    return stamped(text), runtime_id


def render_script(module, runtime, runtime_module=None, runtime_id=None, **context) -> str:
    """The script: the notebook's converted tree inside the skeleton; `runtime` (module -> why) picks the
    nbddp/runtime modules it needs: imported from `runtime_module` (a file beside the script, whose id the script
    checks), else inlined (one file, whose header says where the notebook starts)."""
    from .inline import render

    module, futures = hoist_futures(module)
    template = environment().get_template("ddp_script.py.j2")
    values = dict(body=body_block(module), runtime=None if runtime_module else render(runtime), start=runtime.start(),
                  futures=futures, runtime_module=runtime_module, runtime_id=runtime_id,
                  placeholders=has_placeholders(context.get("installs") or ()), **context)
    script = template.render(starts=0, **values)
    if runtime_module:
        return stamped(script)
    lines = script.splitlines()
    starts = next((n for n, line in enumerate(lines, start=1) if line.startswith("    # %% cell")),
                  next(n for n, line in enumerate(lines, start=1) if line == "try:"))
    return stamped(template.render(starts=starts, **values))
