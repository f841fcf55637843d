"""Of the notebook's top-level statements, those that only call another library for their effect:

    acts_alone(body, scan, names) -> {id: paths} of the lines that nbddp.inside's `effect_only` finds (they call a
                                     library none of training's, Python's own or a computing one's, a web hook, a
                                     notifier, an upload, a download through urllib; drop the values; change, bind,
                                     set up and read nothing of the notebook's or the rank), and that ask nothing
                                     (a prompt or a login: nbddp.vocabulary.prompt) and are handed no function of the
                                     notebook's (the library may run it);
                                     and of the loops, tests and `with`s made of such lines alone (a loop of
                                     hooks);
                                     paths: the literal paths their calls are given (not a URL), which a machine
                                     without rank 0's storage gets a copy of

The plan (nbddp.needs) runs such a line once wherever it can say what training needs (before training's end it is
a statement training does not need). Where it cannot, nothing training could need comes of it either: in a notebook
with no training the analysis can see, and in a `%ddp` session's cells as they come (later cells unknown), rank 0
runs these alone and the other ranks wait for it (nbddp.transforms.whole). A program started counts as such a call
(nbddp.entries.STARTS_PROGRAMS; not an install); a line that keeps what the program gives back once it has ended
runs there too, and every rank gets the result (program_results). Python's other own calls (a folder made, an exit,
a sleep) stay on every rank there, as the notebook's process would run them.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import libcst as cst

from .changes import CAPTURED, SHOWS, started
from .cst_helpers import live_calls, names_in, statement_blocks
from .entries import COMPUTES, SENDS, STANDARD, WAITS_FOR_PROGRAM
from .inside import effect_only
from .rank_conditions import is_rank_test
from .vocabulary import MAIN_ONLY, prompt


def _shows_a_call(stmt) -> bool:
    """A cell's last line, which the script shows (`nbddp_show(...)`), counts where what it shows is a call
    (`nbddp_show(f(x))`, not `nbddp_show([f(x) for x in xs])`): the same line, converted once or twice."""
    values = [small.value for small in stmt.body if isinstance(small, cst.Expr)]
    return all(isinstance(v.args[0].value, cst.Call) for v in values if isinstance(v, cst.Call)
               and isinstance(v.func, cst.Name) and v.func.value in SHOWS and v.args)


def _handed(call, names) -> bool:
    """The call is given a function or class of the notebook's (or a lambda), which the library may run: what that
    does (train, on every rank) is the call's too."""
    return any(isinstance(arg.value, cst.Lambda) or names.definitions(arg.value) for arg in call.args)


def own_names(stmt) -> set:
    """The names a loop (its variable) or a `with` (its `as`) binds of its own: made anew where it runs."""
    if isinstance(stmt, cst.With):
        return set().union(*(names_in(item.asname.name) for item in stmt.items if item.asname is not None))
    return names_in(stmt.target) if isinstance(stmt, cst.For) else set()


def loop_names(stmt) -> set:
    """The names a loop or `with` binds of its own, and those of the loops and `with`s inside it."""
    inner = [] if isinstance(stmt, cst.SimpleStatementLine) else [
        s for block in statement_blocks(stmt) for s in block.body]
    return own_names(stmt).union(*map(loop_names, inner))


def read_later(body, alone, reads) -> dict:
    """{id: names} of the statements in `alone` whose loops' and `with`s' own names a later statement of `body`
    reads (`reads(stmt)`): rank 0 runs them, and every rank gets those names."""
    found, later = {}, set()
    for stmt in reversed(list(body)):
        given = loop_names(stmt) & later if id(stmt) in alone else set()
        if given:
            found[id(stmt)] = sorted(given)
        later |= reads(stmt)
    return found


def _only_acts(stmt, scan, names) -> int | None:
    """How many lines act outside the process (effect_only, asking nothing, handed none of the notebook's functions)
    in a line, or a loop, test or `with` whose lines all act or only steer (`pass`, `continue`, `break`); else
    None."""
    if isinstance(stmt, cst.SimpleStatementLine):
        if all(isinstance(small, (cst.Pass, cst.Continue, cst.Break)) for small in stmt.body):
            return 0
        acts = effect_only(stmt, scan) and not any(
            prompt(names.meanings(call.func), False, scan.packages) or _handed(call, names)
            for call in scan.seen(stmt).calls)
        return 1 if acts else None
    if not isinstance(stmt, (cst.For, cst.If, cst.With)) or isinstance(stmt, (cst.For, cst.With)) and \
            stmt.asynchronous or is_rank_test(stmt, names):  # (a rank test: the notebook's or nbddp's, as written)
        return None
    orelse = getattr(stmt, "orelse", None)
    inner = [*stmt.body.body, *(orelse.body.body if isinstance(orelse, cst.Else) else [orelse] if orelse else [])]
    counts = [_only_acts(s, scan, names) for s in inner]
    return None if None in counts else sum(counts)


