"""Reading notebooks: nbformat does the parsing and validation; we turn its failures into one-line errors."""
from __future__ import annotations

import json
import os
import stat
import warnings

from .errors import NotebookReadError

MAX_BYTES = 1 << 30  # a notebook larger than this is not read (a device or a runaway file would never end)
# what each cell type may carry (nbformat v4.5); Jupyter opens notebooks with more, so the rest is dropped, noted
CELL_KEYS = {"code": {"id", "cell_type", "metadata", "source", "outputs", "execution_count"},
             "markdown": {"id", "cell_type", "metadata", "source", "attachments"},
             "raw": {"id", "cell_type", "metadata", "source", "attachments"}}
OUTPUT_KEYS = {"stream": {"output_type", "name", "text"},  # and what each output type may carry
               "display_data": {"output_type", "data", "metadata"},
               "execute_result": {"output_type", "execution_count", "data", "metadata"},
               "error": {"output_type", "ename", "evalue", "traceback"}}


def read_notebook(path):
    """Read and validate a notebook file, upgrading older formats to v4."""
    if os.path.isdir(path):
        raise NotebookReadError(f"{path} is a directory; give the path of a .ipynb file")
    try:
        with open(path, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise NotebookReadError(f"{path} is not a regular file (a device, FIFO or socket); give a .ipynb file")
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise NotebookReadError(f"{path}: no such file") from None
    except OSError as exc:
        raise NotebookReadError(f"{path}: cannot read it ({exc.strerror})") from None
    if len(raw) > MAX_BYTES:
        raise NotebookReadError(f"{path} is larger than {MAX_BYTES >> 20} MiB; clear its outputs and try again")
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
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits; JSON nested too deeply
        raise NotebookReadError(f"{name} is not a notebook Python can read ({type(exc).__name__}: "
                                f"{str(exc)[:80] or 'nested too deeply'})") from None
    if not isinstance(data, dict) or "cells" not in data and "worksheets" not in data:
        raise NotebookReadError(f"{name} is JSON but not a Jupyter notebook (no 'cells')")
    notes = []
    try:
        with warnings.catch_warnings(record=True) as said:  # nbformat's own warnings go into the report
            warnings.simplefilter("always")
            nb = nbformat.reads(text, as_version=4)
            notes += _validate(nb)
        notes += [f"nbformat: {w.message}" for w in said if not _housekeeping(w.category)]
    except Exception as exc:  # nbformat raises several unrelated types here
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NotebookReadError(f"{name} is not a valid notebook: {first}") from None
    nb.metadata.setdefault("nbddp", {})["read_notes"] = notes
    return nb


def _housekeeping(category) -> bool:
    """nbformat's warnings about its own bookkeeping (cells without ids, ids repeated): nbformat fills them in, and
    nothing in the converted script depends on them, so the report does not list them."""
    from nbformat.warnings import DuplicateCellId, MissingIDFieldWarning

    return issubclass(category, (MissingIDFieldWarning, DuplicateCellId))


def _validate(nb) -> list[str]:
    """Validate, reading what Jupyter reads: a v4.0-4.4 notebook that already carries cell ids (common in the wild)
    is read as v4.5, and properties a cell may not carry (a markdown cell's `outputs`, ...) are dropped. Returns
    what was repaired; what still fails validation is an error."""
    import nbformat

    try:
        nbformat.validate(nb)
        return []
    except nbformat.ValidationError:
        pass
    notes = []
    if nb.get("nbformat") == 4 and nb.get("nbformat_minor", 0) < nbformat.current_nbformat_minor and any(
            "id" in cell for cell in nb.get("cells", [])):
        nb.nbformat_minor = nbformat.current_nbformat_minor
    for number, cell in enumerate(nb.get("cells", []), start=1):
        extra = sorted(set(cell) - CELL_KEYS.get(cell.get("cell_type"), set(cell)))
        for key in extra:
            del cell[key]
        for output in cell.get("outputs", []) if isinstance(cell.get("outputs"), list) else ():
            dropped = sorted(set(output) - OUTPUT_KEYS.get(output.get("output_type"), set(output)))
            for key in dropped:
                del output[key]
            extra += [f"{key} of a {output.get('output_type')} output" for key in dropped]
        if extra:
            notes.append(f"cell {number} ({cell.get('cell_type')}): dropped {', '.join(dict.fromkeys(extra))}, which "
                         "nbformat's schema does not allow there")
    nbformat.validate(nb)
    return notes


def as_notebook(notebook):
    """Accept a path, raw JSON text/bytes, a dict, or a NotebookNode; return a v4 NotebookNode."""
    if isinstance(notebook, (str, os.PathLike)):
        text = os.fspath(notebook)
        if text.lstrip().startswith("{") and not os.path.exists(text):  # JSON text, unless a file has that name
            return notebook_from_bytes(text.encode("utf-8", "surrogateescape"))
        return read_notebook(text)
    if isinstance(notebook, bytes):
        return notebook_from_bytes(notebook)
    if isinstance(notebook, dict):
        return notebook_from_bytes(json.dumps(notebook).encode("utf-8"))
    raise NotebookReadError(f"cannot read a notebook from {type(notebook).__name__}")
