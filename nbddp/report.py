"""What a conversion changed, what it could not handle, and what the user must do next."""
from __future__ import annotations

from dataclasses import dataclass, field

from .install_values import has_placeholders


@dataclass(frozen=True)
class Note:
    cell: int | None
    text: str
    line: int | None = None

    def where(self) -> str:
        if self.cell is None:
            return "notebook"
        return f"cell {self.cell}" + (f", line {self.line}" if self.line else "")


def _order(note: Note):
    return (note.cell or 0, note.line or 0)


@dataclass
class Report:
    source: str = "<notebook>"
    changes: list[Note] = field(default_factory=list)
    warnings: list[Note] = field(default_factory=list)
    installs: list[str] = field(default_factory=list)
    code_cells: int = 0
    _seen: set = field(default_factory=set, repr=False, compare=False)

    def change(self, cell, text, line=None):
        self._add(self.changes, Note(cell, text, line))

    def warn(self, cell, text, line=None):
        self._add(self.warnings, Note(cell, text, line))

    def _add(self, notes, note):
        """One line for what two calls of a cell both decided."""
        if note not in self._seen:
            self._seen.add(note)
            notes.append(note)

    def install(self, command: str):
        command = " ".join(command.split(" #")[0].split())  # one line, no trailing comment
        if command.startswith("{sys.executable} "):  # IPython's expansion: the notebook's own interpreter
            command = "python" + command[len("{sys.executable}"):]
        if command not in self.installs:
            self.installs.append(command)

    def format(self, launch_lines=()) -> str:
        out = [f"nbddp: {self.source}: {self.code_cells} code cells converted"]
        if self.changes:
            out.append("Changed:")
            out += [f"  {n.where()}: {n.text}" for n in sorted(self.changes, key=_order)]
        if self.warnings:
            out.append("Check these (nbddp could not convert them safely):")
            out += [f"  {n.where()}: {n.text}" for n in sorted(self.warnings, key=_order)]
        if self.installs:
            left = " {name} parts are the notebook's own variables: put in their values;" if has_placeholders(
                self.installs) else ""
            out.append(f"Install before running (the notebook's install commands, removed from the script;{left} "
                       "where the notebook chooses between values, a line per choice):")
            out += [f"  {c}" for c in self.installs]
        if launch_lines:
            out.append("Launch:")
            out += [f"  {line}" for line in launch_lines]
        return "\n".join(out)
