"""The conversion pipeline: an explicit, ordered list of steps over a deep copy of the notebook."""
from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass, field

from . import __version__
from .errors import ConversionError, NbddpError, NotebookReadError
from .cells import cell_at
from .cst import parse
from .launch import launch_lines
from .notebook import as_notebook
from .report import Report
from .transforms.autocast import Autocast
from .syntax import newer_syntax
from .transforms.base import Context, Options, Transform, cell_number
from .transforms.custom_loop import CustomLoop
from .transforms.data_prep import DataPrep
from .transforms.global_batch import GlobalBatch
from .transforms.magics import Magics
from .transforms.placement import Placement
from .transforms.rank_guards import RankGuards
from .transforms.runtime_needs import RuntimeNeeds
from .transforms.scratch import Scratch
from .transforms.trainer_args import TrainerArgs


class CodeCells(Transform):
    """Keep the code cells that hold something, each tagged with its position in the notebook."""

    name = "code-cells"

    def preprocess(self, nb, ctx):
        for note in nb.metadata.get("nbddp", {}).get("read_notes", []):  # what reading the notebook repaired
            ctx.report.warn(None, note)
        kept = []
        for number, cell in enumerate(nb.cells, start=1):
            if cell.cell_type == "code" and cell.source.strip():
                cell.source = cell.source.replace("\r\n", "\n")  # one newline style in the script
                cell.metadata["nbddp"] = {"cell": number}
                kept.append(cell)
        if not kept:
            raise NotebookReadError(f"{ctx.report.source} has no code cells; there is nothing to convert")
        nb.cells = kept
        ctx.report.code_cells = len(kept)
        return nb


def steps() -> list[Transform]:
    return [CodeCells(), Magics(), Autocast(), Placement(), Scratch(), TrainerArgs(), CustomLoop(), DataPrep(), GlobalBatch(), RankGuards(),
            RuntimeNeeds()]


def run_pipeline(nb, ctx: Context):
    nb = copy.deepcopy(nb)
    for step in steps():
        try:
            nb = step.preprocess(nb, ctx)
        except NbddpError:
            raise
        except Exception as exc:  # a bug in a step: say which one
            raise ConversionError(f"internal error ({type(exc).__name__}: {exc}); please report it with the notebook",
                                  step=step.name) from exc
    return nb


@dataclass
class Conversion:
    script: str
    report: Report
    launch: list
    cells: list = field(default_factory=list, repr=False)  # the converted code cells, as the script holds them
    runtime: object = None  # nbddp.inline.Choice: the runtime modules the script carries, and why


def convert_notebook(notebook, *, source_name=None, script_name="train_ddp.py", nproc=2,
                     options: Options | None = None) -> Conversion:
    from .render import render_script

    nb = as_notebook(notebook)
    if source_name is None:
        source_name = os.path.basename(os.fspath(notebook)) if isinstance(notebook, (str, os.PathLike)) and (
            os.path.exists(notebook) or not os.fspath(notebook).lstrip().startswith("{")) else "notebook"
    ctx = Context(report=Report(source=source_name), options=options or Options())
    nb = run_pipeline(nb, ctx)
    launch = launch_lines(script_name, nproc)
    script = render_script(
        nb.cells, version=__version__, source=source_name,
        launch=launch, installs=ctx.report.installs, script_name=script_name, runtime=ctx.runtime,
    )
    check_compiles(script, script_name, nb.cells, ctx.report)
    return Conversion(script=script, report=ctx.report, launch=launch, cells=nb.cells, runtime=ctx.runtime)


def check_compiles(script: str, script_name: str, cells=(), report: Report | None = None):
    """Compile the script (nothing runs): what Python refuses is an error naming the notebook cell and line, so no
    script that does not compile is ever written. Syntax of a newer Python than this one (a notebook from Colab's
    3.12 converted on 3.11) is a report line naming the Python the script needs instead."""
    try:
        compile(script, script_name, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = cell_at(script.splitlines(), exc.lineno or 0)
        newer = _newer_at(cells, *where) if where else None
        if newer is not None and report is not None:
            version, what = newer
            needs, here = ".".join(map(str, version)), ".".join(map(str, sys.version_info[:2]))
            report.warn(int(where[0]), f"uses {what}, which needs Python {needs}: run the script with Python {needs} "
                        f"or newer (Python {here}, converting, cannot check that the script compiles)", line=where[1])
            return
        hint = "; a script cannot await at top level: put the code in an async def and run it with asyncio.run()" \
            if "await" in (exc.msg or "") or "async" in (exc.msg or "") else ""
        raise ConversionError(f"Python cannot compile this cell in a script ({exc.msg}){hint}", step="compile",
                              cell=where[0] if where else None, line=where[1] if where else exc.lineno) from None
    except ValueError as exc:  # e.g. a NUL character
        raise ConversionError(f"Python cannot compile the script ({exc}); fix the notebook's text",
                              step="compile") from None


def _newer_at(cells, cell, line):
    """(version, what) of syntax newer than this Python on that line of that converted cell, else None."""
    source = next((c.source for c in cells if str(cell_number(c)) == str(cell)), None)
    if source is None:
        return None
    for lines, version, what in newer_syntax(parse(source)):
        if line in lines and version > sys.version_info[:2]:
            return version, what
    return None


def convert(notebook, **kwargs) -> str:
    """Convert a notebook (path, JSON text, dict or NotebookNode) and return the DDP script's text."""
    return convert_notebook(notebook, **kwargs).script
