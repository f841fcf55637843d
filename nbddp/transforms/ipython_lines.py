"""Step 1: IPython syntax (magics, `!shell` lines) becomes plain Python, or is removed with a note.

IPython's own TransformerManager finds the magics and turns them into `get_ipython().…(...)` calls, which
ipython_calls.py rewrites structurally with libcst. Cell magics are read here: installs are listed in the script
header; `%%capture [name]` keeps the cell's output out of the console, in `name` (`nbddp_capture`); `%%time` and
the like keep their Python; shell cells and `%%writefile` run once per node.
"""
from __future__ import annotations

import shlex

import libcst as cst

from ..cells import cell_number
from ..cst_helpers import code_of, live_calls, names_in, parse, statement_blocks
from ..errors import ConversionError
from .base import Context, Transform
from .expansion import line_expression
from .ipython_calls import IPythonCalls
from .ipython_names import EQUAL, Unalias, bash_cell, method_aliases, shell_aliases
from .markers import MARK, Tidy, is_marker
from .shell import OWN_PROCESS, install_lines, is_launch, launch_inside, one_line, runs_python, script_lines

BODY_MAGICS = frozenset({"time", "timeit", "prun", "debug", "memit", "ipytest"})
CAPTURE_FLAGS = {"--no-stdout": "stdout", "--no-stderr": "stderr", "--no-display": "display"}
SHELL_CELL_MAGICS = frozenset({"bash", "sh", "shell", "system", "sx"})
DISPLAY_CELL_MAGICS = frozenset({"html", "HTML", "markdown", "md", "javascript", "js", "latex", "svg", "perl", "ruby"})
FILE_MAGICS = frozenset({"writefile", "file"})


def ipython_to_python(source: str) -> str:
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


def leading_comments(source: str) -> tuple[str, str]:
    """Split off `#@title`-style comment lines that stand before a `%%magic` line (Colab allows that)."""
    lines = source.splitlines(keepends=True)
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            if i and stripped.startswith("%%"):
                return "".join(lines[:i]), "".join(lines[i:])
            break
    return "", source


def _calls_left(module, aliases) -> bool:
    """What the rewrite left of IPython's shell (None in a script): a call of get_ipython() but in `ip =
    get_ipython()`, or a use of such a name."""
    saved = [s.value for stmt in module.body if isinstance(stmt, cst.SimpleStatementLine) for s in stmt.body
             if isinstance(s, cst.Assign) and isinstance(s.value, cst.Call) and code_of(s.value) == "get_ipython()"]
    calls = [c for c in live_calls(module) if code_of(c.func) == "get_ipython" and c not in saved]
    return bool(calls) or bool(_used_names(module) & aliases - shell_aliases(module))


def _used_names(module) -> set[str]:
    """The names the code uses as values (not a keyword's name, `shell=`, nor an attribute's, `x.shell`)."""
    found: set[str] = set()

    class _Used(cst.CSTVisitor):
        def visit_Name(self, node):
            found.add(node.value)

        def visit_Arg(self, node):
            node.value.visit(self)
            return False

        def visit_Attribute(self, node):
            node.value.visit(self)
            return False

    module.visit(_Used())
    return found


