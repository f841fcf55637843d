"""The `get_ipython().…(...)` calls IPython's transformers write for `!cmd`, `%magic` and `x = %magic` lines, as the
script's Python: each line means in the script what IPython made of it in the notebook.

- `!cmd` runs once per machine (`nbddp_shell`), `x = !cmd` binds the output's lines (`nbddp_getoutput`); shell and
  magic lines keep IPython's expansion (`$name`, `{expr}`, `$$`: expansion.py).
- Installs (`!pip`, `%pip`, `%conda`, ...) are listed in the script's header and removed.
- `%env`/`%set_env`/`%cd` become os calls; `%time stmt`, `%timeit stmt` run the statement once; `%run file args`
  runs the file in the script's process (`nbddp_run_file`), its names then the notebook's.
- A magic used as a value binds what IPython gives: `x = %time f()` runs `f()` (timed) and binds its value,
  `x = %sx cmd` the output's lines, `x = %pwd` the folder, `x = %env NAME` the variable; a magic whose value is None
  (`x = %pip install ...`) runs and binds None. A value the script cannot give stops the conversion at its line.
"""
from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ..cst_helpers import call_stmt, code_of, parse
from ..errors import ConversionError
from .base import Context
from .expansion import UNEXPANDED, line_expression
from .ipython_names import computed_call, is_shell
from .markers import marker
from .shell import OWN_PROCESS, is_install, is_launch, launch_inside, one_line, runs_python

DROP_QUIETLY = frozenset({
    "matplotlib", "load_ext", "reload_ext", "unload_ext", "autoreload", "aimport", "config", "pinfo", "pinfo2",
    "pdef", "pdoc", "psource", "pfile", "who", "who_ls", "whos", "xmode", "precision", "colors", "clear", "lsmagic",
    "history", "page", "pwd", "ls", "pylab", "notebook", "tensorflow_version", "reset", "reset_selective",
    "rehashx", "alias", "unalias", "bookmark", "dhist", "dirs", "env_list", "magic", "quickref", "doctest_mode",
    "autocall", "automagic", "qtconsole", "connect_info", "store", "recall", "rerun", "save", "logstart", "logstop",
    "logon", "logoff", "logstate", "pprint", "sc", "cat", "more", "less", "man", "nbdev_export",
})
INSTALL_MAGICS = frozenset({"pip", "conda", "mamba", "uv", "micromamba"})
RUN_ONCE = frozenset({"time", "timeit", "prun", "memit"})  # the statement runs once; the measurement is dropped
# Magics whose value IPython gives as None: as a value, the script runs the line and binds None
NONE_VALUED = INSTALL_MAGICS | {"cd", "set_env", "matplotlib", "load_ext", "reload_ext", "autoreload", "config"}


def _stmt(text: str) -> cst.BaseStatement:
    return cst.parse_statement(text + "\n")


def _call(func: str, *args: cst.BaseExpression) -> cst.Call:
    return cst.Call(cst.parse_expression(func), args=[cst.Arg(a) for a in args])


def _literal_args(call: cst.Call) -> list[str] | None:
    values = []
    for arg in call.args:
        if not isinstance(arg.value, (cst.SimpleString, cst.ConcatenatedString)):
            return None
        value = arg.value.evaluated_value
        if not isinstance(value, str):
            return None
        values.append(value)
    return values


def is_ipython_call(node, aliases=frozenset()) -> bool:
    """`get_ipython().<something>(...)`, as IPython's transformers write it, or through a saved `ip = get_ipython()`
    (libcst.matchers is slow to import)."""
    func = node.func if isinstance(node, cst.Call) else None
    return isinstance(func, cst.Attribute) and is_shell(func.value, aliases)


def acts_on_ipython(node, aliases=frozenset()) -> bool:
    """A call on something `get_ipython()` gives: `get_ipython().kernel.do_shutdown(True)`, `get_ipython().X(...)`."""
    func = node.func if isinstance(node, cst.Call) else None
    while isinstance(func, cst.Attribute):
        func = func.value
        if is_shell(func, aliases):
            return True
    return False


def _assigned_call(line, aliases=frozenset()) -> cst.Call | None:
    """The IPython call of a line `target = get_ipython()...(...)` (also annotated), else None."""
    small = line.body[0] if len(line.body) == 1 else None
    if isinstance(small, (cst.Assign, cst.AnnAssign)) and is_ipython_call(small.value, aliases):
        return small.value
    return None


