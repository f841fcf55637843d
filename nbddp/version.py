"""nbddp's version, in one place: the package's `nbddp.__version__`, `nbddp --version` and each script's header."""

__version__ = "0.1.0"
