"""What `%run file.py` does (the script's `nbddp_run_file(line, globals())`), as nbddp.needs reads it: the file's code
read as a notebook of its own, never run.

    ran_file(line, scan) -> Ran, or None where the converter cannot read the file (then every rank runs it)

The file's top-level names become the notebook's (`binds`; not a module the notebook itself imports under that
name): training needs the line where it reads one of them. The
line is set-up every rank runs (`together`) where the file's own code sets up the process, reads the rank or talks to
every rank (nbddp.needs' seed, read in the file); its kinds are those of its calls (a file that trains ends the
notebook's training there). With `-i` it also reads the notebook's names its code reads. Anything else it does (a
download, a folder made, a report sent) is an effect: where training needs none of its names, rank 0 runs it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from .cst_helpers import code_of
from .effects import Effects
from .meanings import Names
from .reads_writes import imported_values, reads_writes


RUN_FILE = "nbddp_run_file"  # the script's line for `%run` (nbddp.transforms.ipython_calls)


def said(call, names) -> str | None:
    """`%run prep.py` for the script's `nbddp_run_file("prep.py", globals())`, as the report and the waits name it;
    None for any other call."""
    if not (isinstance(call.func, cst.Name) and call.func.value == RUN_FILE):
        return None
    line = call.args[0].value if call.args else cst.SimpleString('""')
    line = line.args[0].value if isinstance(line, cst.Call) and line.args else line  # `nbddp_expand('$f')`: as written
    return f"%run {names.literal(line) if isinstance(names.literal(line), str) else code_of(line)}"


@dataclass
class Ran:
    binds: set = field(default_factory=set)  # the names the file gives the notebook
    reads: set = field(default_factory=set)  # with -i: what it reads of the notebook's names
    together: bool = False  # every rank must run it (set-up, the rank, a collective)
    kinds: frozenset = frozenset()  # what its calls do (nbddp.vocabulary's kinds)
    configures: set = field(default_factory=set)  # the libraries whose module functions it calls for their effect
    packages: set = field(default_factory=set)  # the packages its calls come from
    loads: set = field(default_factory=set)  # `file:<path>` of the paths its calls are given


def _imports_only(stmt) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom))
                                                             for s in stmt.body)


def ran_file(line: str, scan) -> Ran | None:
    found = scan.own.ran(line)
    if found is None:
        return None
    module, flags = found
    names = Names(module)
    sub = type(scan)(names, Effects(names), module.body, scan.own.folder)  # nbddp.needs' scan, of the file
    sub.learn_libraries(module.body)
    ran, kinds = Ran(), set()
    same = {name for name, what in imported_values(module.body).items() if scan.imports.get(name) == what}
    for stmt in module.body:
        reads, changes, seed, _ = sub.facts(stmt)
        if "i" in flags:
            ran.reads |= reads - ran.binds
        ran.binds |= reads_writes(stmt)[1] | {c for c in changes if not c.startswith("file:")}
        if _imports_only(stmt) or isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            continue
        ran.together = ran.together or seed
        kinds |= sub.kinds(stmt)
        ran.configures |= sub.seen(stmt).configures
        ran.packages |= sub.seen(stmt).packages
        ran.loads |= sub.seen(stmt).loads
    ran.binds -= same  # a module the notebook imports under the same name: the same value on every rank
    ran.kinds = frozenset(kinds)
    return ran