class IPythonCalls(cst.CSTTransformer):
    """Rewrites the `get_ipython().system/run_line_magic/getoutput(...)` calls of one cell (`rewrite(module)`)."""

    def __init__(self, cell: int, ctx: Context, step: str, offset: int = 0, aliases=frozenset(), cell_magic=None):
        super().__init__()
        self.cell, self.ctx, self.step, self.offset = cell, ctx, step, offset
        self.aliases = aliases  # names bound to get_ipython()
        self.cell_magic = cell_magic  # `%%name line\nbody` -> the Python the magics step makes of such a cell
        self.installs = 0
        self.at = None  # the line being rewritten (an error names it)

    def rewrite(self, module: cst.Module) -> cst.Module:
        self.module = module
        return module.visit(self)

    def _stop(self, node, message: str) -> ConversionError:
        """The error at `node`'s line of the cell (positions are read only here: a rare path)."""
        positions = MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(PositionProvider)
        line = positions[node].start.line + self.offset
        return ConversionError(message, step=self.step, cell=self.cell, line=line)

    def _whole_line(self, node) -> bool:
        return len(node.body) == 1 and isinstance(node.body[0], cst.Expr) and \
            acts_on_ipython(node.body[0].value, self.aliases)

    def visit_SimpleStatementLine(self, node):
        # whole-line calls and assigned values are replaced below, not visited as expressions
        return not (self._whole_line(node) or _assigned_call(node, self.aliases) is not None)

    def leave_SimpleStatementLine(self, original, updated):
        if self._whole_line(updated):
            self.at = original
            new = self._line(updated.body[0].value)
        elif _assigned_call(updated, self.aliases) is not None:
            new = self._value(original, updated)
        else:
            return updated
        new = list(new)
        new[0] = new[0].with_changes(leading_lines=updated.leading_lines)
        return cst.FlattenSentinel(new)

    def leave_Call(self, original, updated):
        """An IPython call inside an expression of the notebook's own code: only `getoutput` has a value here."""
        if not is_ipython_call(updated, self.aliases):
            return updated
        args = _literal_args(updated)
        if updated.func.attr.value == "getoutput" and args:
            return self._getoutput(args[0])
        raise self._stop(original, f"{one_line(code_of(updated), 60)} inside an expression has no script "
                                   "equivalent; give the value in Python in the notebook")

    def _line(self, call):
        if not is_ipython_call(call, self.aliases):  # get_ipython().kernel.do_shutdown(True): Colab's restart
            shown = one_line(code_of(call), 60)
            self.ctx.report.warn(self.cell, f"removed `{shown}`: it acts on the notebook's IPython kernel, which a "
                                            "script does not have (a restart after installs: nothing to restart; "
                                            "install before launching)")
            return [marker(f"removed `{shown}`: a script has no IPython kernel")]
        kind = call.func.attr.value
        args = _literal_args(call)
        if args is None:
            computed = computed_call(call, self.ctx.report, self.cell)
            if computed is not None:
                return computed
            self.ctx.report.warn(self.cell, f"could not read IPython call {one_line(code_of(call))}; removed it: if the "
                                            "script needs it, write it as Python in the notebook")
            return [marker("removed an IPython call it could not read")]
        if kind in {"system", "getoutput"}:
            return self._shell(args[0])
        if kind == "run_line_magic":
            return self._line_magic(args[0], args[1] if len(args) > 1 else "")
        if kind == "run_cell_magic" and len(args) == 3 and self.cell_magic is not None:
            module = parse(self.cell_magic(f"%%{args[0]} {args[1]}".rstrip() + "\n" + args[2]), cell=self.cell,
                           step=self.step)  # the same path as a `%%` cell: %%writefile written, %%bash run
            body = [*module.body] or [marker(f"%%{args[0]} {one_line(args[1], 40)}: nothing for the script to run")]
            return [body[0].with_changes(leading_lines=tuple(module.header) + tuple(body[0].leading_lines)), *body[1:]]
        self.ctx.report.warn(self.cell, f"removed get_ipython().{kind}(...), which has no script equivalent: if the "
                                        "script needs what it did, write that as Python in the notebook")
        return [marker(f"removed get_ipython().{kind}(...)")]

    def _value(self, original, updated):
        """`target = <IPython call>`: the line's work, and the target bound to the value IPython gives."""
        small, call = updated.body[0], _assigned_call(updated, self.aliases)
        kind, args = call.func.attr.value, _literal_args(call)
        target = code_of(small.target if isinstance(small, cst.AnnAssign) else small.targets[0].target)

        def bind(value, before=()):
            return [*before, updated.with_changes(body=[small.with_changes(value=value)], leading_lines=())]

        name, line = (args + [""])[:2] if args and kind == "run_line_magic" else (None, None)
        if args is None:
            raise self._stop(original, f"`{target} = {one_line(code_of(call), 60)}`: the arguments are not "
                                       "written out, so the script cannot run it; write the line in the notebook")
        if kind == "getoutput" or name in {"sx", "system"}:
            return bind(self._getoutput(line if name else args[0]))
        if kind == "system":
            self.at = original
            return bind(cst.Name("None"), self._shell(args[0]))
        if name == "time":
            return self._timed(original, line, bind)
        if name == "pwd":
            return bind(cst.parse_expression("os.getcwd()"))
        if name == "env" and not line.strip():
            return bind(cst.parse_expression("dict(os.environ)"))
        if name == "env" and len(line.split()) == 1 and "=" not in line:
            return bind(cst.parse_expression(f"os.environ[{line.strip()!r}]"))
        if name in NONE_VALUED or name == "env":
            return bind(cst.Name("None"), self._line_magic(name, line))
        shown = f"%{name} {line}".strip() if name else f"get_ipython().{kind}(...)"
        raise self._stop(original, f"`{target} = {one_line(shown, 60)}`: the script cannot give this magic's value; "
                                   "compute the value in Python in the notebook")

    def _timed(self, original, line, bind):
        """`x = %time f()`: `f()` runs inside `with nbddp_time():` (rank 0 says how long it took) and binds x."""
        try:
            value = cst.parse_expression(line.strip())
        except cst.ParserSyntaxError:
            raise self._stop(original, f"`%time {one_line(line, 50)}` as a value: IPython gives None for a statement; "
                                       "time an expression, or drop the assignment") from None
        self.ctx.report.change(self.cell, f"`%time {one_line(line, 50)}` runs and binds its value, timed on rank 0")
        body = cst.IndentedBlock(body=bind(value))
        return [cst.With(items=[cst.WithItem(_call("nbddp_time"))], body=body)]

    def _getoutput(self, command: str) -> cst.Call:
        self.ctx.report.change(self.cell, f"`!{one_line(command, 60)}` output captured with a subprocess")
        return _call("nbddp_getoutput", line_expression(command))

    def _shell(self, command: str):
        if is_launch(command):  # a DDP job inside the DDP job: every node's local rank 0 would start one
            raise self._stop(self.at, launch_inside(f"!{one_line(command, 60)}"))
        if is_install(command):
            self.ctx.report.install(command)
            self.installs += 1
            return [marker(f"removed `!{command}` (install; see the header)")]
        self.ctx.report.change(self.cell, f"`!{one_line(command, 60)}` runs once per node (local rank 0), the others "
                                          "wait")
        if runs_python(command):
            self.ctx.report.change(self.cell, f"`!{one_line(command, 60)}` {OWN_PROCESS}")
        return [call_stmt("nbddp_shell", line_expression(command))]

    def _line_magic(self, name: str, line: str):
        report = self.ctx.report
        if name in INSTALL_MAGICS:
            command = f"{name} {line}".strip()
            report.install(command)
            self.installs += 1
            return [marker(f"removed `%{command}` (install; see the header)")]
        text = (lambda value: cst.SimpleString(repr(value))) if name in UNEXPANDED else line_expression
        if name in {"env", "set_env"}:
            key, sep, value = line.partition("=") if "=" in line else line.partition(" ")
            key, value = key.strip(), value.strip()
            if key and sep:
                report.change(self.cell, f"`%{name} {one_line(line, 50)}` → os.environ")
                if " #" in value:
                    report.warn(self.cell, f"`%{name}` sets {key} to {value!r}, comment included (IPython does the "
                                "same); drop the comment in the notebook if the value is meant to be "
                                f"{value.split(' #')[0].strip()!r}")
                target = cst.Subscript(cst.parse_expression("os.environ"),
                                       [cst.SubscriptElement(cst.Index(cst.SimpleString(repr(key))))])
                return [cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(target)], text(value))])]
            return [marker(f"removed `%{name} {line}` (only displays)")]
        if name == "cd":
            report.change(self.cell, f"`%cd {line}` → os.chdir")
            path = line.strip().strip("\"'")
            return [call_stmt("os.chdir", _call("os.path.expanduser", text(path)))]
        if name in RUN_ONCE:
            try:
                return list(parse(line + "\n").body) or [marker(f"removed empty `%{name}`")]
            except ConversionError:
                report.warn(self.cell, f"`%{name} {one_line(line, 50)}` is not Python; removed it: if the script "
                                       "needs it, write it as Python in the notebook")
                return [marker(f"removed `%{name} {line}`")]
        if name in {"sx", "system"}:
            return self._shell(line)
        if name == "run" and not line.split(" #")[0].strip().endswith((".ipynb", ".ipy")):
            report.change(self.cell, f"`%run {one_line(line, 50)}` runs the file in this process, its names then "
                                     "the notebook's, as IPython runs it")
            return [call_stmt("nbddp_run_file", text(line), _call("globals"))]
        if name == "run":  # a notebook nbddp.transforms.ran_notebooks could not read
            report.warn(self.cell, f"`%run {one_line(line, 50)}` removed: the converter cannot read that notebook "
                                   "beside this one (or it runs itself); put it there and convert again, or copy its "
                                   "cells into this notebook")
            return [marker(f"removed `%run {line}`")]
        if name in DROP_QUIETLY:
            report.change(self.cell, f"removed `%{name}` (notebook-only)")
            return [marker(f"removed `%{name} {line}`".strip() + " (notebook-only)")]
        report.warn(self.cell, f"unknown magic `%{name} {one_line(line, 50)}` removed; if the script needs it, "
                               "write it as Python in the notebook")
        return [marker(f"removed unknown magic `%{name} {line}`")]
