"""IPython's expansion of shell and magic lines (`!ls $folder`, `%cd {root}/data`, `$$` for `$`), kept in the script.

IPython expands such a line when it runs, from the names of the code that runs it; where a part cannot be evaluated
the line runs as written (`!echo $HOME` leaves `$HOME` to the shell). The script does the same at run time
(`nbddp_expand`, nbddp/runtime/ipython_forms.py). A line with nothing to expand stays a plain string, with IPython's
escapes (`$$`, `{{`) resolved. Which parts are expansions is read with IPython's own formatter (`DollarFormatter`).
"""
from __future__ import annotations

import libcst as cst

EXPAND = "nbddp_expand"
# Magics IPython runs without expanding their line (@no_var_expand)
UNEXPANDED = frozenset({"time", "timeit", "prun", "debug"})


def _parts(text: str):
    from IPython.utils.text import DollarFormatter

    return list(DollarFormatter().parse(text))


def line_expression(text: str) -> cst.BaseExpression:
    """The line as the script's value: a string, or `nbddp_expand("...")` where IPython would expand a part."""
    try:
        parts = _parts(text)
    except ValueError:  # unbalanced braces: IPython leaves such a line as written
        return cst.SimpleString(repr(text))
    fields = [field + (":" + spec if spec else "") for _, field, spec, _ in parts if field is not None]
    if not fields:
        return cst.SimpleString(repr("".join(literal for literal, _, _, _ in parts)))
    if not all(map(_is_expression, fields)):  # IPython's evaluation fails: the line runs as written
        return cst.SimpleString(repr(text))
    return cst.Call(cst.Name(EXPAND), args=[cst.Arg(cst.SimpleString(repr(text)))])


def _is_expression(text: str) -> bool:
    try:
        cst.parse_expression(text)
    except cst.ParserSyntaxError:
        return False
    return True

