"""Step 1: IPython syntax (magics, `!shell` lines) becomes plain Python, or is removed with a note.

IPython's own TransformerManager finds the magics and turns them into `get_ipython().…(...)` calls; we then
rewrite those calls structurally with libcst. Installs are listed in the script header, `%%capture` keeps its
Python, `%env`/`%cd` become os calls, other shell commands and `%%writefile` run once per node.
"""
from __future__ import annotations

import shlex

import libcst as cst

from ..cst import call_stmt, code_of, names_in, parse
from ..errors import ConversionError
from .base import Context, Transform, cell_number
from .markers import MARK, Tidy, marker
from .shell import install_lines, is_install, one_line, script_lines

DROP_QUIETLY = frozenset({
    "matplotlib", "load_ext", "reload_ext", "unload_ext", "autoreload", "aimport", "config", "pinfo", "pinfo2",
    "pdef", "pdoc", "psource", "pfile", "who", "who_ls", "whos", "xmode", "precision", "colors", "clear", "lsmagic",
    "history", "page", "pwd", "ls", "pylab", "notebook", "tensorflow_version", "reset", "reset_selective",
    "rehashx", "alias", "unalias", "bookmark", "dhist", "dirs", "env_list", "magic", "quickref", "doctest_mode",
    "autocall", "automagic", "qtconsole", "connect_info", "store", "recall", "rerun", "save", "logstart", "logstop",
    "logon", "logoff", "logstate", "pprint", "sc", "cat", "more", "less", "man", "nbdev_export",
})
INSTALL_MAGICS = frozenset({"pip", "conda", "mamba", "uv", "micromamba"})
BODY_MAGICS = frozenset({"capture", "time", "timeit", "prun", "debug", "memit", "ipytest"})
SHELL_CELL_MAGICS = frozenset({"bash", "sh", "shell", "system", "sx"})
DISPLAY_CELL_MAGICS = frozenset({"html", "HTML", "markdown", "md", "javascript", "js", "latex", "svg", "perl", "ruby"})
FILE_MAGICS = frozenset({"writefile", "file"})



def _ipython_to_python(source: str) -> str:
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(source)


def _is_python(source: str) -> bool:
    import ast
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "invalid escape sequence": the notebook's business
            ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def _leading_comments(source: str) -> tuple[str, str]:
    """Split off `#@title`-style comment lines that stand before a `%%magic` line (Colab allows that)."""
    lines = source.splitlines(keepends=True)
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            if i and stripped.startswith("%%"):
                return "".join(lines[:i]), "".join(lines[i:])
            break
    return "", source


def _command_literal(command: str) -> cst.BaseExpression:
    """The command as a string; with `{expr}` parts, an f-string, as IPython expands them from the namespace."""
    if "{" in command:
        try:
            return cst.parse_expression("f" + repr(command))
        except cst.ParserSyntaxError:
            pass
    return cst.SimpleString(repr(command))


def _stmt(text: str) -> cst.BaseStatement:
    return cst.parse_statement(text + "\n")


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


def is_ipython_call(node) -> bool:
    """`get_ipython().<something>(...)`, as IPython's transformers write it (libcst.matchers is slow to import)."""
    func = node.func if isinstance(node, cst.Call) else None
    owner = func.value if isinstance(func, cst.Attribute) else None
    return (isinstance(owner, cst.Call) and isinstance(owner.func, cst.Name) and owner.func.value == "get_ipython")


