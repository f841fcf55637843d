"""Where a line of a generated script comes from: the `# %% cell N` markers the renderer writes before each cell."""
from __future__ import annotations

MARKER = "# %% cell "


def cell_starts(lines) -> list[tuple[int, str]]:
    """(1-based line of the marker, cell number) for each cell of a script's lines."""
    return [(i + 1, line.strip()[len(MARKER):]) for i, line in enumerate(lines) if line.strip().startswith(MARKER)]


def cell_at(lines, number: int):
    """(cell, line in the cell) for script line `number`, or None before the first cell."""
    starts = cell_starts(lines)
    before = [(start, cell) for start, cell in starts if start <= number]
    if not before:
        return None
    start, cell = before[-1]
    return cell, number - start
