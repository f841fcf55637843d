"""A read-only walk of a libcst tree for the analyses' visitors: `walk(node, visitor)` calls the visitor's `on_visit`
and `on_leave` (so its `visit_X` and `leave_X`) on the same nodes, in the same order, as `node.visit(visitor)`, but
skips the whitespace, comments, commas and brackets (no analysis reads them) and builds no new node (libcst's visit
rebuilds every node it passes, which is most of an analysis' time). Attribute visitors (`visit_Call_func`) are not
called. Transformers and visitors that read comments use libcst's own `visit`.

Each node class's child fields, in the order libcst visits them, are learnt from the first node of the class met:
libcst's own traversal of it, with a visitor that records the fields and goes no deeper."""
from __future__ import annotations

import dataclasses

import libcst as cst

_TRIVIA = (cst.BaseParenthesizableWhitespace, cst.EmptyLine, cst.TrailingWhitespace, cst.Newline, cst.Comment,
           cst.Comma, cst.Semicolon, cst.Colon, cst.Dot, cst.AssignEqual, cst.LeftParen, cst.RightParen,
           cst.LeftSquareBracket, cst.RightSquareBracket, cst.LeftCurlyBrace, cst.RightCurlyBrace)
_READ: dict = {str: False, type(None): False, cst.MaybeSentinel: False}  # class -> whether walk goes into its values
_FIELDS: dict = {}  # node class -> its fields that may hold nodes an analysis reads, in libcst's order


class _Fields(cst.CSTVisitor):
    def __init__(self, node):
        self.node, self.fields = node, []

    def on_visit(self, node):
        return False

    def on_visit_attribute(self, node, attribute):
        if node is self.node and attribute not in self.fields:
            self.fields.append(attribute)


def _fields(node) -> tuple:
    kind = type(node)
    if kind not in _FIELDS:
        recorder = _Fields(node)
        node._visit_and_replace_children(recorder)
        rest = [f.name for f in dataclasses.fields(node) if f.name not in recorder.fields]  # visited only when set
        _FIELDS[kind] = tuple(name for name in recorder.fields + rest if not name.startswith("whitespace")
                              and name not in ("lpar", "rpar", "leading_lines", "lines_after_decorators", "header",
                                               "footer", "trailing_whitespace", "comma", "semicolon"))
    return _FIELDS[kind]


def walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """`node.visit(visitor)` for a visitor that only reads (see the module's docstring). Classes are compared by
    identity: isinstance on libcst's abstract node classes costs a call each time."""
    if visitor.on_visit(node):
        fields = _FIELDS.get(type(node))
        for name in fields if fields is not None else _fields(node):
            value = getattr(node, name)
            kind = type(value)
            if kind is tuple or kind is list:
                for child in value:
                    read = _READ.get(type(child))
                    if read or (read is None and _learn(child)):
                        walk(child, visitor)
            else:
                read = _READ.get(kind)
                if read or (read is None and _learn(value)):
                    walk(value, visitor)
    visitor.on_leave(node)


def _learn(value) -> bool:
    """Whether values of this one's class are nodes an analysis reads (not trivia, not a string): learnt once."""
    _READ[type(value)] = isinstance(value, cst.CSTNode) and not isinstance(value, _TRIVIA)
    return _READ[type(value)]


def scopes(module: cst.Module) -> dict:
    """libcst's ScopeProvider metadata of a module (node -> its Scope), computed by libcst's own visitors of it
    (expression contexts, then scopes) over `walk`: `MetadataWrapper(module).resolve(ScopeProvider)` gives the same
    for every node an analysis reads, at about a quarter of the cost (the wrapper's batched passes visit the whole
    tree twice more, each pass rebuilding every node). Where this libcst lacks those visitors, the wrapper's."""
    try:
        from libcst.metadata.expression_context_provider import (ExpressionContext, ExpressionContextProvider,
                                                                 ExpressionContextVisitor)
        from libcst.metadata.scope_provider import ScopeProvider, ScopeVisitor
        contexts = ExpressionContextProvider()
        walk(module, ExpressionContextVisitor(contexts, ExpressionContext.LOAD))
        provider = ScopeProvider()
        provider.metadata = {ExpressionContextProvider: contexts._computed}
        visitor = ScopeVisitor(provider)
        walk(module, visitor)
        visitor.infer_accesses()
        return provider._computed
    except (ImportError, AttributeError, TypeError):
        from libcst.metadata import MetadataWrapper, ScopeProvider
        return dict(MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider))
