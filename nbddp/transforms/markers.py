"""`pass  # nbddp: …` markers: what stands for code a step removed, kept as `pass` only where a block would be empty."""
from __future__ import annotations

import libcst as cst

from .shell import one_line

MARK = "# nbddp: "


def marker(text: str) -> cst.SimpleStatementLine:
    """`pass  # nbddp: …`: stands for removed code; turned into a plain comment wherever a block has other code."""
    comment = cst.Comment(MARK + one_line(text, 110))
    return cst.SimpleStatementLine(
        [cst.Pass()],
        trailing_whitespace=cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "), comment=comment),
    )


def is_marker(stmt) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Pass)
        and stmt.trailing_whitespace.comment is not None
        and stmt.trailing_whitespace.comment.value.startswith(MARK)
    )


class Tidy(cst.CSTTransformer):
    """Markers stay as `pass` only where a block would otherwise be empty; elsewhere they become comments.
    `only`: tidy just these markers (a later step's own), not those the magics step left."""

    def __init__(self, only=None):
        super().__init__()
        self.only = only

    def _mine(self, stmt) -> bool:
        return is_marker(stmt) and (self.only is None or stmt in self.only)

    def _tidy(self, body, footer, originals):
        mine = [self._mine(s) for s in originals]
        if all(is_marker(s) for s in body) or not any(mine):
            return body, footer
        out, pending = [], []
        for stmt, marked in zip(body, mine):
            if marked:
                pending += list(stmt.leading_lines) + [cst.EmptyLine(comment=stmt.trailing_whitespace.comment)]
                continue
            if pending:
                stmt = stmt.with_changes(leading_lines=tuple(pending) + tuple(stmt.leading_lines))
                pending = []
            out.append(stmt)
        return out, tuple(pending) + tuple(footer)

    def leave_IndentedBlock(self, original, updated):
        body, footer = self._tidy(list(updated.body), updated.footer, original.body)
        return updated.with_changes(body=body, footer=footer)

    def leave_Module(self, original, updated):
        body, footer = self._tidy(list(updated.body), updated.footer, original.body)
        return updated.with_changes(body=body, footer=footer)
