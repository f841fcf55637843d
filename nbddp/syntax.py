"""Syntax a newer Python accepts than the one converting: found on the libcst tree (libcst reads it whatever Python
runs it), so a notebook written on Colab's Python 3.12 converts on 3.11 with a report line instead of an error.

What is found, and the Python it needs:
- 3.12 (PEP 701): an f-string whose replacement fields hold a string in the f-string's own quote character, a
  backslash, or a comment; (PEP 695) `type X = ...` and type parameters `def f[T]`, `class C[T]`.
"""
from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .cst_helpers import code_of


def _quote(node) -> str:
    """The quote characters of a string literal or f-string: `"`, `'`, `\"\"\"` or `'''`."""
    text = node.start if isinstance(node, cst.FormattedString) else node.value
    body = text.lstrip("rRbBuUfF")
    return body[:3] if body[:3] in ('"""', "'''") else body[:1]


class _Newer(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self):
        self.found: list[tuple[range, tuple[int, int], str]] = []  # (lines, version, what)

    def _add(self, node, version, what):
        where = self.get_metadata(PositionProvider, node)
        self.found.append((range(where.start.line, where.end.line + 1), version, what))

    def visit_FormattedString(self, node):
        quote = _quote(node)
        for part in node.parts:
            if not isinstance(part, cst.FormattedStringExpression):
                continue
            inner = code_of(part.expression)
            strings = _Strings()
            part.expression.visit(strings)
            if len(quote) == 1 and any(_quote(s) in (quote, quote * 3) for s in strings.found):
                self._add(node, (3, 12), f"an f-string that reuses its quote {quote} inside {{...}}")
            elif "\\" in inner or _has_comment(part.expression):
                self._add(node, (3, 12), "an f-string with a backslash or comment inside {...}")

    def visit_TypeAlias(self, node):
        self._add(node, (3, 12), "a `type` alias statement")

    def visit_TypeParameters(self, node):
        self._add(node, (3, 12), "type parameters ([T])")


class _Strings(cst.CSTVisitor):
    def __init__(self):
        self.found = []

    def visit_SimpleString(self, node):
        self.found.append(node)

    def visit_FormattedString(self, node):
        self.found.append(node)


def _has_comment(node) -> bool:
    comments = []

    class _Comments(cst.CSTVisitor):
        def visit_Comment(self, comment):
            comments.append(comment)

    node.visit(_Comments())
    return bool(comments)


def newer_syntax(module: cst.Module) -> list[tuple[range, tuple[int, int], str]]:
    """(its lines, the Python version it needs, what) for each construct of `module` that needs Python 3.12 or newer."""
    visitor = _Newer()
    MetadataWrapper(module, unsafe_skip_copy=True).visit(visitor)
    return visitor.found
