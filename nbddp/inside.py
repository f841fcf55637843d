"""Inside what trains: the lines that only call another library for their effect (nbddp.needs' `plan.nested_once`).

    nested_effects(body, scan, names) -> ids of such lines inside the blocks of the statements `body` holds, the
                  bodies of the functions that do work every rank must do or that those statements call (through
                  the functions they call, a decorator, a context manager), and the methods a trainer calls (a
                  callback's hooks, a Lightning module: `is_hooks`), and of the statements that hold them

A line is such an effect when it calls a library none of training's, Python's own or a computing one's (a web hook,
a notifier; through an alias or the notebook's own function, or a method of a value such a library made that the
notebook only calls methods of: a client, `self.bot` in a callback), drops the values, changes and binds nothing
else, reads neither the rank nor the world nor a file an enclosing `with` opened, sets up nothing and moves nothing
between devices (`.to("cpu")` frees that rank's GPU memory). Rank 0 runs it, with no wait: no other rank reads what
it did.
"""
from __future__ import annotations

import importlib
import logging

import libcst as cst

from .changes import base_name
from .cst_helpers import LiveVisitor, is_if_false, live_calls, names_in, statement_blocks
from .entries import COMPUTES, REACHES_OUT, STANDARD, TRAINING_HOOKS, is_entry
from .rank_conditions import is_rank_test
from .runtime import HELPERS
from .vocabulary import COLLECTIVE, CONFIG, DEVICE_MOVES, OWN_VALUE, parts
from .walk import walk as walk_tree


def effect_only(stmt, scan, handles=frozenset()) -> bool:
    """A line that calls a library for its effect alone where that library is none of training's, Python's own or a
    computing one (a web hook, a notifier): its calls' values are dropped, it changes and binds nothing, reads
    neither the rank nor the world nor a file an enclosing `with` opened, and sets up nothing."""
    if not all(isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) for small in stmt.body):
        return False
    reads, changes, seed, _ = scan.facts(stmt)
    seen = scan.seen(stmt)
    changes = changes - (seen.changed - seen.mutated) - _sent(seen.calls, scan)  # (a method whose value it uses)
    packages = seen.packages - {"builtins", "__main__"}  # the notebook's own functions: by what they call
    if packages & HELPERS.keys():  # nbddp's own lines (`%%writefile` in a function): each places itself
        return False
    reach = seen.reaches | seen.carriers  # (also through the notebook's own functions: `note(text)` whose body opens a
    # URL; a thread or pool only runs the function it is handed)
    return bool(packages) and not (seed or changes or seen.rank or seen.together or reads & handles) and not \
        packages & scan.libraries and not (packages - reach) & (STANDARD | COMPUTES) and not \
        scan.kinds(stmt) & {COLLECTIVE, CONFIG}


def _others(meanings, scan) -> bool:
    """Meanings all in packages the notebook imports, whose code is none of training's libraries, Python's own or a
    computing one's (a module the notebook wrote: by what it imports)."""
    meanings = {m for m in meanings if not m.startswith("__main__.")} or meanings  # `start()` returning a client
    homes, reach = scan.homes(meanings), {m.split(".", 1)[0] for m in meanings if m.startswith(REACHES_OUT)}
    return bool(homes) and {m.split(".", 1)[0] for m in meanings} <= scan.packages and \
        not homes & scan.libraries and not (homes - reach) & (STANDARD | COMPUTES)


def _sent(calls, scan) -> set:
    """The names a line changes only by calling methods of a value such a library made, or of its attributes, a value
    nothing else reads (`client.chat_postMessage(...)` after `client = WebClient(token)`, `dk.containers.run(...)`
    after `dk = docker.from_env()`; `self.bot.send_message(...)` in a callback)."""
    found = set()
    for call in calls:
        func = call.func
        if isinstance(func, cst.Attribute):
            meanings = scan.names.meanings(func)
            if {parts(m)[-1] for m in meanings} & DEVICE_MOVES:  # `.to("cpu")` of any value: where its memory is
                continue
            held = func.value  # `dk.containers.run(...)`: of what `dk` holds
            while isinstance(held, cst.Attribute) and not scan.names.only_called(held):
                held = held.value
            if all("()." in m for m in meanings) and _others(meanings, scan) and scan.names.only_called(held):
                found.add(base_name(held))
    return found


def is_handler(meaning: str) -> bool:
    """A logging handler class of Python's own (`logging.StreamHandler`, `logging.handlers.HTTPHandler`): by what
    the class is (logging is Python's own: importing it runs nothing of the notebook's)."""
    if not meaning.startswith("logging.") or "(" in meaning:
        return False
    module, _, name = meaning.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    return isinstance(cls, type) and issubclass(cls, logging.Handler)


def is_handler_class(node: cst.ClassDef, names) -> bool:
    """A class of the notebook's derived from a logging handler (through its bases' meanings)."""
    return any(is_handler(m) for base in node.bases for m in names.meanings(base.value))


def is_hooks(node: cst.ClassDef, names) -> bool:
    """A class of the notebook's derived from a trainer's callback class, Lightning's module or a logging handler
    (through its bases' meanings): a trainer (or logging) calls its methods on every rank."""
    return is_handler_class(node, names) or any(is_entry(m, TRAINING_HOOKS) for base in node.bases
                                                for m in names.meanings(base.value))


