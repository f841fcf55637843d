"""What one statement of the notebook does to the values around it, as nbddp.needs reads it: the names whose values
it may change in place, whether it sets up the process, the files it saves and may read, its live calls.

A statement may change a value it assigns an attribute or item of (`tok.pad_token = ...`), calls a method of
(`rows.append(x)`, unless the method is one of the vocabulary's rank-0 kinds: a save, a push, generation, a print, a
tracker's log), or passes to a call that changes what it is given (`random.shuffle(rows)`: nbddp.entries'
CHANGES_ARGUMENTS, a notebook's own function by what its body changes, a callee nbddp cannot follow; a call of any
other library reads its arguments: `json.dump(rows, fh)`, `mylib.send(report)`), but not a string, number or path
(`os.makedirs(out_dir)`). `scan` is nbddp.needs'
scan of the notebook (the names, the effects, the notebook's functions, what is imported)."""
from __future__ import annotations

import libcst as cst

from .cst_helpers import LiveVisitor, code_of
from .entries import (CHANGES_ARGUMENTS, EMITS, IN_PROCESS, REACHES_OUT, RUNS_CODE, STARTS_PROGRAMS, is_process_config,
                      library_of)
from .entry_match import Table
from .rank_conditions import RANK, node_reads
from .ran_files import RUN_FILE, ran_file, said
from .reads_writes import file_of, files_named
from .runtime import HELPERS
from .transforms.shell import may_install
from .vocabulary import CONFIG, MAIN_ONLY, RANK_LOGIC, SAVE, known

SHOWS = frozenset({"nbddp_show"})  # a cell's last value, shown (show.py)
CAPTURED = "nbddp_getoutput"  # IPython's `x = !cmd` in the script (ipython_calls): what subprocess.getoutput does


def started(meanings) -> frozenset:
    """The programs a call of these meanings starts (entries.STARTS_PROGRAMS, and the runtime's `x = !cmd`)."""
    return meanings & STARTS_PROGRAMS | (frozenset({"subprocess.getoutput"}) if CAPTURED in meanings else frozenset())
CHANGERS = Table(CHANGES_ARGUMENTS)
READS_TEXT = frozenset({"builtins.open().read", "pathlib.Path().read_text"})  # a file's text, read whole


def _root(expr):
    """`a` of `a`, `a.b.c`, `a[0].b`; `f()` of `f().a[0].b`."""
    while isinstance(expr, (cst.Attribute, cst.Subscript)):
        expr = expr.value
    return expr


def base_name(expr) -> str | None:
    """`a` of `a`, `a.b.c`, `a[0].b`."""
    root = _root(expr)
    return root.value if isinstance(root, cst.Name) else None


