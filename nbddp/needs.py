"""What training needs: of the notebook's top-level statements, which every rank runs and where training ends.

    plan = training_needs(body, names, effects)
    plan.end   -> the index in `body` of the last statement every rank must run together (nbddp.training_end:
                  training, a collective, a later test of the rank), or None where there is none; what follows it
                  runs on rank 0 alone
    plan.once  -> the statements before it that training does not need (by identity): they run on rank 0
    plan.files -> the saves before it whose files what training needs reads later (id -> paths): each machine
                  needs them
    plan.calls -> each statement's live calls, as the analysis read them (id -> calls)
    plan.shares -> statements training needs that generate (rank-0 work) or compute a value each process would
                  compute for itself (the clock, a uuid: nbddp.entries.PER_PROCESS) -> the names they bind that
                  training reads: rank 0 runs the statement, every rank gets its values (nbddp_share_values)
    plan.differs -> such statements that bind no value to give (`random.seed(time.time())`): id -> what it calls
    plan.stops -> statements that train and decide when to stop by the clock each rank reads: id -> that call
    plan.setup -> statements every rank runs as a library's set-up (`PatchFastRL(...)`: the rule below) -> those
    plan.nested_once -> lines inside the blocks and functions every rank runs that only call a library none of
                  training's, Python's own or a computing one's for its effect (a web hook, a notifier): rank 0 runs
                  them (and the statements that hold them, by id)
    plan.outside -> statements every rank runs because training reads what they give, that call a library neither
                  training's objects nor Python's standard library come from (`rows = mylib.fetch(url)`): id -> (the
                  names training reads, those libraries); the report says so, an effect there happens on every rank
    plan.alone -> the statements that only act outside the process (nbddp.alone): rank 0 runs them where there is
                  no training's end to plan by (a notebook that does not train, a `%ddp` session's cells), and every
                  rank gets their loops' own names a later line reads (plan.later), and the names a line that keeps
                  what a program gives back binds (plan.results: nbddp.alone.program_results; there and where
                  training reads them)

The rule. Every rank runs what training needs: the statements that do work every rank must do (the vocabulary's
collectives, nbddp's own helpers, what reads the rank or the world size by meaning: `open(f"log-{dist.get_rank()}.txt",
"w")`, nbddp.rank_conditions), the process's set-up (imports, definitions, the environment, seeds, warnings,
logging, torch's flags: nbddp.entries.is_process_config; and a module function of a library that training's own
objects come from, called for its effect alone: `PatchFastRL("GRPO", FastLanguageModel)`, `datasets.disable_caching()`,
or of one whose calls make a value training needs, before them: `mylib.register(...)`; the same call of any other
library is an effect and runs once), what a test of the rank reads, and, transitively,
every earlier statement that binds or may change a value those read (nbddp.changes says what a statement may
change). A function or class is needed where what training needs reads its name; then so is what its body reads.
Files count as values where their path is a literal: a save of a folder whose path a needed call is given later
(`from_pretrained`, `open`, `np.load`, any library's reader) is needed, and so is what it saves (the save itself stays
rank-0 work; machines without rank 0's storage get a copy: nbddp.transforms.rank_guards). A needed statement that
generates, or reads the clock, a uuid or the OS's entropy, runs on rank 0 and gives its values to every rank
(plan.shares). Everything else runs once, whatever it calls: a file written by a library nbddp has no name for, a
folder made, a download, an upload. Where a guarded statement and a needed one share a name the scan cannot see
(`globals()`, a value read through a string), the names say nothing: the runtime's nets hold (one writer, the same
random state on every rank)."""
from __future__ import annotations

import libcst as cst

from .alone import acts_alone, fed_set_up, handles, other_libraries, program_results, read_later, set_up_by_values
from .bindings import params_of, static
from .changes import Changes
from .cst_helpers import is_if_false, live_calls
from .entries import NOT_LIBRARIES, SENDS, VALUE_HOMES
from .flows import aliases, carried, declared_global, imported_by_call
from .inside import nested_effects, stops_by_own_value, without_effects
from .plan import Plan
from .rank_conditions import is_rank_test
from .reads_writes import (at_definition, free_reads, imported_names, imported_packages, imported_values,
                           reads_writes)
from .training_end import is_own_guard, training_end
from .vocabulary import COLLECTIVE, CONFIG, GENERATE, LOAD, MAIN_ONLY, OWN_VALUE, PEFT, PUSH, SAVE, TRACK
from .walk import walk
from .written import OwnModules