def _called(body, scan, names) -> set:
    """The notebook's functions that these statements run when they run: those they call, those those call, a
    context manager of a `with`, the functions a decorator of the notebook's wraps around what it decorates, and those
    handed to a trainer (`compute_metrics`, `reward_funcs`: it calls them on every rank)."""
    found, todo = set(), [c for s in body if not isinstance(s, (cst.FunctionDef, cst.ClassDef))
                          for c in scan.seen(s).calls]
    while todo:
        call = todo.pop()
        for definition in (d for expr in (call.func, *_handed(call, scan)) for d in names.definitions(expr)):
            definition = names.orig(definition)
            if not isinstance(definition, cst.FunctionDef) or definition in found:
                continue
            found.add(definition)
            wrappers = [w for d in definition.decorators for w in map(names.orig, names.definitions(d.decorator))
                        if isinstance(w, cst.FunctionDef)]  # @notify: the function notify returns runs instead
            inner = [s for w in wrappers for s in w.body.body if isinstance(s, cst.FunctionDef)]
            found |= {*wrappers, *inner}
            todo += [c for d in (definition, *wrappers, *inner) for s in d.body.body for c in scan.seen(s).calls]
    return found


def _handed(call, scan) -> list:
    """The values a call that does work every rank must do (a trainer's construction) is given, and the items of a
    list or tuple it is given: a function of the notebook's among them is one the library calls on every rank
    (`compute_metrics=...`, `reward_funcs=[...]`, a collator)."""
    if COLLECTIVE not in scan.effects.of_call(call):
        return []
    values = [arg.value for arg in call.args]
    return values + [e.value for v in values if isinstance(v, (cst.List, cst.Tuple)) for e in v.elements]


def nested_effects(body, scan, names) -> set:
    """The effect-only lines (effect_only) inside the blocks of these statements and the bodies of the functions that
    do work every rank must do (a trainer's, a collective) or that a trainer calls (a callback's hooks), and the
    statements that hold them (by id)."""
    found, called = set(), _called(body, scan, names)

    def runs_everywhere(stmt, hook) -> bool:
        if is_if_false(stmt) or is_rank_test(stmt, names):  # a rank test's body: as the notebook wrote it
            return False
        if isinstance(stmt, cst.ClassDef):
            return is_hooks(stmt, names)
        if isinstance(stmt, cst.FunctionDef):  # else it runs where it is called (a top-level line: once)
            return hook or COLLECTIVE in scan.effects.of_def(stmt) or names.orig(stmt) in called
        return True

    def walk(stmt, handles, hook=False) -> bool:
        if not runs_everywhere(stmt, hook):
            return False
        if isinstance(stmt, cst.ClassDef):  # a trainer calls its methods on every rank
            held = any([walk(s, handles, True) for s in stmt.body.body])
        elif isinstance(stmt, cst.SimpleStatementLine):
            held = effect_only(stmt, scan, handles)
        else:
            if isinstance(stmt, cst.With):  # `with open(path, "w") as fh:` on every rank: what writes to fh too
                handles = handles | {n for item in stmt.items if item.asname is not None
                                     for n in names_in(item.asname.name)}
            held = any([walk(s, handles) for block in statement_blocks(stmt, defs=True) for s in block.body])  # all
        if held:
            found.add(id(stmt))
        return held

    for stmt in body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            walk(stmt, frozenset())
    return found


class _Drop(cst.CSTTransformer):
    def __init__(self, lines):
        super().__init__()
        self.lines = lines

    def leave_SimpleStatementLine(self, original, updated):
        return cst.SimpleStatementLine([cst.Pass()]) if id(original) in self.lines else updated


def without_effects(stmt, lines, scan):
    """nbddp.needs' facts of a top-level statement, reading what its lines that rank 0 runs alone (`lines`, by id:
    nested_effects) read only where the rest of it reads it too: a server the notebook only posts to from inside the
    loop that trains (`srv.push(loss)`) is no value training needs."""
    if id(stmt) not in lines:
        return scan.facts(stmt)
    _, changes, seed, whole = scan.facts(stmt)
    return scan.facts(stmt.visit(_Drop(lines)))[0], changes, seed, whole


class _ClockStops(LiveVisitor):
    """The first test in a piece of code that decides by a value of the process's own (the clock) whether a loop goes
    on: a `while` test, or an `if` whose block leaves (`break`, `return`, `raise`) or stops a trainer
    (`control.should_training_stop = True`)."""

    def __init__(self, scan):
        self.scan, self.found = scan, None

    def _own(self, test):
        return next((c for c in live_calls(test) if OWN_VALUE in self.scan.effects.of_call(c)), None)

    def visit_While(self, node):
        self.found = self.found or self._own(node.test)

    def visit_If(self, node):
        leaves = [n for s in node.body.body if isinstance(s, cst.SimpleStatementLine) for n in s.body if isinstance(n, (
            cst.Break, cst.Return, cst.Raise)) or isinstance(n, cst.Assign) and any(isinstance(
                t.target, cst.Attribute) and t.target.attr.value == "should_training_stop" for t in n.targets)]
        self.found = self.found or (self._own(node.test) if leaves else None)

    def visit_FunctionDef(self, node):  # (a hook's or a training function's body is read where it stands)
        return True

    def visit_ClassDef(self, node):
        return True


def stops_by_own_value(body, scan, names) -> dict:
    """{id: the call} of the statements that train (a loop, a function that does work every rank must do, a trainer's
    callback) and decide when to stop by the clock each rank reads for itself: ranks may stop at different steps."""
    found = {}
    for stmt in body:
        trains = is_hooks(stmt, names) if isinstance(stmt, cst.ClassDef) else COLLECTIVE in (
            scan.effects.of_def(stmt) if isinstance(stmt, cst.FunctionDef) else scan.kinds(stmt))
        clock = _ClockStops(scan)
        if trains and not is_rank_test(stmt, names):
            walk_tree(stmt, clock)
        if clock.found is not None:
            found[id(stmt)] = clock.found
    return found