def acts_alone(body, scan, names) -> dict:
    found = {}
    for stmt in body:
        compound = not isinstance(stmt, cst.SimpleStatementLine)
        if compound and not isinstance(stmt, (cst.For, cst.If, cst.With)) or not compound and not _shows_a_call(stmt) \
                or scan.kinds(stmt) & MAIN_ONLY or not _only_acts(stmt, scan, names):  # (none, or no line that
            continue  # acts; MAIN_ONLY: the vocabulary's rank-0 work: the rank guards take it by its kind)
        paths = {c[5:] for c in scan.facts(stmt)[1] | scan.seen(stmt).loads if c.startswith("file:")}
        found[id(stmt)] = sorted(p for p in paths if len(urlsplit(p).scheme) < 2)  # (`C:` is a drive)
    return found


def other_libraries(stmt, scan) -> set:
    """The libraries a statement's calls come from that neither training's objects nor Python's standard library nor
    a computing library do (module functions and the values they made: `mylib.fetch(url)`)."""
    return scan.seen(stmt).packages & scan.packages - scan.libraries - STANDARD - COMPUTES


def sends(stmt, scan) -> bool:
    """A call of the statement, or of a function of the notebook's it calls, is given a web address (a literal, an
    f-string that starts with one, or a name last assigned either): it reaches another machine, whatever library."""
    calls, seen = list(scan.seen(stmt).calls), set()
    for call in calls:
        for definition in scan.names.definitions(call.func):
            if definition not in seen:
                seen.add(definition)
                calls.extend(live_calls(definition.body))
        for arg in call.args:
            value = scan.names.value(arg.value) if isinstance(arg.value, cst.Name) else arg.value
            text = scan.names.literal(value) if value is not None else None
            if isinstance(value, cst.FormattedString) and isinstance(value.parts[0], cst.FormattedStringText):
                text = value.parts[0].value
            if isinstance(text, str) and urlsplit(text).scheme in ("http", "https", "ws", "wss", "ftp", "smtp"):
                return True
    return False


def handles(stmt, given, scan) -> bool:
    """Every name the line binds (of `given`, where given) is a handle: its every read calls one of its methods
    (`pager = sidefx.Pager()`, then `pager.send(...)`), a client, not data another library keeps state for."""
    smalls = stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ()
    targets = [t.target for small in smalls if isinstance(small, cst.Assign) for t in small.targets] + [
        small.target for small in smalls if isinstance(small, cst.AnnAssign)]
    bound = [t for t in targets if isinstance(t, cst.Name) and (given is None or t.value in given)]
    return bool(bound) and all(scan.names.only_called(t) for t in bound)


def fed_set_up(stmt, scan) -> set:
    """The libraries whose calls make values training needs (scan.fed) that a statement calls a module function of
    for its effect, where none of its calls is given a web address (`mylib.register(...)`, not a hook)."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or not scan.seen(stmt).configures & scan.fed:
        return set()
    return set() if sends(stmt, scan) else scan.seen(stmt).configures & scan.fed


def set_up_by_values(body, scan) -> dict:
    """{id: libraries} of the top-level lines that call a module function of a library for its effect where another
    line binds a value that library's calls make (`dsreg.register(...)`, then `rows = dsreg.load(...)`): with no
    training's end, every rank makes that value, so every rank runs what set the library's state, the first rank of
    each machine first (scan.fed; not a library that sends to other machines: nbddp.entries.SENDS)."""
    binds = [s for s in body if isinstance(s, cst.SimpleStatementLine) and
             any(isinstance(small, (cst.Assign, cst.AnnAssign)) for small in s.body) and not handles(s, None, scan)]
    scan.fed |= set().union(*(other_libraries(s, scan) for s in binds)) - SENDS
    return {id(s): sorted(fed_set_up(s, scan)) for s in body if fed_set_up(s, scan)}


def program_results(body, scan, names) -> dict:
    """{id: the names it binds} of the top-level lines that bind only what a program they start gives back once it
    has ended (`rc = subprocess.run([...])`, `out = subprocess.check_output(...)`: nbddp.entries.WAITS_FOR_PROGRAM,
    also through a function of the notebook's that starts only such programs; not an install, nor a command the
    converter cannot read), calling Python's own modules alone. Where there is no training's end to say whether
    training needs the result, rank 0 starts the program and every rank gets it."""
    found = {}
    for stmt in body:
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        if not isinstance(small, (cst.Assign, cst.AnnAssign)) or small.value is None:
            continue
        reads, changes, seed, whole = scan.facts(stmt)
        seen = scan.seen(stmt)
        starts = set().union(*(_starts(call, names) for call in seen.calls))
        if starts and starts <= WAITS_FOR_PROGRAM and seen.reaches and whole and not seed and \
                seen.packages - {CAPTURED} <= STANDARD | {"builtins", "__main__"} and \
                not any(_handed(c, names) for c in seen.calls):
            found[id(stmt)] = sorted(changes)
    return found


def _starts(call, names) -> set:
    """The programs a call starts (nbddp.entries.STARTS_PROGRAMS): its own meaning's, or, for a function of the
    notebook's (`rc = launch()`), those its body calls."""
    found = started(names.meanings(call.func))
    for definition in names.definitions(call.func):
        found |= set().union(*(started(names.meanings(c.func)) for c in live_calls(definition.body)))
    return found
