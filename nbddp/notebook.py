"""Reading notebooks: nbformat does the parsing and validation; we turn its failures into one-line errors."""
from __future__ import annotations

import json
import os

from .errors import NotebookReadError


def read_notebook(path):
    """Read and validate a notebook file, upgrading older formats to v4."""
    if os.path.isdir(path):
        raise NotebookReadError(f"{path} is a directory; give the path of a .ipynb file")
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise NotebookReadError(f"{path}: no such file") from None
    except OSError as exc:
        raise NotebookReadError(f"{path}: cannot read it ({exc.strerror})") from None
    return notebook_from_bytes(raw, name=path)


def notebook_from_bytes(raw: bytes, name="<notebook>"):
    import nbformat

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise NotebookReadError(f"{name} is not a text file; expected a Jupyter notebook (.ipynb, JSON)") from None
    if not text.strip():
        raise NotebookReadError(f"{name} is empty; expected a Jupyter notebook (.ipynb, JSON)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookReadError(
            f"{name} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "is it a truncated or unsaved notebook?"
        ) from None
    if not isinstance(data, dict) or "cells" not in data and "worksheets" not in data:
        raise NotebookReadError(f"{name} is JSON but not a Jupyter notebook (no 'cells')")
    try:
        nb = nbformat.reads(text, as_version=4)
        _validate(nb)
    except Exception as exc:  # nbformat raises several unrelated types here
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NotebookReadError(f"{name} is not a valid notebook: {first}") from None
    return nb


def _validate(nb):
    """Validate; a v4.0-4.4 notebook that already carries cell ids (common in the wild) is read as v4.5."""
    import nbformat

    try:
        nbformat.validate(nb)
    except nbformat.ValidationError:
        if nb.get("nbformat") != 4 or nb.get("nbformat_minor", 0) >= nbformat.current_nbformat_minor:
            raise
        nb.nbformat_minor = nbformat.current_nbformat_minor
        nbformat.validate(nb)


def as_notebook(notebook):
    """Accept a path, raw JSON text/bytes, a dict, or a NotebookNode; return a v4 NotebookNode."""
    if isinstance(notebook, (str, os.PathLike)):
        text = os.fspath(notebook)
        if text.lstrip().startswith("{"):
            return notebook_from_bytes(text.encode("utf-8"))
        return read_notebook(text)
    if isinstance(notebook, bytes):
        return notebook_from_bytes(notebook)
    if isinstance(notebook, dict):
        return notebook_from_bytes(json.dumps(notebook).encode("utf-8"))
    raise NotebookReadError(f"cannot read a notebook from {type(notebook).__name__}")
