"""Step: a notebook that controls its own process, in a script that is one of a DDP job's processes.

- Colab's restart after installs (`os.kill(os.getpid(), 9)`, `os._exit(0)`) ends the notebook's kernel so that the
  next cells import what was installed; a script has nothing to restart (its installs ran before it started), and
  killing one rank would end the whole job: the line is removed, with a report line (not under a rank test: a rank
  that ends itself there does it on purpose).
- `torch.nn.DataParallel(model)` (a notebook that sees several GPUs spreads each batch over them in one process)
  would split each rank's batch again over GPUs that other ranks use: the model stays itself, with a report line;
  where the notebook reads `.module` of it, a warning says to use the model itself.

- A launcher inside the notebook starts processes of its own, a job inside this job: accelerate's
  `notebook_launcher(fn, args)` becomes `fn(*args)` (each rank of this job runs the function once, as one of the
  launcher's processes would; accelerate reads torchrun's environment), with a report line;
  `torch.multiprocessing.spawn`/`start_processes` stop the conversion, naming the cell and line (the function sets up
  a process group of its own), and so does a program started that launches a distributed job
  (`subprocess.run(["torchrun", ...])`, `os.system("accelerate launch ...")`: its command by its words, as a shell
  line's; `!torchrun` stops it in the magics step).

Calls are told by what they are (nbddp.meanings), not by how the notebook spells them.
"""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import arguments, code_of, has_star_kwargs, keyword, live_calls
from ..entries import STARTS_PROGRAMS
from ..errors import ConversionError
from ..rank_conditions import is_rank_test
from ..tree import TreeTransformer
from ..vocabulary import NOTEBOOK_LAUNCHERS
from ..walk import walk
from .base import TreeStep
from .devices import TidiedMarkers
from .markers import marker
from .shell import OWN_PROCESS, is_launch, launch_inside, one_line, program_command, runs_python

# the names a statement must hold for this step to read it, and names bound from them (tree.visit)
MENTIONS = frozenset({"os", "kill", "_exit", "getpid", "DataParallel", "notebook_launcher", "spawn",
                      "start_processes", *(m.rsplit(".", 1)[1] for m in STARTS_PROGRAMS)})
SPAWNS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes",
                    "torch.multiprocessing.spawn.spawn", "torch.multiprocessing.spawn.start_processes"})
GROUP_STARTS = frozenset({"torch.distributed.init_process_group",
                          "torch.distributed.distributed_c10d.init_process_group"})
DATA_PARALLEL = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                           "torch.nn.parallel.data_parallel.DataParallel"})