class Changes(LiveVisitor):
    """Names whose values a statement may change in place, and whether it sets up the process."""

    def __init__(self, scan):
        self.scan, self.names = scan, scan.names
        self.changed: set[str] = set()
        self.mutated: set[str] = set()  # of those, all but the receivers of method calls whose value it uses
        # (`tok.decode(x)`: a query, as far as the scan can tell)
        self.config = self.together = self.imports = False
        self.drops: set = set()  # calls whose value the statement drops
        self.loads: set = set()  # `file:<path>` of the paths its calls are given (what they may read)
        self.saves: set = set()  # `file:<path>` of what it saves by path
        self.calls: list = []  # its live calls (nbddp.cst_helpers.live_calls)
        self.configures: set = set()  # CONFIG, and the libraries of the module functions it calls for their effect
        self.rank: set = set()  # what it reads of the job's shape (nbddp.rank_conditions: RANK, WORLD)
        self.packages: set = set()  # the packages its calls come from, also through the notebook's functions
        self.reaches: set = set()  # of those, Python's own modules whose calls act outside the process: reach other
        # machines (REACHES_OUT) or start a program (STARTS_PROGRAMS)
        self.carriers: set = set()  # the packages of calls that are handed a function to run (_runs_handed)
        self.reads: set = set()  # names it reads beyond its own code's (a `%run -i` file's)
        self.ran_kinds: frozenset = frozenset()  # what a file it runs does (`%run`: nbddp.ran_files)
        self.unread: list = []  # the lines of the `%run`s whose file the converter cannot read

    def on_visit(self, node):
        self.rank |= node_reads(node, self.names)
        return super().on_visit(node)

    def visit_Import(self, node):
        self.imports = True  # `try: import x / except ImportError: ...`: a statement that imports is set-up

    visit_ImportFrom = visit_Import

    def _target(self, target):
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._target(element.value)
        elif isinstance(target, (cst.Attribute, cst.Subscript)):
            base = base_name(target)
            if base is not None:
                self.changed.add(base)
                self.mutated.add(base)
                self.config = self.config or self.scan.imported(base)
            else:  # `decimal.getcontext().prec = 40`: a value a library holds, changed (the process's own state)
                self.config = self.config or isinstance(_root(target), cst.Call)

    def visit_Assign(self, node):
        for target in node.targets:
            self._target(target.target)

    def visit_AugAssign(self, node):
        self._target(node.target)

    def visit_AnnAssign(self, node):
        self._target(node.target)

    def visit_Expr(self, node):
        value = node.value
        if isinstance(value, cst.Call):
            self.drops.add(value)
            shown = value.args[0].value if isinstance(value.func, cst.Name) and value.func.value in SHOWS and \
                value.args else None
            if isinstance(shown, cst.Call):  # `nbddp_show(random.shuffle(rows))`: the cell's last line, its value
                self.drops.add(shown)         # dropped in the notebook (None) and shown in the script

    def _ran(self, node, line=None, binds=True):
        """`%run file.py` (and a call that runs a file's code, `line` as `%run` would spell it): what the file's code
        does, where the converter can read it; else every rank runs it. `binds`: its names become the notebook's."""
        line = self.names.literal(node.args[0].value) if line is None and node.args else line
        ran = ran_file(line, self.scan) if isinstance(line, str) else None
        if ran is None:
            self.together = True
            self.unread.append(said(node, self.names) or code_of(node))
            return
        self.together = self.together or ran.together
        if binds:
            self.changed |= ran.binds
            self.mutated |= ran.binds
        self.reads |= ran.reads
        self.ran_kinds |= ran.kinds
        self.configures |= ran.configures
        self.packages |= ran.packages
        self.loads |= ran.loads

    def _runs_handed(self, node, meanings):
        """A function the call is handed to run (`Thread(target=requests.post)`, `pool.submit(note, text)`): its
        packages are the line's; the carrier's own (threading's, a pool's) only run it (`carriers`). True if handed."""
        carrier, homes = False, {h for h in self.scan.homes(meanings) if h.isidentifier()} - {"builtins", "__main__"}
        for arg in node.args if homes else ():  # a library's call (a list's `append(fn)` keeps fn: it changes)
            if not isinstance(arg.value, (cst.Name, cst.Attribute)):
                continue
            handed = {m for m in self.names.meanings(arg.value) if library_of(m)}
            definitions = [d for d in self.names.definitions(arg.value) if isinstance(d, cst.FunctionDef)]
            if handed or definitions:
                carrier = True
                self.carriers |= homes
                self.packages |= self.scan.homes(handed)
                self.reaches |= {m.split(".", 1)[0] for m in handed if m.startswith(REACHES_OUT)}
            for definition in definitions:
                self.packages |= self.scan.packages_of(definition)
                self.reaches |= self.scan.packages_of(definition, "reaches")
        return carrier

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, cst.Name) and func.value in SHOWS:  # the notebook's own line is what it shows
            return
        self.calls.append(node)
        if isinstance(func, cst.Name) and func.value == RUN_FILE:
            return self._ran(node)
        meanings = self.names.meanings(func)
        if meanings & RUNS_CODE:
            return self._runs_code(node, meanings)
        if isinstance(func, cst.Name) and func.value.startswith("nbddp_") and (
                func.value not in HELPERS or HELPERS[func.value].together):  # nbddp's helpers every rank calls
            self.together = True
        if any(is_process_config(m) for m in meanings):
            self.configures.add(CONFIG)
        effects, definitions = self.scan.effects.of_call(node), self.names.definitions(func)
        if node in self.drops and not definitions:  # called for what it does to the process: set-up where training's
            libraries = {library_of(m) for m in meanings}  # libraries are, or where it cannot act outside the process
            self.configures |= self.scan.homes(m for m in meanings if library_of(m))  # (module functions)
            if libraries and libraries <= IN_PROCESS and not effects:
                self.configures.add(CONFIG)
        if SAVE in effects and not definitions:  # a file saved by its path
            self.saves.update(filter(None, [file_of(node, meanings, self.names)]))
        elif not started(meanings):  # any other call given a path may read it, whatever its library (a command line
            self.loads |= files_named(node, self.names)  # is no path)
        self.packages |= self.scan.homes(meanings)
        self.reaches |= {m.split(".", 1)[0] for m in meanings if m.startswith(REACHES_OUT)}
        if started(meanings) and not may_install(node, self.names):  # a program started: outside the process
            self.reaches |= {m.split(".", 1)[0] for m in started(meanings)}
        carrier = self._runs_handed(node, meanings)
        for definition in definitions:  # the notebook's own function: what its body saves, sets up and calls
            self.saves |= self.scan.packages_of(definition, "saves")
            self.configures |= self.scan.packages_of(definition, "configures")
            self.packages |= self.scan.packages_of(definition)
            self.reaches |= self.scan.packages_of(definition, "reaches")
        if RANK_LOGIC in self.scan.effects.of_call(node):  # a function of the notebook's that decides by the rank
            self.rank.add(RANK)
        if effects & MAIN_ONLY:
            return
        for definition in definitions:  # and what it changes
            self.changed |= self.scan.changed_by(definition)
            self.mutated |= self.scan.changed_by(definition)
        handed = given_changes(node, self.scan)
        self.changed |= handed
        self.mutated |= handed
        receiver = base_name(func.value) if isinstance(func, cst.Attribute) else None
        if receiver is not None and not self.scan.imported(receiver) and func.attr.value not in EMITS and not carrier:
            self.changed.add(receiver)
            if node in self.drops:
                self.mutated.add(receiver)
        changes = not definitions and any(not known(m, self.names.packages) or CHANGERS.match(m, True)
                                          for m in meanings)  # (the notebook's own function: given_changes)
        if node in self.drops and changes:
            for arg in node.args:
                base = base_name(arg.value)
                if base is not None and not self.scan.immutable(arg.value):
                    self.changed.add(base)
                    self.mutated.add(base)

    def _runs_code(self, node, meanings):
        """`exec(open("utils.py").read())` as `%run -i utils.py`, `runpy.run_path("prep.py")` as `%run prep.py`
        (`run_module("prep")`: `%run -m prep`), its names its own; `exec` of code the converter cannot read, or into
        the notebook's namespace by a name it cannot follow, runs on every rank."""
        first = node.args[0].value if node.args and not node.args[0].star else None
        if "builtins.exec" in meanings:
            spaces = [a.value for a in node.args[1:]]
            if spaces and not any(isinstance(v, cst.Call) and "builtins.globals" in self.names.meanings(v.func)
                                  for v in spaces):  # into namespaces of its own: it changes what it is given
                self.changed |= {n for n in map(base_name, spaces) if n}
                return
            path = self._file_read(first)
            return self._ran(node, f"-i {path}" if path else None)
        path = self.names.literal(first)
        module = "runpy.run_module" in meanings
        return self._ran(node, (f"-m {path}" if module else path) if isinstance(path, str) else None, binds=False)

    def _file_read(self, expr) -> str | None:
        """The path of `open("utils.py").read()` or `Path("utils.py").read_text()` (a literal, or a name last assigned
        one), else None."""
        if not (isinstance(expr, cst.Call) and self.names.meanings(expr.func) & READS_TEXT
                and isinstance(expr.func.value, cst.Call) and expr.func.value.args):
            return None
        path = self.names.literal(expr.func.value.args[0].value)
        return path if isinstance(path, str) else None


