"""IPython's shell under the names a notebook gives it: `ip = get_ipython()`, a method saved under a name of its own
(`run = ip.run_line_magic`), and calls whose command, line or cell the notebook computes (nbddp.transforms.ipython_calls
rewrites the rest)."""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import call_stmt, code_of
from .markers import marker
from .shell import one_line

EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
SHELL_METHODS = frozenset({"system", "getoutput", "run_line_magic", "run_cell_magic"})


def bash_cell(body, line=None) -> cst.SimpleStatementLine:
    """`nbddp_shell(body, shell='/bin/bash', args=line)`: a `%%bash` cell, its line's arguments given to the shell
    (IPython runs the cell on the shell's stdin)."""
    args = [cst.Arg(body), cst.Arg(cst.SimpleString("'/bin/bash'"), keyword=cst.Name("shell"), equal=EQUAL)]
    if line is not None:
        args.append(cst.Arg(line, keyword=cst.Name("args"), equal=EQUAL))
    return cst.SimpleStatementLine([cst.Expr(cst.Call(cst.Name("nbddp_shell"), args=args))])


def _expand(value) -> cst.Call:
    return cst.Call(cst.Name("nbddp_expand"), args=[cst.Arg(value)])


def is_shell(node, aliases=frozenset()) -> bool:
    """`get_ipython()`, or a name the notebook bound to it (`ip = get_ipython()`; nbddp.transforms.ipython_lines
    follows those assignments over the cells)."""
    return (isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "get_ipython"
            and not node.args) or (isinstance(node, cst.Name) and node.value in aliases)


def shell_aliases(module: cst.Module) -> set[str]:
    """The names a cell binds to IPython's shell at its top level: `ip = get_ipython()`."""
    return {t.target.value for stmt in module.body if isinstance(stmt, cst.SimpleStatementLine)
            for small in stmt.body if isinstance(small, cst.Assign) and is_shell(small.value)
            for t in small.targets if isinstance(t.target, cst.Name)}


def method_aliases(module: cst.Module, aliases=frozenset()) -> dict[str, str]:
    """The names a cell binds at its top level to a method of IPython's shell: `run = get_ipython().run_line_magic`,
    `sh = ip.system` -> {"run": "run_line_magic", "sh": "system"}."""
    return {t.target.value: small.value.attr.value for stmt in module.body if isinstance(stmt, cst.SimpleStatementLine)
            for small in stmt.body if isinstance(small, cst.Assign) and isinstance(small.value, cst.Attribute)
            and is_shell(small.value.value, aliases) and small.value.attr.value in SHELL_METHODS
            for t in small.targets if isinstance(t.target, cst.Name)}


class Unalias(cst.CSTTransformer):
    """`run('env', 'A=1')`, where `run = get_ipython().run_line_magic`: spelled as IPython's call, so the rest of the
    step reads it as any other; the alias's own line becomes a note (the shell is None in a script)."""

    def __init__(self, methods: dict, aliases=frozenset()):
        super().__init__()
        self.methods, self.aliases = methods, aliases

    def leave_Call(self, original, updated):
        func = updated.func
        if isinstance(func, cst.Name) and func.value in self.methods:
            shell = cst.Call(cst.Name("get_ipython"))
            return updated.with_changes(func=cst.Attribute(shell, cst.Name(self.methods[func.value])))
        return updated

    def leave_SimpleStatementLine(self, original, updated):
        found = method_aliases(cst.Module([updated]), self.aliases)
        if len(updated.body) != 1 or not found:
            return updated
        name, kind = next(iter(found.items()))
        return marker(f"`{name}` stands for get_ipython().{kind}: its calls are rewritten as IPython's").with_changes(
            leading_lines=updated.leading_lines)


def computed_call(call, report, cell):
    """An IPython call whose command, line or cell is a value the script computes (`ip.system(cmd)`,
    `run_cell_magic('writefile', path, text)` in a function): expanded when it runs, as IPython expands it there;
    a shell command, a file written. None for anything else."""
    values = [a.value for a in call.args]
    if any(a.keyword is not None or a.star for a in call.args) or not values:
        return None
    kind, name = call.func.attr.value, values[0]
    name = name.evaluated_value if isinstance(name, cst.SimpleString) and kind.startswith("run_") else None
    if kind == "system" and len(values) == 1 or kind == "run_line_magic" and name in {"system", "sx"} and \
            len(values) == 2:
        command = _expand(values[-1])
        what = "a shell command computed when the script runs, expanded there as IPython does: it runs once per " \
               "node (local rank 0), the others wait (an install in it is not listed in the header)"
        new = call_stmt("nbddp_shell", command)
    elif kind == "run_cell_magic" and name in {"writefile", "file"} and len(values) == 3:
        what = "a file whose name is computed when the script runs, expanded there as IPython does: written " \
               "once per node, the others wait"
        new = call_stmt("nbddp_write_file", _expand(values[1]), values[2])
    elif kind == "run_cell_magic" and name in {"bash", "sh"} and len(values) == 3:
        what = "a shell cell computed when the script runs, its line expanded there as IPython does: it runs " \
               "once per node (local rank 0), the others wait (an install in it is not listed in the header)"
        new = bash_cell(values[2], _expand(values[1]))
    elif kind == "run_line_magic" and name in {"env", "set_env"} and len(values) == 2:
        what = "the environment, set (or read) from a line computed when the script runs, as IPython does"
        new = call_stmt("nbddp_env", _expand(values[1]))
    elif kind == "run_line_magic" and name == "cd" and len(values) == 2:
        what = "a folder computed when the script runs, expanded there as IPython does: os.chdir on every rank"
        new = call_stmt("os.chdir", cst.Call(cst.parse_expression("os.path.expanduser"), [cst.Arg(_expand(values[1]))]))
    else:
        return None
    report.change(cell, f"`{one_line(code_of(call), 60)}`: {what}")
    return [new]
