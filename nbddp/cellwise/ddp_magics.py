"""`%ddp N|auto [--all-ranks]`, `%ddp stop`, `%ddp` and `%%local`: the notebook's cells on N DDP ranks.

While a session is on, an input transformer (IPython's `input_transformers_cleanup`, which sees each cell before
IPython's own magic handling) routes every cell the user runs (not a front end's silent requests) into the
`%%ddp_cell` magic, which converts it (history.py) and runs it on every rank (kernel.py). Cells that begin with
`%ddp` (so `%ddp stop`), `%%local` or an extension command stay in the kernel; `%%local` itself only marks a cell
that runs in the kernel, with the kernel's own display, errors and namespace.
"""
from __future__ import annotations

import atexit
import itertools
import sys

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from ..errors import LaunchError, NbddpError
from .glue import resolve_nproc
from .history import History

KERNEL_CELLS = ("%ddp", "%%ddp", "%load_ext", "%reload_ext", "%unload_ext")
LOCAL = "%%local"

WHERE = """\
What runs where, while the session is on:
  every cell runs on every rank, converted as `nbddp convert` converts a notebook, but one cell at a time:
    every rank: the model (each on its own device), LoRA, the data, the Trainer and training, one DDP job
    once, on rank 0: saving, pushing, generation, display(), top-level prints, GPU memory prints (others wait)
    the rest of a cell runs on every rank: a session cannot know what later cells will need (a converted
    script runs what training does not need once, and everything after training on rank 0 alone)
    once per machine, local rank 0 first: !shell lines, %%writefile, dataset loading and .map()
  in this kernel: %%local cells, %ddp itself; the kernel's own variables are not the ranks'
  output: rank 0's{all_ranks}; rich output from rank 0 comes as rich output
%ddp stop ends the session; a failing cell raises RankFailedError and the session goes on."""


def _running_cell_number(shell) -> int:
    """The number the notebook shows for the running cell (In[N]): where IPython stored its input. The shell's
    execution_count is already the next one while a cell runs on some IPython versions."""
    stored = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
    return len(stored) - 1 if stored else shell.execution_count