class Magics(Transform):
    name = "magics"
    inserts = ("nbddp_shell", "nbddp_write_file", "nbddp_getoutput", "nbddp_time", "nbddp_run_file", "nbddp_capture",
               "nbddp_expand", "nbddp_env")
    installs = 0  # install commands removed so far

    def __init__(self):
        self.aliases: set[str] = set()  # names the notebook bound to get_ipython(), so far
        self.methods: dict = {}  # names it bound to a method of it -> the method (`run = ip.run_line_magic`)

    def preprocess_cell(self, cell, ctx):
        cell.source = self.convert(cell.source, cell_number(cell), ctx)
        return cell

    def convert(self, source: str, cell: int, ctx: Context, offset: int = 0) -> str:
        """The cell's text as Python; `offset`: lines of the cell above `source` (a cell magic's own line)."""
        header, rest = leading_comments(source)
        if rest.lstrip().startswith("%%"):
            return header + self._cell_magic(rest.lstrip(), cell, ctx)
        if "get_ipython" not in source and not self.aliases and not self.methods and _is_python(source):
            return source  # no IPython syntax: every magic and `!` line is a Python syntax error
        try:
            python = ipython_to_python(source)
        except SyntaxError as exc:
            raise ConversionError(f"IPython cannot read it ({exc.msg})", step=self.name, cell=cell,
                                  line=exc.lineno and exc.lineno + offset)
        module = parse(python, cell=cell, step=self.name)  # not Python even for IPython: say so here
        self.aliases |= shell_aliases(module)  # `ip = get_ipython()`: its calls are IPython's, in later cells too
        self.methods.update(method_aliases(module, self.aliases))  # `run = ip.run_line_magic`, likewise
        if "get_ipython" not in python and not names_in(module) & (self.aliases | set(self.methods)):
            return source
        if self.methods:
            module = module.visit(Unalias(self.methods, frozenset(self.aliases)))
        calls = IPythonCalls(cell, ctx, self.name, offset, frozenset(self.aliases),
                             lambda text: self._cell_magic(text, cell, ctx))
        new = calls.rewrite(module).visit(Tidy())
        self.installs += calls.installs
        if calls.installs:
            ctx.report.change(cell, f"removed {calls.installs} install command(s); they are listed in the header")
        if _calls_left(new, self.aliases):
            ctx.report.warn(cell, "the cell calls get_ipython() itself; in a script it returns None (no IPython): "
                            "rewrite that part (nbddp_shell(...) runs a shell command once per node)")
        return new.code

    def _capture(self, line: str, body: str, cell: int, ctx: Context) -> str:
        """`%%capture [--no-stdout] [--no-stderr] [--no-display] [name]`: the cell's Python inside
        `with nbddp_capture(...) as name:`. Without a name, an install cell's (its installs are removed: what is left
        serves them) and a cell's that calls nothing are dropped."""
        words = line.split()
        unknown = [w for w in words if w.startswith("-") and w not in CAPTURE_FLAGS]
        names = [w for w in words if not w.startswith("-")]
        if unknown or len(names) > 1 or (names and not names[0].isidentifier()):
            raise ConversionError(f"`%%capture {line}`: IPython takes `%%capture [--no-stdout] [--no-stderr] "
                                  "[--no-display] [name]`; fix the line in the notebook", step=self.name, cell=cell,
                                  line=1)
        installs = self.installs
        code = self.convert(body, cell, ctx, offset=1)
        module = parse(code, cell=cell, step=self.name)
        mark = MARK + f"%%capture {line}".rstrip()
        if not names and (self.installs > installs or not any(map(_runs_something, module.body))):
            ctx.report.change(cell, "`%%capture` dropped (it hid the cell's installs, or the cell shows nothing); its "
                                    "Python is kept")
            return mark + " dropped; the cell's code is kept\n" + code
        kwargs = ", ".join(f"{CAPTURE_FLAGS[w]}=False" for w in dict.fromkeys(words) if w in CAPTURE_FLAGS)
        with_ = cst.parse_statement(f"with nbddp_capture({kwargs}){' as ' + names[0] if names else ''}:\n    pass\n")
        statements = list(module.body) or [cst.SimpleStatementLine([cst.Pass()])]
        statements[0] = statements[0].with_changes(leading_lines=(*module.header, *statements[0].leading_lines))
        with_ = with_.with_changes(body=with_.body.with_changes(body=statements, footer=module.footer))
        kept = f" kept in `{names[0]}`" if names else " kept out of the console, as in the notebook"
        ctx.report.change(cell, f"`%%capture {line}`".replace(" `", "`") + f": the cell's output{kept}")
        return mark + f": the cell's output{kept}\n" + cst.Module([with_]).code

    def _cell_magic(self, source: str, cell: int, ctx: Context) -> str:
        first, _, body = source.partition("\n")
        words = first[2:].split(None, 1)
        name = words[0] if words else ""
        line = words[1] if len(words) > 1 else ""
        report = ctx.report
        if name == "script" and line.split()[:1] and line.split()[0] in {"bash", "sh"}:
            name, line = "bash", (line.split(None, 1) + [""])[1]
        if name == "capture":
            return self._capture(line, body, cell, ctx)
        if name in BODY_MAGICS:
            report.change(cell, f"`%%{name}` removed; its Python is kept")
            # (never "# %%…" at a line start: editors read that as a new cell; the script marks cells "# %% cell N")
            kept = self.convert(body, cell, ctx, offset=1)
            return MARK + f"%%{name} {line}".rstrip() + " dropped; the cell's code is kept\n" + kept
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
            args = [cst.Arg(line_expression(path)), cst.Arg(cst.SimpleString(repr(body)))]
            if append:
                args.append(cst.Arg(cst.Name("True"), keyword=cst.Name("append"), equal=EQUAL))
            call = cst.SimpleStatementLine([cst.Expr(cst.Call(cst.Name("nbddp_write_file"), args=args))])
            return MARK + f"%%{name} {line}\n" + cst.Module([call]).code
        if name in SHELL_CELL_MAGICS:
            installs = install_lines(body)
            if installs:
                for command in installs:
                    report.install(command)
                report.change(cell, f"removed the `%%{name}` install cell ({len(installs)} install commands; see the "
                                    "header)")
                others = len(script_lines(body)) - len(installs)
                if others:
                    report.warn(cell, f"the `%%{name}` install cell also runs {others} other shell line(s) the installs "
                                "may need (variables, checks); run the whole cell before launching, not just the header's list",
                                line=1)
                return f"# nbddp: removed a %%{name} install cell; run it before launching (see the header)\n"
            launch = next((n for n, line in enumerate(body.splitlines(), start=2) if is_launch(line)), None)
            if launch is not None:
                raise ConversionError(launch_inside(f"%%{name}"), step=self.name, cell=cell, line=launch)
            report.change(cell, f"`%%{name}` cell runs once per node (local rank 0), the others wait")
            for command in filter(runs_python, script_lines(body)):
                report.change(cell, f"`{one_line(command, 60)}` {OWN_PROCESS}")
            call = bash_cell(cst.SimpleString(repr(body)), line_expression(line.strip()) if line.strip() else None)
            return MARK + f"%%{name} {line}".rstrip() + "\n" + cst.Module([call]).code
        if name in DISPLAY_CELL_MAGICS:
            report.change(cell, f"removed the `%%{name}` display cell")
            return f"# nbddp: removed a %%{name} cell (display only)\n"
        report.warn(cell, f"unknown cell magic `%%{name}`: cell removed; if the script needs it, write it as Python in "
                          "the notebook", line=1)
        return f"# nbddp: removed a cell with the unknown magic %%{name}\n"


def _runs_something(stmt) -> bool:
    """A statement that may show output: a line that calls something, or a block holding one (an `if` whose
    branches only held installs, now removed, shows nothing)."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return not is_marker(stmt) and bool(live_calls(stmt))
    return any(_runs_something(s) for block in statement_blocks(stmt) for s in block.body)
