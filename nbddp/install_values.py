"""The notebook's install commands with its own string variables put in: `!pip install {_vllm} {_numpy}` after
`_vllm = "vllm==0.11.2" if is_t4 else "vllm==0.15.1"` and `_numpy = "numpy"`. A variable is read from the notebook's
top-level assignments (inside `if`, `try` and `with` blocks too, never inside functions): string literals, f-strings
and `+` of those, conditional expressions (each branch a value), tuples unpacked into names. Where a variable has
several values the command is listed once per value (at most MAX_LINES lines, else its placeholder stays); a value
nbddp cannot read (a version read at run time: `f"numpy=={numpy.__version__}"`) is left out where another value of
the same variable is known, and the placeholder stays where none is.

    expand(commands, module) -> the commands, placeholders put in where the notebook binds them to strings
"""
from __future__ import annotations

import itertools
import re

import libcst as cst

from .bindings import Assignments
from .walk import walk

MAX_LINES, MAX_VALUES, MAX_DEPTH = 4, 4, 6
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")  # IPython's {name} and $name


class _Assignments(Assignments):
    """name -> the expressions the notebook's top level assigns it (tuple targets paired with tuple values)."""

    starred = False  # `*rest` holds a list, never a string

    def __init__(self):
        self.found: dict = {}

    def visit_FunctionDef(self, node):
        return False

    visit_ClassDef = visit_Lambda = visit_FunctionDef

    def bind(self, name, value):
        self.found.setdefault(name.value, []).append(value)

    def element(self, value, index):
        return _Item(value, index)


class _Item:
    """The i-th element of a tuple value (through conditional expressions)."""

    def __init__(self, value, index):
        self.value, self.index = value, index


def _values(expr, names, depth=0) -> list | None:
    """The strings an expression may be, or None where one part cannot be read."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(expr, _Item):
        value = expr.value
        if isinstance(value, cst.IfExp):
            return _merge(_values(_Item(value.body, expr.index), names, depth + 1),
                          _values(_Item(value.orelse, expr.index), names, depth + 1))
        if isinstance(value, (cst.Tuple, cst.List)) and expr.index < len(value.elements):
            return _values(value.elements[expr.index].value, names, depth + 1)
        return None
    if isinstance(expr, (cst.SimpleString, cst.ConcatenatedString)):
        value = expr.evaluated_value
        return [value] if isinstance(value, str) else None
    if isinstance(expr, cst.IfExp):
        return _merge(_values(expr.body, names, depth + 1), _values(expr.orelse, names, depth + 1))
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
        return _join([_values(expr.left, names, depth + 1), _values(expr.right, names, depth + 1)])
    if isinstance(expr, cst.FormattedString):
        pieces = []
        for part in expr.parts:
            if isinstance(part, cst.FormattedStringText):
                pieces.append([part.value])
            elif part.conversion is None and part.format_spec is None:
                pieces.append(_values(part.expression, names, depth + 1))
            else:
                return None
        return _join(pieces)
    if isinstance(expr, cst.Name):
        return _name(expr.value, names, depth + 1)
    return None


def _name(name, names, depth) -> list | None:
    """Every value the notebook gives the name that nbddp can read; None where it can read none."""
    found = [v for expr in names.get(name, ()) for v in (_values(expr, names, depth) or ())]
    return list(dict.fromkeys(found))[:MAX_VALUES] or None


def _merge(a, b):
    return None if a is None and b is None else list(dict.fromkeys((a or []) + (b or [])))


def _join(pieces):
    if any(p is None for p in pieces):
        return None
    return list(dict.fromkeys("".join(combo) for combo in itertools.product(*pieces)))[:MAX_VALUES]


def expand(commands, module: cst.Module) -> list:
    if not has_placeholders(commands):
        return list(commands)
    assignments = _Assignments()
    walk(module, assignments)
    names = assignments.found
    out = []
    for command in commands:
        used = list(dict.fromkeys(a or b for a, b in _PLACEHOLDER.findall(command)))
        values = {name: _name(name, names, 0) for name in used}
        chosen = {name: found[0] for name, found in values.items() if found and len(found) == 1}
        several = [name for name, found in values.items() if found and len(found) > 1]
        combos = list(itertools.product(*(values[name] for name in several)))
        if len(combos) > MAX_LINES:  # too many branches to list: those placeholders stay
            several, combos = [], [()]
        for combo in combos:
            given = {**chosen, **dict(zip(several, combo))}
            line = _PLACEHOLDER.sub(lambda m: given.get(m.group(1) or m.group(2), m.group(0)), command)
            if line not in out:
                out.append(line)
    return out


def has_placeholders(commands) -> bool:
    return any(_PLACEHOLDER.search(command) for command in commands)