def _given(call) -> list:
    """The values a call is given, a tuple's or list's items one by one (`args=(cache, key)`)."""
    values = []
    for arg in call.args:
        value = arg.value
        values += [e.value for e in value.elements] if isinstance(value, (cst.Tuple, cst.List)) else [value]
    return values


def given_changes(call, scan) -> set[str]:
    """The outside names a call may change through a function of the notebook's: one it is given to call later or
    now (`pool.submit(fill, cache, k)`, `Thread(target=fill, args=(cache, k))`, `partial(fill, cache)`, `map(fill,
    keys)`): what that function changes, and the values given beside it where it changes what it is given; one it
    calls, also through what a call made of it (`x = fill(cache, k)`, `delayed(fill)(cache, k)`): the values it gives
    the parameters that function changes."""
    values, names = _given(call), scan.names
    handed = [(value, d) for value in values for d in names.definitions(value)
              if not isinstance(value, cst.Call)]  # a partial's own call hands it
    changed = set().union(*(scan.changed_by(d) for _, d in handed))
    reached = [v for v in values if all(v is not value for value, _ in handed)] \
        if any(scan.changed_parameters(d)[1] for _, d in handed) else []
    wrapped = [d for v in _given(call.func) for d in names.definitions(v)] if isinstance(call.func, cst.Call) else []
    for definition in names.definitions(call.func) or wrapped:  # `delayed(fill)(cache, k)`: what it wraps, called
        params, touched = scan.changed_parameters(definition)
        for position, arg in enumerate(call.args if touched else ()):
            name = arg.keyword.value if arg.keyword is not None else \
                params[position] if position < len(params) and not arg.star else None
            if name is None or name in touched:  # a starred argument, or one past the named parameters: any
                reached.append(arg.value)
    return changed | {base_name(v) for v in reached if base_name(v) is not None and not scan.immutable(v)}
