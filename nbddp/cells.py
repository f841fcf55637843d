"""Which notebook cell a piece of code comes from: the number each code cell carries, and the `# %% cell N` markers
that the notebook's tree (nbddp.tree) and the generated script hold before each cell."""
from __future__ import annotations

import bisect

MARKER = "# %% cell "
LINES = "# nbddp lines: "  # a script's last comment: `cell:line=line` where a converted cell's line is another line of
# the notebook's cell (guards and helpers nbddp added shift the lines after them)


def cell_number(cell) -> int:
    """The cell's 1-based position in the original notebook (markdown cells included), as the code-cells step
    (nbddp.pipeline.CodeCells) tags it."""
    return cell.metadata["nbddp"]["cell"]


def marker_number(line) -> int | None:
    """N of a `# %% cell N` line of the tree (a libcst EmptyLine), else None."""
    comment = line.comment.value if line.comment is not None else ""
    return int(comment[len(MARKER):]) if comment.startswith(MARKER) and comment[len(MARKER):].isdigit() else None


def starts_cell(stmt) -> int | None:
    """The number of the last cell that starts at this statement of the tree, or None."""
    numbers = [n for n in map(marker_number, getattr(stmt, "leading_lines", ())) if n is not None]
    return numbers[-1] if numbers else None


def cell_starts(lines) -> list[tuple[int, str]]:
    """(1-based line of the marker, cell number) for each cell of a script's lines."""
    return [(i + 1, line.strip()[len(MARKER):]) for i, line in enumerate(lines) if line.strip().startswith(MARKER)]


def cell_at(lines, number: int):
    """(cell, line in the cell) for script line `number`, or None before the first cell: the line as the notebook's
    cell numbers it where the script carries its line map (`# nbddp lines:`), else the converted cell's line."""
    return CellIndex(lines).at(number)


class CellIndex:
    """cell_at for many lines of one script: its cells' starts and its line map read once."""

    def __init__(self, lines):
        starts = cell_starts(lines)
        self.lines, self.cells = [start for start, _ in starts], [cell for _, cell in starts]
        shifted = next((line[len(LINES):] for line in reversed(lines[-3:]) if line.startswith(LINES)), "")
        self.moves = dict(entry.split("=") for entry in shifted.split())

    def at(self, number: int):
        found = bisect.bisect_right(self.lines, number)
        if not found:
            return None
        start, cell = self.lines[found - 1], self.cells[found - 1]
        return cell, int(self.moves.get(f"{cell}:{number - start}", number - start))


def line_map_comment(mapping: dict) -> str:
    """The `# nbddp lines:` comment of a line map ((cell, converted line) -> the notebook's line), the lines that
    moved only; "" where none did."""
    moved = [f"{cell}:{line}={then}" for (cell, line), then in sorted(mapping.items()) if line != then]
    return LINES + " ".join(moved) if moved else ""
