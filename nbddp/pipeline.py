"""The conversion pipeline: an explicit, ordered list of steps over a deep copy of the notebook."""
from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass, field

from . import inline
from .cells import MARKER, cell_at, cell_number, line_map_comment
from .cst_helpers import names_in, parse
from .errors import ConversionError, NbddpError, NotebookReadError
from .install_values import expand
from .launch import launch_lines
from .notebook import as_notebook
from .report import Report
from .runtime import HELPERS
from .syntax import newer_syntax
from .transforms.autocast import Autocast
from .transforms.base import Context, Options, Transform, TreeStep
from .transforms.custom_loop import CustomLoop
from .transforms.data_prep import DataPrep
from .transforms.demos import Demos
from .transforms.devices import Devices
from .transforms.global_batch import GlobalBatch
from .transforms.ipython_lines import Magics
from .transforms.placement import Placement
from .transforms.process_control import ProcessControl
from .transforms.rank_blocks import RankBlocks
from .transforms.rank_guards import RankGuards
from .transforms.ran_notebooks import RanNotebooks
from .transforms.runtime_needs import RuntimeNeeds
from .transforms.scratch import Scratch
from .transforms.show import Show
from .transforms.trainer_args import TrainerArgs
from .transforms.widgets import Widgets
from .tree import Tree
from .version import __version__


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
                ctx.inputs[number] = cell.source
                kept.append(cell)
        if not kept:
            raise NotebookReadError(f"{ctx.report.source} has no code cells; there is nothing to convert")
        nb.cells = kept
        ctx.report.code_cells = len(kept)
        return nb


def steps() -> list[Transform]:
    """The steps over the cells' text, before the notebook becomes one tree."""
    return [CodeCells(), RanNotebooks(), Magics()]


def tree_steps() -> list[TreeStep]:
    """The steps over the notebook's one tree, in order."""
    return [Autocast(), Placement(), Devices(), Scratch(), TrainerArgs(), CustomLoop(), DataPrep(),
            GlobalBatch(), Widgets(), Demos(), ProcessControl(), Show(), RankBlocks(), RankGuards(), RuntimeNeeds()]


def _step_error(exc, step, tree=None):
    """A bug in a step: say which step, and where in the notebook it was (the statement it was at)."""
    cell = line = None
    if tree is not None and tree.at is not None:
        try:
            cell, line = tree.where(tree.at)
        except Exception:  # the error report must not fail in its turn
            pass
    said = (str(exc).strip().splitlines() or [""])[0][:100]  # one line, whatever the exception holds
    return ConversionError(f"internal error in nbddp's {step.name} step ({type(exc).__name__}: {said}); please report "
                           "it with the notebook", step=step.name, cell=cell, line=line)


def _text_steps(nb, ctx: Context):
    """The notebook's code cells through the steps over their text (`steps()`)."""
    for step in steps():
        try:
            nb = step.preprocess(nb, ctx)
        except NbddpError:
            raise
        except Exception as exc:  # a bug in a step: say which one
            raise _step_error(exc, step) from exc
    return nb


def run_tree(nb, ctx: Context) -> Tree:
    """The notebook's code cells through every step: the text steps, then one tree through the tree steps."""
    nb = _text_steps(copy.deepcopy(nb), ctx)
    tree = ctx.tree = Tree(nb.cells, folder=ctx.folder)
    for step in tree_steps():
        tree.at = None
        try:
            tree.module = step.run(tree, ctx)
        except NbddpError:
            raise
        except Exception as exc:
            raise _step_error(exc, step, tree) from exc
    tree.notebook = nb
    ctx.report.installs = expand(ctx.report.installs, tree.first)  # the notebook's own string variables put in
    return tree


def run_pipeline(nb, ctx: Context):
    """The converted notebook: its code cells, each holding its converted code."""
    tree = run_tree(nb, ctx)
    nb = tree.notebook
    code = dict(tree.cells())
    for cell in nb.cells:
        cell.source = code[cell_number(cell)]
    return nb


@dataclass
class Conversion:
    script: str
    report: Report
    launch: list
    tree: object = field(default=None, repr=False)  # nbddp.tree.Tree: the converted notebook
    runtime: object = None  # nbddp.inline.Choice: the runtime modules the script carries, and why
    runtime_file: str | None = None  # the runtime's file name, beside the script (None: one file, runtime inlined)
    runtime_text: str | None = None

    @property
    def cells(self) -> list:
        """The converted code cells, as the script holds them."""
        code = dict(self.tree.cells())
        cells = copy.deepcopy(self.tree.notebook.cells)
        for cell in cells:
            cell.source = code[cell_number(cell)]
        return cells


