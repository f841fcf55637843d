"""Rank 0's rich output, sent to the kernel, which shows it in the cell as the notebook would have.

Rank 0 runs an IPython shell object (no terminal, no history file) whose display publisher sends each mime bundle
over the connection instead of printing it: so `display()`, `IPython.display.HTML`/`Image`, display handles that
update (`display(..., display_id=True)`), `clear_output`, the value of a cell's last expression (formatted by
IPython's own formatters) and matplotlib's inline figures (the backend is matplotlib-inline, as in ipykernel) all
arrive as the kernel's own display messages. The other ranks have no shell: a `display` there prints the repr, which
only `--all-ranks` shows (the converter runs displays on rank 0 only anyway).
"""
from __future__ import annotations

import importlib.util
import os
import sys

from . import wire


def _flush():
    sys.stdout.flush()
    sys.stderr.flush()


class Display:
    """What shows a rank's rich output; `show(value)` is the displayhook for a cell's last expression."""

    def __init__(self, send, main: bool):
        self.shell = None
        if not main:
            os.environ.setdefault("MPLBACKEND", "Agg")
            return
        if importlib.util.find_spec("matplotlib_inline") is not None:
            os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        from IPython.core.displaypub import DisplayPublisher
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config

        class Publisher(DisplayPublisher):
            def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
                _flush()  # what was printed before the display comes before it
                send((wire.DISPLAY, {"data": data, "metadata": metadata or {}, "transient": transient or {},
                                     "update": bool(update)}))

            def clear_output(self, wait=False):
                _flush()
                send((wire.DISPLAY, {"clear": True, "wait": bool(wait)}))

        config = Config()
        config.HistoryManager.enabled = False
        stdout, stderr, hook = sys.stdout, sys.stderr, sys.displayhook
        self.shell = InteractiveShell.instance(config=config)
        sys.stdout, sys.stderr, sys.displayhook = stdout, stderr, hook
        self.shell.display_pub = Publisher(shell=self.shell, parent=self.shell)

    def show(self, value):
        """A cell's last expression: shown on rank 0 as the notebook shows it (None shows nothing)."""
        if value is None or self.shell is None:
            return
        data, metadata = self.shell.display_formatter.format(value)
        if data:
            self.shell.display_pub.publish(data, metadata)

    def display(self, *values, **kwargs):
        """A cell's display(...) without an import: IPython's own on rank 0; text on the others (which only
        `--all-ranks` shows)."""
        if self.shell is None:
            print(*values)
            return None
        from IPython.display import display

        return display(*values, **kwargs)

    def after_cell(self):
        """What IPython does after a cell: matplotlib-inline shows the figures the cell drew."""
        if self.shell is not None:
            self.shell.events.trigger("post_execute")