class _IPythonCalls(cst.CSTTransformer):
    """Rewrites the `get_ipython().system/run_line_magic/getoutput(...)` calls IPython's transformers produce."""

    def __init__(self, cell: int, ctx: Context):
        self.cell, self.ctx = cell, ctx
        self.installs = 0

    @staticmethod
    def _whole_line(node) -> bool:
        return len(node.body) == 1 and isinstance(node.body[0], cst.Expr) and is_ipython_call(node.body[0].value)

    def visit_SimpleStatementLine(self, node):
        return not self._whole_line(node)  # whole-line calls are replaced below, not visited as expressions

    # A whole statement line that is one IPython call: replace the line.
    def leave_SimpleStatementLine(self, original, updated):
        if not self._whole_line(updated):
            return updated
        call = updated.body[0].value
        kind = call.func.attr.value
        args = _literal_args(call)
        if args is None:
            self.ctx.report.warn(self.cell, f"could not read IPython call {one_line(code_of(call))}; removed it")
            return marker("removed an IPython call it could not read")
        if kind in {"system", "getoutput"}:
            new = self._shell(args[0])
        elif kind == "run_line_magic":
            new = self._line_magic(args[0], args[1] if len(args) > 1 else "")
        else:
            self.ctx.report.warn(self.cell, f"removed get_ipython().{kind}(...), which has no script equivalent")
            new = [marker(f"removed get_ipython().{kind}(...)")]
        new = list(new)
        new[0] = new[0].with_changes(leading_lines=updated.leading_lines)
        return cst.FlattenSentinel(new)

    # An IPython call inside an expression: `files = !ls` → getoutput.
    def leave_Call(self, original, updated):
        if not is_ipython_call(updated):
            return updated
        kind = updated.func.attr.value
        args = _literal_args(updated)
        if kind == "getoutput" and args:
            self.ctx.report.change(self.cell, f"`!{one_line(args[0], 60)}` output captured with a subprocess")
            return cst.Call(cst.Name("nbddp_getoutput"), args=[cst.Arg(_command_literal(args[0]))])
        self.ctx.report.warn(self.cell, f"an IPython call inside an expression ({kind}) was replaced by None")
        return cst.Name("None")

    def _shell(self, command: str):
        if is_install(command):
            self.ctx.report.install(command)
            self.installs += 1
            return [marker(f"removed `!{command}` (install; see the header)")]
        self.ctx.report.change(self.cell, f"`!{one_line(command, 60)}` runs once per node (local rank 0), the others wait")
        return [call_stmt("nbddp_shell", _command_literal(command))]

    def _line_magic(self, name: str, line: str):
        report = self.ctx.report
        if name in INSTALL_MAGICS:
            command = f"{name} {line}".strip()
            report.install(command)
            self.installs += 1
            return [marker(f"removed `%{command}` (install; see the header)")]
        if name in {"env", "set_env"}:
            key, sep, value = line.partition("=") if "=" in line else line.partition(" ")
            key, value = key.strip(), value.strip()
            if key and sep:
                report.change(self.cell, f"`%{name} {one_line(line, 50)}` → os.environ")
                if " #" in value:
                    report.warn(self.cell, f"`%{name}` sets {key} to {value!r}, comment included (IPython does the "
                                "same); drop the comment in the notebook if the value is meant to be "
                                f"{value.split(' #')[0].strip()!r}")
                return [_stmt(f"os.environ[{key!r}] = {value!r}")]
            return [marker(f"removed `%{name} {line}` (only displays)")]
        if name == "cd":
            report.change(self.cell, f"`%cd {line}` → os.chdir")
            return [_stmt(f"os.chdir(os.path.expanduser({line.strip().strip(chr(34) + chr(39))!r}))")]
        if name in {"time", "timeit", "prun", "memit"}:
            try:
                return list(parse(line + "\n").body) or [marker(f"removed empty `%{name}`")]
            except ConversionError:
                report.warn(self.cell, f"`%{name} {one_line(line, 50)}` is not Python; removed it")
                return [marker(f"removed `%{name} {line}`")]
        if name in {"sx", "system"}:
            return self._shell(line)
        if name in DROP_QUIETLY:
            report.change(self.cell, f"removed `%{name}` (notebook-only)")
            return [marker(f"removed `%{name} {line}`".strip() + " (notebook-only)")]
        report.warn(self.cell, f"unknown magic `%{name} {one_line(line, 50)}` removed; check the script does not need it")
        return [marker(f"removed unknown magic `%{name} {line}`")]


