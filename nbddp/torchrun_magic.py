"""`%%torchrun N`: run a notebook cell as a multi-process DDP job, its output streamed into the cell.

Load it with `%load_ext nbddp`. Modelled on IPython's `%%script` (IPython/core/magics/script.py).
"""
from __future__ import annotations

import os
import re
import sys

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.utils.process import arg_split

from . import executor, launch
from .errors import ConversionError, NbddpError

DEFAULT_SCRIPT = "train_ddp.py"
CELL_SOURCE = "%%torchrun cell"
_GIB = 1024 ** 3


def kernel_cuda_memory() -> int:
    """Bytes of CUDA memory this process (the kernel) holds; 0 unless torch is already imported and CUDA is up.
    Never imports torch and never starts CUDA."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    try:
        cuda = torch.cuda
        if not cuda.is_available() or not cuda.is_initialized():
            return 0
        return sum(max(cuda.memory_allocated(i), cuda.memory_reserved(i)) for i in range(cuda.device_count()))
    except Exception:  # a half-imported or unusual torch: no warning rather than a failed cell
        return 0


def cuda_memory_warning() -> str | None:
    held = kernel_cuda_memory()
    if not held:
        return None
    return (f"nbddp: warning: this kernel holds {held / _GIB:.2f} GiB of CUDA memory that the ranks will need; "
            "free it first: del model; import gc; gc.collect(); torch.cuda.empty_cache()")


def _split_line_magic(tokens):
    """`N [options] script.py [args]` -> (options part, script, script args)."""
    for i, tok in enumerate(tokens):
        if i >= 1 and not tok.startswith("-") and tok.endswith(".py"):
            return tokens[:i], tok, tokens[i + 1:]
    raise UsageError("give the script to launch: %torchrun N script.py [args] "
                     "(or run a cell with %%torchrun N)")


@magics_class
class TorchrunMagics(Magics):
    """The `%%torchrun` cell magic and the `%torchrun` line magic."""

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        "nproc", metavar="N",
        help="processes to start: a number, or 'auto' (one per visible GPU, or 2 on CPU when there is none)")
    @magic_arguments.argument(
        "--out", default=DEFAULT_SCRIPT, metavar="PATH",
        help=f"cell magic: the script to write (default: {DEFAULT_SCRIPT} in the working directory)")
    @magic_arguments.argument(
        "--force", action="store_true", help="replace a file at --out that nbddp did not write")
    @magic_arguments.argument(
        "--all-ranks", action="store_true",
        help="show every rank's output, each line prefixed [rank N] (default: rank 0's output only)")
    @magic_arguments.argument(
        "--dry-run", action="store_true", help="write the script and print the command, but launch nothing")
    @line_cell_magic
    def torchrun(self, line, cell=None):
        """Run the cell as a DDP job: one process per GPU, started by torchrun.

        The cell is converted like a notebook (`nbddp convert`), written to a script (train_ddp.py unless
        --out) and launched with `torchrun --standalone --nproc_per_node=N`. Other torchrun flags pass through
        (--nnodes, --rdzv-endpoint, --node-rank, --master-addr, ...; with them there is no --standalone).
        Rank 0's output streams into the cell as it comes. A failing rank makes the cell raise, naming the rank,
        its exit code and the end of its traceback. Interrupting the kernel stops every rank.

        As a line magic, `%torchrun N [options] script.py [args]` launches an existing script.

        Examples
        --------
        ::

            %load_ext nbddp

            %%torchrun 2
            trainer = SFTTrainer(model=model, ...)
            trainer.train()

            %%torchrun auto --all-ranks --out finetune.py

            %torchrun 2 train.py --epochs 1
        """
        tokens = arg_split(line, posix=True)
        if cell is None:
            tokens, script, script_args = _split_line_magic(tokens)
        else:
            script, script_args = None, []
        parser = self.torchrun.parser
        args, extra = parser.parse_known_args(launch.glue_values(tokens, _own_options(parser)))
        stray = [tok for tok in extra if not tok.startswith("-")]
        if stray:
            raise UsageError(f"unexpected argument {stray[0]!r}; usage: %%torchrun N [options] "
                             "(torchrun flags as --flag=value)")
        try:
            nproc = executor.resolve_nproc(args.nproc)
            launch.check_flags(extra)
            if cell is not None:
                script = self._write_cell(cell, args.out, nproc, args.force, args.all_ranks)
        except ConversionError as exc:  # a line of this cell: as the cell numbers it, the magic's own line first
            raise UsageError(f"{_this_cell(exc.cell, exc.line)}: {exc.message}") from None
        except NbddpError as exc:  # bad count or flag, file in the way: one line, like any usage error
            raise UsageError(str(exc)) from None
        how = dict(extra=extra, script_args=script_args, all_ranks=args.all_ranks)
        job = executor.plan(script, nproc, **how)
        if args.dry_run:
            print(f"nbddp: script: {script}")
            print(f"nbddp: command: {launch.command_line(job)}")
            return None
        warning = cuda_memory_warning()
        if warning:
            print(warning, file=sys.stderr, flush=True)
        shown = "every rank's output" if args.all_ranks else "rank 0's output; --all-ranks shows every rank"
        per_node = " per machine" if launch.is_multi_node(extra) else ""
        threads = job.env.get("OMP_NUM_THREADS")
        threads = f"{threads} each" if threads else os.environ.get("OMP_NUM_THREADS")
        print(f"nbddp: {script} on {nproc} processes{per_node} ({shown}; OMP_NUM_THREADS={threads})", flush=True)
        try:
            executor.run_script(script, nproc, **how)
        except executor.RankFailedError as exc:  # its frames in this cell, not "cell 1" of the script
            exc.traceback = _CELL_LINE.sub(lambda m: f"  {_this_cell(1, int(m.group(1)))}:", exc.traceback)
            raise
        return None

    def _write_cell(self, cell, out, nproc, force, all_ranks=False) -> str:
        import nbformat

        from .pipeline import convert_notebook
        from .transforms.base import Options
        from .writer import write_conversion

        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
        result = convert_notebook(nb, source_name=CELL_SOURCE, script_name=out, nproc=nproc, single_file=False,
                                  options=Options(main_prints=not all_ranks),  # --all-ranks: every rank prints
                                  folder=os.getcwd())  # the kernel's modules: those of its working folder
        write_conversion(out, result, force=force)
        _print_notes(result.report)
        return out


def _own_options(parser) -> set:
    return {opt for action in parser._actions for opt in action.option_strings}


_CELL_LINE = re.compile(r"  cell 1, line (\d+):")  # a frame as nbddp.executor.cell_frames writes it


def _this_cell(cell, line) -> str:
    """Where in the `%%torchrun` cell (the script's only cell, number 1): "this cell, line 3", its lines counted as
    the notebook shows them, the `%%torchrun` line first."""
    return "this cell" + (f", line {line + 1}" if line else "")


def _print_notes(report):
    """What the user must know before the job runs: lines nbddp could not convert, and removed installs."""
    for note in report.warnings:
        print(f"nbddp: check {_this_cell(note.cell, note.line)}: {note.text}", file=sys.stderr)
    for command in report.installs:
        print(f"nbddp: removed from the script (run it in the notebook first): {command}", file=sys.stderr)