MAKES = frozenset({CONFIG, LOAD, PEFT})  # training's own objects: made by every rank (they hold the process's state)
PATHS = frozenset({"pathlib.Path", "pathlib.PurePath", "os.path.join", "os.path.abspath", "os.path.expanduser",
                   "os.path.dirname", "os.path.basename", "os.getcwd", "builtins.str", "builtins.int"})


class _Scan:
    def __init__(self, names, effects, body, folder=None):
        self.names, self.effects = names, effects
        self.by_call = imported_by_call(body, names)  # `net = importlib.import_module("requests")`: an import
        self.modules = imported_names(body) | {name for name, _ in self.by_call.values()}
        self.read: dict = {}
        self.defs: dict = {}  # what a function of the notebook's body does (a _Changes set) -> function -> its union
        self.aliases, self.body, self._carried = aliases(body), body, None
        self.libraries = {"torch"}  # where training's own objects come from (training_needs fills it)
        self.fed: set = set()  # libraries whose calls make values training needs (`rows = mylib.load(...)`)
        self.packages = imported_packages(body) | {"torch"} | {package for _, package in self.by_call.values()}
        self.own = getattr(names, "own", None) or OwnModules(body, names, folder)  # its own modules (nbddp.written)
        self.imports = imported_values(body)  # what its imports bind (nbddp.ran_files)

    def homes(self, meanings) -> set[str]:
        """The packages the meanings come from; a module of the notebook's own counts as what its code imports."""
        found = set()
        for meaning in meanings:  # `utils.ping` of the notebook's utils.py: what its def ping calls into
            root, _, rest = meaning.partition(".")
            found |= self.own.packages(root, rest.split(".")[0].split("(")[0].split("[")[0] or None)
        return found

    def seen(self, stmt) -> Changes:
        """One pass over a statement's live code."""
        if id(stmt) not in self.read:
            changes = Changes(self)
            walk(stmt, changes)
            self.read[id(stmt)] = changes
        return self.read[id(stmt)]

    def _by(self, definition, what: str) -> set:
        """The union of `what` (a _Changes set) over the statements of a function of the notebook's body, once per
        function (a recursive function: what is known so far)."""
        definition = self.names.orig(definition)
        cache = self.defs.setdefault(what, {})
        if definition not in cache:
            cache[definition] = set()
            if isinstance(definition, cst.FunctionDef):
                cache[definition] = set().union(*(getattr(self.seen(s), what) for s in definition.body.body
                                                  if not isinstance(s, (cst.FunctionDef, cst.ClassDef))))
            elif isinstance(definition, cst.Lambda):
                cache[definition] = set(getattr(self.seen(definition.body), what))
        return cache[definition]

    def changed_by(self, definition) -> set[str]:
        """The outside names a function of the notebook may change when it runs (`random.shuffle(rows)` in its
        body changes the notebook's `rows`), and those it binds as its `global`s."""
        changed = self._by(definition, "changed")  # empty but for a def or lambda
        definition, declared = self.names.orig(definition), declared_global(self.names.orig(definition))
        if changed:  # not its own local names (those of the functions it calls are theirs)
            own = {p.name.value for p in params_of(definition)} | self._stars(definition) | set().union(
                *(reads_writes(s)[1] for s in getattr(definition.body, "body", ())))  # (a lambda binds none)
            changed = changed - (own - declared)
        return changed | declared

    def changed_parameters(self, definition) -> tuple[list[str], set[str]]:
        """A function of the notebook's parameters in the order a call gives them (a method's own first one left out),
        and those whose value it may change (`store[key] = ...`)."""
        definition = self.names.orig(definition)
        if not isinstance(definition, (cst.FunctionDef, cst.Lambda)):
            return [], set()
        given = [p.name.value for p in params_of(definition)]
        if given and definition in self.names.methods and not static(definition):
            given = given[1:]
        return given, self._by(definition, "changed") & (set(given) | self._stars(definition))

    @staticmethod
    def _stars(definition) -> set[str]:
        return {p.name.value for p in (definition.params.star_arg, definition.params.star_kwarg)
                if isinstance(p, cst.Param)}

    def packages_of(self, definition, which: str = "packages") -> set[str]:
        """The packages a function of the notebook calls into when it runs; `which`: "reaches" (of Python's own, those
        whose calls reach other machines), "saves" (the files it saves at literal paths), "configures" (its set-up:
        the libraries of the functions it calls for their effect, CONFIG where it sets up the process)."""
        return self._by(definition, which)

    def imported(self, name: str) -> bool:
        """A name the notebook binds by an import (a module or a library's class), not a value it made."""
        return name in self.modules

    def immutable(self, expr, depth: int = 0) -> bool:
        """A value no call can change: a string, a number, a path (`Path('a') / name`, `os.path.join(...)`, an
        f-string), through the names last assigned one."""
        if depth > 4:
            return False
        if isinstance(expr, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString, cst.Integer, cst.Float)):
            return True
        if isinstance(expr, cst.BinaryOperation):
            return self.immutable(expr.left, depth + 1) and self.immutable(expr.right, depth + 1)
        if isinstance(expr, cst.Call):
            return bool(self.names.meanings(expr.func) & PATHS)
        if isinstance(expr, cst.Name):
            value = self.names.value(expr)
            return value is not None and self.immutable(value, depth + 1)
        return False

    def facts(self, stmt):
        """(reads, may-change, every rank runs it whatever it binds, it binds whole names only)."""
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            return free_reads(stmt), {stmt.name.value}, False, True
        reads, writes = reads_writes(stmt)
        if isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) or
                                                             s in self.by_call for s in stmt.body):
            return reads, writes, True, True
        changes = self.seen(stmt)
        seed = changes.config or changes.together or changes.imports or bool(fed_set_up(stmt, self)) or \
            bool(changes.configures & (self.libraries | {CONFIG})) or \
            bool(changes.rank) or any(COLLECTIVE in self.effects.of_call(c) for c in changes.calls)
        whole = isinstance(stmt, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Assign, cst.AnnAssign)) for s in stmt.body)
        if self._carried is None:
            self._carried = carried(self.body, self)
        changed = changes.changed | set().union(*(self.aliases.get(name, ()) for name in changes.changed))
        if changes.calls:  # calling what a value it reads holds: `t.start()` of a thread whose target fills `cache`
            changed |= set().union(*(self._carried.get(name, ()) for name in reads))
        return reads | changes.loads | changes.reads, writes | changed | changes.saves, seed, whole and not changed

    def kinds(self, stmt) -> frozenset:
        """What a statement's calls do (nothing for a def or class: it runs when called)."""
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            return frozenset()
        seen = self.seen(stmt)
        return frozenset().union(seen.ran_kinds, *(self.effects.of_call(c) for c in seen.calls))

    def learn_libraries(self, body):
        """The libraries training's own objects come from: those of the calls every rank makes together (the model's
        loader, the trainer, the data) and of the trainer's configuration, and torch."""
        for stmt in body:
            for call in self.seen(stmt).calls if not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) else ():
                if self.effects.of_call(call) & {COLLECTIVE, CONFIG}:  # a function of the library, or its value's
                    self.libraries.update({m.split(".", 1)[0] for m in self.names.meanings(call.func)} & self.packages)
        self.libraries |= {home for home, makers in VALUE_HOMES.items() if makers & self.libraries}  # values' too