@magics_class
class DdpMagics(Magics):
    def __init__(self, shell):
        super().__init__(shell)
        self.session = None
        self.history = None
        self._ids = itertools.count(1)
        atexit.register(self._end)

    def live(self):
        if self.session is not None and self.session.dead is not None:
            self.session = None
        return self.session

    def _end(self):
        if self.session is not None and self.session.dead is None:
            self.session.end()

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        "what", nargs="?", metavar="N|auto|stop",
        help="processes to start (a number, or 'auto': one per GPU, 2 on CPU), or 'stop'; nothing: what runs where")
    @magic_arguments.argument(
        "--all-ranks", action="store_true",
        help="show every rank's output, each line prefixed [rank N] (default: rank 0's output only)")
    @line_magic
    def ddp(self, line):
        """Run every following cell on N DDP ranks (one per GPU), cell by cell, their state kept between cells.

        Each cell is converted as `nbddp convert` converts a notebook (placement, main-process-first data, saving,
        printing and generation on rank 0) and runs on every rank; rank 0's output streams into the cell. A failing
        cell raises RankFailedError; interrupting the kernel stops the cell on every rank. `%%local` runs one cell in
        this kernel; `%ddp stop` ends the session; `%ddp` says what runs where.

        Examples
        --------
        ::

            %load_ext nbddp
            %ddp 2

            %%local
            print("in the kernel")

            %ddp stop
        """
        args = magic_arguments.parse_argstring(self.ddp, line)
        session = self.live()
        if args.what is None:
            self._status(session)
        elif args.what.strip().lower() == "stop":
            if session is None:
                print("nbddp: no DDP session is running", file=sys.stderr)
                return
            session.stop()
            self.session = None
            print(f"nbddp: the {session.nproc} ranks have stopped; cells run in this kernel again")
        else:
            self._start(args.what, args.all_ranks)

    def _start(self, what, all_ranks):
        if self.live() is not None:
            raise UsageError(f"a session of {self.session.nproc} ranks is running: %ddp stop first")
        try:
            nproc = resolve_nproc(what)
        except LaunchError as exc:
            raise UsageError(str(exc)) from None
        from .kernel import Session

        shown = "every rank's output" if all_ranks else "rank 0's output; --all-ranks shows every rank"
        print(f"nbddp: starting {nproc} ranks with torchrun ({shown})", flush=True)
        self.session = Session(nproc, all_ranks=all_ranks).start()
        self.history = History(all_ranks=all_ranks)
        print(f"nbddp: {nproc} ranks ready: every cell now runs on all of them (%%local: in this kernel; "
              "%ddp: what runs where; %ddp stop: end)", flush=True)

    def _status(self, session):
        if session is None:
            print("nbddp: no DDP session: cells run in this kernel; %ddp N starts N ranks (%ddp auto: one per GPU)")
            return
        pids = ", ".join(f"rank {r}: pid {p}" for r, p in sorted(session.procs.ranks.items()))
        print(f"nbddp: {session.nproc} ranks (torchrun: pid {session.procs.proc.pid}, {pids}), "
              f"{session.cells_run} cells run on them")
        print(WHERE.format(all_ranks="" if not session.all_ranks else ", and every other rank's prefixed [rank N]"))

    @cell_magic
    def ddp_cell(self, line, cell):
        """A cell run on every rank of the session (the input transformer routes every cell here)."""
        session = self.live()
        if session is None:
            raise UsageError("no DDP session is running (it ended); %ddp N starts one, or remove %%ddp_cell")
        if not cell.strip():
            return
        try:
            converted = self.history.convert(cell)
        except NbddpError as exc:
            raise UsageError(f"nbddp cannot run this cell on the ranks: {exc}") from None
        count = _running_cell_number(self.shell)
        name, label = f"<nbddp In[{count}]>", f"Cell In[{count}]"
        try:
            compile(converted.code, name, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise UsageError(f"this cell cannot run on the ranks ({exc.msg}, line {exc.lineno}); a cell there is "
                             "a script's code: no top-level await") from None
        for note in converted.warnings:
            print(f"nbddp: check this cell: {note}", file=sys.stderr)
        for command in converted.installs:
            print(f"nbddp: not run on the ranks: {command} (install in the kernel: a %%local cell; the ranks share "
                  "its environment)", file=sys.stderr)
        self.history.accept(cell, converted)
        session.run({"id": next(self._ids), "name": name, "label": label, "code": converted.code, "source": cell,
                     "modules": converted.modules, "lines": converted.lines})

    @cell_magic
    def local(self, line, cell):
        """Run the cell in this kernel, not on the ranks (the input transformer does this without the magic)."""
        self.shell.run_cell(f"{LOCAL}\n{cell}", store_history=False)  # marked, so that route() leaves it here

    def route(self, lines):
        """IPython cleanup transform: a `%%local` cell loses that line; with a session on, every other cell (but
        `%ddp`, `%%ddp...` and extension commands) becomes a `%%ddp_cell` cell."""
        head = next((line.lstrip() for line in lines if line.strip()), "")
        if lines and lines[0].split()[:1] == [LOCAL]:
            return lines[1:]
        if not head or head.startswith(KERNEL_CELLS) or self.live() is None or self._silent():
            return lines
        return ["%%ddp_cell\n", *lines]

    def _silent(self) -> bool:
        """A front end's own hidden request (`silent`: Colab's and editors' internals), not a cell of the user's."""
        request = getattr(self.shell, "parent_header", None) or {}
        return bool(request.get("content", {}).get("silent"))


def register(ipython):
    """Called by `%load_ext nbddp`: the magics, and the transformer that routes cells to the ranks (once)."""
    magics = DdpMagics(ipython)
    ipython.register_magics(magics)
    transforms = ipython.input_transformers_cleanup
    transforms[:] = [t for t in transforms if getattr(t, "__name__", "") != "route"
                     or not isinstance(getattr(t, "__self__", None), DdpMagics)]
    transforms.append(magics.route)