class _ProcessControl(TreeTransformer):
    def __init__(self, tree, ctx):
        super().__init__(tree, ctx)
        self.dropped = []  # cells where DataParallel was dropped
        self.removed = set()  # the markers left for removed lines

    def visit_If(self, node):
        # code under a rank test is the notebook's own per-rank choice (a rank that ends itself on purpose)
        return not is_rank_test(node, self.names)

    def _restarts(self, call) -> bool:
        meanings = self.names.meanings(call.func)
        if "os._exit" in meanings:
            return True
        first = call.args[0].value if call.args else None
        return "os.kill" in meanings and isinstance(first, cst.Call) and "os.getpid" in self.names.meanings(first.func)

    def leave_SimpleStatementLine(self, original, updated):
        body = updated.body
        if len(body) == 1 and isinstance(body[0], cst.Expr) and isinstance(body[0].value, cst.Call) and \
                self._restarts(original.body[0].value):
            shown = one_line(code_of(body[0].value), 60)
            self.report.change(self.cell, f"removed `{shown}` (the notebook restarts its kernel after installs; a "
                                          "script has nothing to restart, and it would end every rank)")
            removed = marker(f"removed `{shown}`: a script has nothing to restart").with_changes(
                leading_lines=updated.leading_lines)
            self.removed.add(removed)
            return removed
        return updated

    def leave_Call(self, original, updated):
        meanings = self.names.meanings(original.func)
        if meanings & NOTEBOOK_LAUNCHERS:
            return self._launched(original, updated)
        grouped = self._groups_in(original)
        if meanings & SPAWNS or grouped:
            raise self._stop(original, f"`{one_line(code_of(updated), 60)}` starts processes of its own, each with its "
                                       f"own process group{f' ({grouped}() starts one)' if grouped else ''}; under "
                                       "nbddp every rank is already one of the job's processes: call the function once "
                                       "instead (torch.distributed is set up for it)")
        command = program_command(original, self.names) if meanings & STARTS_PROGRAMS else None
        if command and is_launch(command):  # as `!torchrun ...` (the magics step)
            raise self._stop(original, launch_inside(one_line(code_of(updated), 60)))
        if command and runs_python(command) and keyword(original, "env") is None and not has_star_kwargs(original):
            self.report.change(self.cell, f"`{one_line(code_of(updated), 60)}` {OWN_PROCESS}")
        if not DATA_PARALLEL & meanings or not updated.args:
            return updated
        model = updated.args[0].value
        self.report.change(self.cell, f"`{one_line(code_of(updated), 60)}` → `{code_of(model)}`: under DDP each process "
                                      "trains on its own GPU, DataParallel would spread it over the others' GPUs")
        self.dropped.append(self.cell)
        return model

    def _groups_in(self, call) -> str | None:
        """The notebook's function a call is handed (`Process(target=worker)`, `pool.map(worker, ...)`) that starts a
        process group of its own (`dist.init_process_group(..., rank=rank)`, also through its functions), by name."""
        return next((code_of(arg.value) for arg in call.args if any(
            starts_group(d, self.names) for d in self.names.definitions(arg.value))), None)

    def _stop(self, node, text):
        cell, line = self.tree.where(node)
        return ConversionError(text, step="process-control", cell=cell, line=line)

    def _launched(self, original, updated):
        """`notebook_launcher(train, (a, b), num_processes=2)` -> `train(a, b)`."""
        function, given = arguments(updated, "function", "args")
        if function is None:
            return updated
        if isinstance(given, cst.Tuple):
            args = [cst.Arg(element.value) for element in given.elements]
        else:
            args = [cst.Arg(given, star="*")] if given is not None else []
        self.report.change(self.cell, f"`{one_line(code_of(updated), 60)}` → `{code_of(function)}(...)`: every rank of "
                                      "this job runs the function once, as each of the launcher's processes would")
        return cst.Call(func=function, args=args)


def starts_group(definition, names, seen=None) -> bool:
    """A function of the notebook's that starts a process group, itself or through the functions it calls."""
    seen = set() if seen is None else seen
    definition = names.orig(definition)
    if definition in seen or not isinstance(definition, (cst.FunctionDef, cst.Lambda)):
        return False
    seen.add(definition)
    return any(names.meanings(c.func) & GROUP_STARTS or any(starts_group(d, names, seen) for d in names.definitions(
        c.func)) for c in live_calls(definition.body))


class ProcessControl(TreeStep):
    name = "process-control"

    def run(self, tree, ctx) -> cst.Module:
        rewriter = _ProcessControl(tree, ctx)
        defined = [(s.name.value, s) for s in tree.module.body if isinstance(s, cst.FunctionDef)] + [
            (t.target.value, small.value) for s in tree.module.body if isinstance(s, cst.SimpleStatementLine)
            for small in s.body if isinstance(small, cst.Assign) and isinstance(small.value, cst.Lambda)
            for t in small.targets if isinstance(t.target, cst.Name)]
        starters = {name for name, d in defined if starts_group(d, tree.names)}  # (a statement handed one is read too)
        module = tree.visit(rewriter, mentions=MENTIONS | starters)
        if rewriter.dropped and "module" in _attributes(module):
            ctx.report.warn(rewriter.dropped[0], "the notebook reads `.module` of a model it wrapped in DataParallel; "
                                                 "nbddp dropped the wrapper: read the model itself instead")
        return module.visit(TidiedMarkers(tree.names, rewriter.removed)) if rewriter.removed else module


def _attributes(module) -> set[str]:
    found: set[str] = set()

    class _Attributes(cst.CSTVisitor):
        def visit_Attribute(self, node):
            found.add(node.attr.value)

    walk(module, _Attributes())
    return found
