"""The converter's libcst helpers, shared by the analyses and the rewrite steps: parsing a cell, reading and adding a
call's arguments, the code a statement runs itself (its live calls, its blocks, whether it leaves its block), and
regrouping a block's statements (a group never spans two cells)."""
from __future__ import annotations

import ast
import functools
from typing import Callable, Sequence

import libcst as cst

from .cells import starts_cell
from .errors import ConversionError
from .walk import walk


def parse(code: str, cell=None, step=None) -> cst.Module:
    if "\x00" in code:
        line = code[:code.index("\x00")].count("\n") + 1
        raise ConversionError("the cell holds a NUL character (\\x00), which Python refuses; remove it in the notebook",
                              step=step, cell=cell, line=line)
    try:
        return cst.parse_module(code)
    except cst.ParserSyntaxError as exc:
        message, line = _python_says(code) or (exc.message, exc.raw_line)
        raise ConversionError(f"not valid Python ({message}); fix the cell in the notebook", step=step, cell=cell,
                              line=line) from None


def _python_says(code: str):
    """(message, line) of Python's own syntax error for the code (clearer than libcst's: `'(' was never closed` at
    the line that opens it), or None where Python reads it."""
    try:
        compile(code, "<cell>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as exc:
        return exc.msg, exc.lineno
    except ValueError:
        return None
    return None


def dotted(node) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def keyword(call: cst.Call, name: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def arguments(call: cst.Call, *names: str) -> list:
    """The arguments bound to these parameters, in order, by position or by keyword (None where absent)."""
    positional = [a.value for a in call.args if a.keyword is None and not a.star] + [None] * len(names)
    return [getattr(keyword(call, name), "value", positional[i]) for i, name in enumerate(names)]


def has_star_kwargs(call: cst.Call) -> bool:
    return any(arg.star == "**" for arg in call.args)


def add_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """Append `name = value` in the call's own style (spacing around `=`, one argument per line, comments kept)."""
    args = list(call.args)
    new = cst.Arg(keyword=cst.Name(name), value=value)
    if not args:
        tight = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
        return call.with_changes(args=[new.with_changes(equal=tight)])
    last = args[-1]
    keywords = [a for a in args if a.keyword is not None]
    if keywords:  # `k = v` or `k=v`, as the call's own keywords are written
        new = new.with_changes(equal=keywords[-1].equal)
    else:
        new = new.with_changes(equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                     whitespace_after=cst.SimpleWhitespace("")))
    if not isinstance(last.comma, cst.Comma):
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    else:
        # `..., last, # comment\n)`: `last` keeps its comment and takes the separator's line break;
        # the new argument takes the closing line break, without the comment.
        closing = last.comma.whitespace_after
        separator = args[-2].comma.whitespace_after if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else None
        if not isinstance(separator, cst.ParenthesizedWhitespace):  # `f(\n    a, b,\n)`: indented as the first
            separator = call.whitespace_before_args
        if isinstance(closing, cst.ParenthesizedWhitespace):
            if isinstance(separator, cst.ParenthesizedWhitespace):
                args[-1] = last.with_changes(comma=last.comma.with_changes(
                    whitespace_after=closing.with_changes(last_line=separator.last_line)))
            # the comment lines before `)` stay after `last` (once); the new argument closes the call
            new = new.with_changes(comma=last.comma.with_changes(
                whitespace_after=closing.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=())))
        else:
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            new = new.with_changes(comma=last.comma)
    args.append(new)
    return call.with_changes(args=args)


def is_if_false(node) -> bool:
    """`if False:` / `if 0:` blocks are dead code in the notebook; nbddp leaves them exactly as they are."""
    test = node.test if isinstance(node, cst.If) else None
    return (isinstance(test, cst.Name) and test.value == "False") or (isinstance(test, cst.Integer) and test.value == "0")


def name_nodes(node) -> list[cst.Name]:
    """Every Name node under `node`, in order (lambda and comprehension bodies too)."""
    found: list = []

    class _Names(cst.CSTVisitor):
        def visit_Name(self, n):
            found.append(n)

    walk(node, _Names())
    return found


class _Statements(cst.CSTVisitor):
    def __init__(self):
        self.found = []

    def on_visit(self, node):
        if isinstance(node, cst.BaseStatement):
            self.found.append(node)
        return isinstance(node, (cst.BaseStatement, cst.BaseSuite, cst.Else, cst.ExceptHandler, cst.ExceptStarHandler,
                                 cst.Finally, cst.MatchCase, cst.Module))


def statements_in(node) -> list:
    """Every statement in a node, nested ones too, in order."""
    found = _Statements()
    walk(node, found)
    return found.found


def names_in(node) -> set[str]:
    return {name.value for name in name_nodes(node)}


class LiveVisitor(cst.CSTVisitor):
    """A visitor of the code a statement runs itself: not def, class or lambda bodies, not under `if False:`."""

    def visit_FunctionDef(self, node):
        return False

    def visit_ClassDef(self, node):
        return False

    def visit_Lambda(self, node):
        return False

    def visit_If(self, node):
        return not is_if_false(node)


