"""Errors nbddp raises. Every message says what to do next."""


class NbddpError(Exception):
    """Root of every error nbddp raises on purpose; the CLI prints it as one line."""


class NotebookReadError(NbddpError):
    """The input is missing, unreadable, or not a Jupyter notebook."""


class ConversionError(NbddpError):
    """A pipeline step could not convert a cell. The message names the notebook's cell and line (as the notebook
    numbers them); `step`, the pipeline step that stopped, is for bug reports and tests, not for the user's eyes."""

    def __init__(self, message, *, step=None, cell=None, line=None):
        self.step, self.cell, self.line, self.message = step, cell, line, message
        where = []
        if cell is not None:
            where.append(f"cell {cell}")
        if line is not None:
            where.append(f"line {line}")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class OutputExistsError(NbddpError):
    """The output path holds a file that nbddp did not write."""


class LaunchError(NbddpError):
    """A DDP job could not be started, or one of its ranks failed."""