def convert_notebook(notebook, *, source_name=None, script_name="train_ddp.py", nproc=2,
                     options: Options | None = None, single_file: bool = True, folder=None) -> Conversion:
    """The conversion: one self-contained script (`single_file`), or a script that imports its runtime from a file
    written beside it (`runtime_file`, `runtime_text`), as `nbddp convert` writes by default. `folder`: where the
    notebook imports its own modules from (default: the notebook file's folder; none for a notebook given as text)."""
    from .render import render_runtime, render_script, runtime_module_name

    nb = as_notebook(notebook)
    source_name = _source_name(notebook) if source_name is None else source_name
    if folder is None and isinstance(notebook, (str, os.PathLike)) and os.path.isfile(notebook):
        folder = os.path.dirname(os.path.abspath(notebook))
    ctx = Context(report=Report(source=source_name), options=options or Options(), folder=folder)
    tree = run_tree(nb, ctx)
    launch = launch_lines(script_name, nproc)
    context = dict(version=__version__, source=source_name, script_name=os.path.basename(script_name))
    runtime_module = runtime_text = runtime_id = None
    if not single_file:
        runtime_module = runtime_module_name(script_name)
        runtime_text, runtime_id = render_runtime(ctx.runtime, **context)
    script = render_script(tree.module, ctx.runtime, runtime_module, runtime_id, launch=launch,
                           installs=ctx.report.installs, line_map=line_map_comment(tree.line_map()), **context)
    check_compiles(script, script_name, ctx.report)
    return Conversion(script=script, report=ctx.report, launch=launch, tree=tree, runtime=ctx.runtime,
                      runtime_file=runtime_module and runtime_module + ".py", runtime_text=runtime_text)


def _source_name(notebook) -> str:
    """What the report and the script call the notebook: its file's name (bytes that are not UTF-8 shown as �, so
    the script stays UTF-8 text), else "notebook"."""
    if not isinstance(notebook, (str, os.PathLike)) or (
            not os.path.exists(notebook) and os.fspath(notebook).lstrip().startswith("{")):
        return "notebook"
    name = os.path.basename(os.fsdecode(notebook))
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def plain_script(notebook, *, source_name=None) -> str:
    """The notebook as a plain script, without the DDP conversion: a baseline to measure the DDP script against.

    Its code cells in order, each after its `# %% cell N` line, through the steps over their text only (code-cells,
    magics: IPython's magics and shell lines become the Python a converted script holds, installs dropped), after
    the runtime helpers those lines call (`nbddp_shell`, `nbddp_expand`, ...), as a script carries them: under
    torchrun a shell line or `%%writefile` runs once per machine, and waiting for it starts the process group.
    Nothing else changes: no device placement, rank guard, launch or library patch."""
    source_name = _source_name(notebook) if source_name is None else source_name
    nb = _text_steps(as_notebook(notebook), Context(report=Report(source=source_name)))
    code = "\n".join(f"{MARKER}{cell_number(cell)}\n{cell.source.rstrip()}\n" for cell in nb.cells)
    title = str(source_name).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    head = f'"""{title} as a plain script (nbddp.pipeline.plain_script): no DDP changes."""\n'
    calls: dict = {}  # runtime module -> the helpers of it the cells call
    for name in sorted(names_in(parse(code)) & set(HELPERS)):
        calls.setdefault(HELPERS[name].module, []).append(name)
    if not calls:
        return head + code
    choice = inline.Choice({module: "the notebook's IPython lines call " + ", ".join(names)
                            for module, names in calls.items()}, frozenset().union(*calls.values()))
    return head + inline.render(choice, skeleton=False) + "\n\n\n" + code


def check_compiles(script: str, script_name: str, report: Report | None = None):
    """Compile the script (nothing runs): what Python refuses is an error naming the notebook cell and line, so no
    script that does not compile is ever written. Syntax of a newer Python than this one (a notebook from Colab's
    3.12 converted on 3.11) is a report line naming the Python the script needs instead."""
    try:
        compile(script, script_name, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = cell_at(script.splitlines(), exc.lineno or 0)
        newer = _newer_at(script, exc.lineno) if where else None
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


def _newer_at(script, line):
    """(version, what) of syntax newer than this Python at that line of the script, else None (libcst reads it)."""
    for lines, version, what in newer_syntax(parse(script)):
        if line in lines and version > sys.version_info[:2]:
            return version, what
    return None


def convert(notebook, **kwargs) -> str:
    """Convert a notebook (path, JSON text, dict or NotebookNode) and return the DDP script's text."""
    return convert_notebook(notebook, **kwargs).script