class _Exits(LiveVisitor):
    """A `return`, `break` or `continue` that leaves the statement's own block (not one of a nested def or loop)."""

    def __init__(self):
        self.found, self.loops = False, 0

    def visit_Return(self, node):
        self.found = True

    def visit_Break(self, node):
        self.found = self.found or not self.loops

    visit_Continue = visit_Break

    def visit_For(self, node):
        self.loops += 1

    def leave_For(self, node):
        self.loops -= 1

    visit_While, leave_While = visit_For, leave_For


def leaves_block(stmt) -> bool:
    """Whether running the statement may leave the block it stands in (`return`, or a `break`/`continue` of the
    loop around it)."""
    exits = _Exits()
    walk(stmt, exits)
    return exits.found


class _CallCollector(LiveVisitor):
    """Calls in live code."""

    def __init__(self):
        self.calls: list[cst.Call] = []

    def visit_Call(self, node):
        self.calls.append(node)


@functools.lru_cache(maxsize=4096)
def live_calls(node) -> tuple:
    """The calls in a node's live code, in order (nodes are immutable: read once per node)."""
    collector = _CallCollector()
    walk(node, collector)
    return tuple(collector.calls)


def statement_blocks(stmt, defs: bool = False) -> list[cst.IndentedBlock]:
    """The blocks of a compound statement that run at the statement's own level; with `defs`, def and class bodies
    too (they run when called)."""
    blocks = []
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return [stmt.body] if defs and isinstance(stmt.body, cst.IndentedBlock) else []
    if is_if_false(stmt):
        return blocks
    if isinstance(stmt, cst.If):
        blocks.append(stmt.body)
        orelse = stmt.orelse
        while orelse is not None:
            blocks.append(orelse.body)
            orelse = orelse.orelse if isinstance(orelse, cst.If) else None
    elif isinstance(stmt, (cst.For, cst.While, cst.With)):
        blocks.append(stmt.body)
        if getattr(stmt, "orelse", None) is not None:
            blocks.append(stmt.orelse.body)
    elif isinstance(stmt, cst.Try):
        blocks.append(stmt.body)
        blocks += [h.body for h in stmt.handlers]
        if stmt.orelse is not None:
            blocks.append(stmt.orelse.body)
        if stmt.finalbody is not None:
            blocks.append(stmt.finalbody.body)
    return [b for b in blocks if isinstance(b, cst.IndentedBlock)]


def code_of(node) -> str:
    return cst.Module([]).code_for_node(node)


def call_stmt(func: str, *args: cst.BaseExpression) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine([cst.Expr(cst.Call(func=cst.parse_expression(func), args=[cst.Arg(a) for a in args]))])


TAKE, LEAVE, DESCEND = "take", "leave", "descend"


def regroup(body: Sequence[cst.BaseStatement], select: Callable, wrap: Callable, nested: bool = False,
            origin: dict | None = None) -> list:
    """Group consecutive statements that `select` takes and replace each group with `wrap(group, nested)`.

    `select(stmt, nested)` answers TAKE, LEAVE, DESCEND (look inside the statement's own blocks instead, def and
    class bodies included), or a statement to put in its place. A group never spans two notebook cells. The first
    statement's leading comments move in front of the wrapper, so `# @title` lines and cell markers stay where they
    were. `nested`: the statements are inside a block (a loop, a function), not at the notebook's top level.
    `origin` (nbddp.meanings.Names.origin): where a statement is remade without its leading lines, the new one is
    recorded as the old (the line map and later steps follow it).
    """
    out: list = []
    group: list = []

    def flush():
        if group:
            lead, first = group[0].leading_lines, group[0]
            if lead:
                group[0] = first.with_changes(leading_lines=())
                if origin is not None:
                    origin[group[0]] = origin.get(first, first)
            wrapped = list(wrap(list(group), nested))
            made = wrapped[0]
            wrapped[0] = made.with_changes(leading_lines=tuple(lead) + tuple(made.leading_lines))
            if origin is not None and made in origin:  # the wrapper's own origin (where the plan placed it) stays
                origin[wrapped[0]] = origin[made]
            out.extend(wrapped)
            group.clear()

    for stmt in body:
        if starts_cell(stmt) is not None:
            flush()
        verdict = select(stmt, nested)
        if verdict == TAKE:
            group.append(stmt)
            continue
        flush()
        if isinstance(verdict, cst.CSTNode):
            stmt = verdict
        elif verdict == DESCEND:
            for block in statement_blocks(stmt, defs=True):
                inner = regroup(block.body, select, wrap, True, origin)
                if len(inner) != len(block.body) or any(a is not b for a, b in zip(inner, block.body)):
                    old, stmt = stmt, stmt.deep_replace(block, block.with_changes(body=inner))  # only on change
                    if origin is not None:
                        origin[stmt] = origin.get(old, old)
        out.append(stmt)
    flush()
    return out