class Magics(Transform):
    name = "magics"

    def preprocess_cell(self, cell, ctx):
        cell.source = self.convert(cell.source, cell_number(cell), ctx)
        return cell

    def convert(self, source: str, cell: int, ctx: Context) -> str:
        header, rest = _leading_comments(source)
        if rest.lstrip().startswith("%%"):
            return header + self._cell_magic(rest.lstrip(), cell, ctx)
        if "get_ipython" not in source and _is_python(source):
            return source  # no IPython syntax: every magic and `!` line is a Python syntax error
        try:
            python = _ipython_to_python(source)
        except SyntaxError as exc:
            raise ConversionError(f"IPython cannot read it ({exc.msg})", step=self.name, cell=cell, line=exc.lineno)
        module = parse(python, cell=cell, step=self.name)  # not Python even for IPython: say so here
        if "get_ipython" not in python:
            return source
        calls = _IPythonCalls(cell, ctx)
        new = module.visit(calls).visit(Tidy())
        if calls.installs:
            ctx.report.change(cell, f"removed {calls.installs} install command(s); they are listed in the header")
        if "get_ipython" in names_in(new):
            ctx.report.warn(cell, "the cell calls get_ipython() itself; a script has no IPython: rewrite that part "
                            "(nbddp_shell(...) runs a shell command once per node)")
        return new.code

    def _cell_magic(self, source: str, cell: int, ctx: Context) -> str:
        first, _, body = source.partition("\n")
        words = first[2:].split(None, 1)
        name = words[0] if words else ""
        line = words[1] if len(words) > 1 else ""
        report = ctx.report
        if name == "script" and line.split()[:1] and line.split()[0] in {"bash", "sh"}:
            name, line = "bash", ""
        if name in BODY_MAGICS:
            report.change(cell, f"`%%{name}` removed; its Python is kept")
            # (never "# %%…" at a line start: editors read that as a new cell; the script marks cells "# %% cell N")
            return MARK + f"%%{name} {line}".rstrip() + " dropped; the cell's code is kept\n" + self.convert(body, cell, ctx)
        if name in FILE_MAGICS:
            try:
                args = shlex.split(line)  # IPython reads `%%writefile "my file.py"` the same way
            except ValueError:
                args = line.split()
            append = "-a" in args or "--append" in args
            paths = [a for a in args if not a.startswith("-")]
            if not paths:
                raise ConversionError(f"`%%{name}` without a file name", step=self.name, cell=cell, line=1)
            path = paths[0].strip("\"'")
            report.change(cell, f"`%%{name} {path}` → file written once per node, the others wait")
            call = _stmt(f"nbddp_write_file({path!r}, {body!r}{', append=True' if append else ''})")
            return MARK + f"%%{name} {line}\n" + cst.Module([call]).code
        if name in SHELL_CELL_MAGICS:
            installs = install_lines(body)
            if installs:
                for command in installs:
                    report.install(command)
                report.change(cell, f"removed the `%%{name}` install cell ({len(installs)} install commands; see the header)")
                others = len(script_lines(body)) - len(installs)
                if others:
                    report.warn(cell, f"the `%%{name}` install cell also runs {others} other shell line(s) the installs "
                                "may need (variables, checks); run the whole cell before launching, not just the header's list",
                                line=1)
                return f"# nbddp: removed a %%{name} install cell; run it before launching (see the header)\n"
            report.change(cell, f"`%%{name}` cell runs once per node (local rank 0), the others wait")
            return MARK + f"%%{name}\n" + cst.Module([_stmt(f"nbddp_shell({body!r}, shell='/bin/bash')")]).code
        if name in DISPLAY_CELL_MAGICS:
            report.change(cell, f"removed the `%%{name}` display cell")
            return f"# nbddp: removed a %%{name} cell (display only)\n"
        report.warn(cell, f"unknown cell magic `%%{name}`: cell removed; check the script does not need it", line=1)
        return f"# nbddp: removed a cell with the unknown magic %%{name}\n"