def _share(plan, stmt, scan, names):
    """A statement training needs that generates, computes a value of its own process, keeps a program's result, or
    saves, pushes or calls a tracker (rank-0 work) and gives back what training reads (`path = save_features(...)`,
    `run_id = wandb.util.generate_id()`): rank 0's values of `names`, given to every rank (plan.shares), or where it
    binds none, a line in the report (plan.differs)."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):  # what it computes when defined: a class attribute
        own = [c for part in at_definition(stmt) for c in live_calls(part) if OWN_VALUE in scan.effects.of_call(c)]
        plan.differs.update({id(stmt): own[0]} if own else {})
        return
    found = scan.kinds(stmt) | ({TRACK} if scan.effects.reads_tracker(stmt) else set())
    if not found & {GENERATE, OWN_VALUE, SAVE, PUSH, TRACK} and id(stmt) not in plan.results or COLLECTIVE in found:
        return
    names = [name for name in names if name in scan.seen(stmt).mutated or name in reads_writes(stmt)[1]]
    if names and not found & MAKES:  # a trainer's configuration, a model: every rank makes its own, never rank 0's
        plan.shares[id(stmt)] = names
    elif OWN_VALUE in found:
        plan.differs[id(stmt)] = next(c for c in scan.seen(stmt).calls if OWN_VALUE in scan.effects.of_call(c))


def _outside(stmt, scan) -> list[str]:
    """nbddp.alone.other_libraries of a statement that makes none of training's own objects."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or scan.kinds(stmt) & MAKES:
        return []
    return sorted(other_libraries(stmt, scan))


def _nested(body, plan, scan, names) -> set:
    return nested_effects([s for s in body[:plan.end + 1] if id(s) not in plan.once and  # (nbddp's guard: rank 0's,
                           not is_own_guard(s)], scan, names)  # converting it again)


def _needed(body, plan, scan, names, facts):
    """What training needs, from its end back (`facts`: a statement's reads, may-change, set-up, whole-names): what it
    does not need goes to plan.once, with the files, set-ups, shares and values of other libraries on the way."""
    scan.fed = set()
    for found in (plan.once, plan.files, plan.setup, plan.shares, plan.differs, plan.outside):
        found.clear()
    needed: set[str] = set()
    for stmt in reversed(body[:plan.end + 1]):
        if is_if_false(stmt) or isinstance(stmt, cst.SimpleStatementLine) and \
                any(isinstance(s, cst.Del) for s in stmt.body):
            continue  # left as the notebook has it; a `del` follows what it deletes (rank_guards' taint)
        reads, changes, seed, whole = facts(stmt)
        files = sorted(name[5:] for name in changes & needed if name.startswith("file:"))  # saved, then read
        if is_rank_test(stmt, names):  # left as it is: every rank tests it, any may run its body; what it saves is
            needed |= reads if files or not is_own_guard(stmt) else set()  # made before it (nbddp's guard: rank 0's)
            continue
        plan.files.update({id(stmt): files} if files else {})
        set_up = fed_set_up(stmt, scan) | (set() if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) else
                                          scan.seen(stmt).configures & scan.libraries)
        plan.setup.update({id(stmt): sorted(set_up)} if seed and set_up and not scan.kinds(stmt) & (  # (not what
            MAIN_ONLY | {COLLECTIVE}) else {})  # trains, nor rank-0 work by the vocabulary: not said to be set-up)
        if seed or changes & needed:
            given = sorted(n for n in changes & needed if not n.startswith("file:"))
            _share(plan, stmt, scan, given)
            outside = _outside(stmt, scan) if given and not seed and id(stmt) not in plan.shares else []
            if outside:
                plan.outside[id(stmt)] = (given, outside)
                scan.fed.update(set() if handles(stmt, given, scan) else set(outside) - SENDS)  # (set-up: nbddp.alone)
            if whole:
                needed -= changes
            needed |= reads if id(stmt) not in plan.shares else set()  # (rank 0 alone computes what it gives)
        elif not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and scan.seen(stmt).calls:
            plan.once.add(id(stmt))  # one that calls nothing (`x = 5`) follows what it reads


def training_needs(body, names, effects, folder=None) -> Plan:
    scan, plan = _Scan(names, effects, body, folder), Plan()
    plan.end, plan.marked = training_end(body, scan.kinds, lambda stmt: scan.seen(stmt).rank)
    plan.calls = {key: seen.calls for key, seen in scan.read.items()}
    plan.unread = {key: seen.unread for key, seen in scan.read.items() if seen.unread}
    if plan.end is None:  # no training seen: training's libraries, as far as the vocabulary knows them
        scan.libraries |= frozenset().union(*VALUE_HOMES.values()) - NOT_LIBRARIES
        scan.learn_libraries(body)
        plan.setup = set_up_by_values(body, scan)  # (first: what sets up such a library is no line acting alone)
        plan.alone, plan.results = acts_alone(body, scan, names), program_results(body, scan, names)
        plan.later = read_later(body, plan.alone, lambda stmt: scan.facts(stmt)[0])  # (nbddp.alone)
        return plan
    scan.learn_libraries(body[:plan.end + 1])
    plan.libraries, plan.packages = scan.libraries, scan.packages
    plan.results = program_results(body, scan, names)  # (one training needs is rank 0's too, given to every rank)
    _needed(body, plan, scan, names, scan.facts)
    plan.nested_once = _nested(body, plan, scan, names)
    if plan.nested_once:  # a value only the lines rank 0 runs alone read (`srv.push(loss)` in the loop) is not needed
        _needed(body, plan, scan, names, lambda stmt: without_effects(stmt, plan.nested_once, scan))
        plan.nested_once = _nested(body, plan, scan, names)
    plan.stops = stops_by_own_value(body[:plan.end + 1], scan, names)
    set_up_by_values(body[plan.end + 1:], scan)  # (a `%ddp` cell's set-up of what a later cell makes: not alone)
    plan.alone = acts_alone(body, scan, names)
    return plan
