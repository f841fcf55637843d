"""Part of the rank-guards step: the whole notebook's plan (nbddp.needs, computed once on the first tree: Tree.plan)
applied to the statements as the earlier steps rewrote them, each found through the statement the plan read. The
statements training does not need are rank-0 work, those that give rank 0's values to every rank are taken whole,
values that differ by rank are reported, and after training's end rank 0 goes on alone (`nbddp_rest_on_rank0()`)."""
from __future__ import annotations

import functools

import libcst as cst

from ..cells import starts_cell
from ..changes import CAPTURED, started
from ..cst_helpers import TAKE, code_of, live_calls, statements_in
from ..needs import Plan
from ..reads_writes import reads_writes
from ..training_end import REST
from ..tree import statement_lines
from ..vocabulary import OWN_VALUE, parts
from ..walk import walk

GIVE, GIVEN = "nbddp_share_values", "given"  # rank 0's values, to every rank (nbddp.needs' shares)
SHARE = "nbddp_share_files"  # what rank 0 saved, to the machines that do not see its storage
SAME = "nbddp_same_values"  # rank 0's plain values of a line every rank runs that another library made


def quoted(text: str) -> cst.SimpleString:
    """A string literal in double quotes where the text allows (`"save_pretrained"`), else Python's own spelling
    (`'Parallel(prefer="threads")'`)."""
    plain = text.isprintable() and not {'"', "\\"} & set(text)
    return cst.SimpleString(f'"{text}"' if plain else repr(text))


def _line(name, *args) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine([cst.Expr(cst.Call(cst.Name(name), args=[cst.Arg(a) for a in args]))])


def after_guard(what: str, given=(), paths=()) -> list:
    """The lines after a guard of rank-0 work: the other ranks wait (`nbddp_barrier("<what>")`), then get rank 0's
    values of `given` (nbddp.needs' shares) or, on machines that do not see rank 0's storage, a copy of `paths`."""
    lines = [_line("nbddp_barrier", quoted(what))]
    if given:
        lines.append(_line(GIVE, cst.Call(cst.Name("globals")), *(cst.SimpleString(f'"{n}"') for n in given)))
    elif paths:
        lines.append(_line(SHARE, *map(quoted, paths)))
    return lines


def apply_plan(body, guards, tree, ctx) -> list:
    """What training needs (nbddp.needs): the statements it does not need are rank-0 work; after its end, rank 0 goes
    on alone (`nbddp_rest_on_rank0()`, unless the notebook has that line already)."""
    plan = on_body(tree.plan, tree.first.body, body, tree.names, guards.hoisted)
    guards.calls = plan.calls
    _unread(body, plan, ctx)
    line = _line_of(tree)
    _set_up(body, plan, ctx, line)
    if plan.end is None:  # no training's end to plan by: what only acts outside the process is rank 0's, and every
        alone(guards, plan)  # rank gets its loops' own names that a later line reads
        guards.later = plan.later
        guards.shares = {**plan.results, **plan.later}
        return body
    guards.once, guards.files, guards.shares = plan.once, plan.files, plan.shares
    guards.nested_once = plan.nested_once
    guards.libraries, guards.packages = plan.libraries, plan.packages
    cell, kept, end, objects = None, [], None, None
    for at, stmt in enumerate(body):
        kept.append(stmt)
        cell = starts_cell(stmt) or cell
        if id(stmt) in plan.outside:
            given, libraries = plan.outside[id(stmt)]
            ctx.report.change(cell, f"runs on every rank: training reads {', '.join(given)}, made by calls of "
                                    f"{' and '.join(libraries)}, which training's own objects do not come from: what "
                                    "those calls do happens on every rank, and where the values are plain (strings, "
                                    "floats), every rank takes rank 0's (to have the calls once: compute the value "
                                    "under `if NBDDP_IS_MAIN:`, save it, load it on every rank)", line(stmt))
            objects = _objects(tree.first) if objects is None else objects
            bound = [name for name in given if name in _assigned(stmt) - objects]  # a value made, not one changed
            if bound and not (at + 1 < len(body) and _calls(body[at + 1], SAME)):  # (converted code: there already)
                kept.append(_line(SAME, cst.Call(cst.Name("globals")), *(cst.SimpleString(f'"{n}"') for n in bound)))
        end = len(kept) - 1 if at == plan.end else end
        if id(stmt) in plan.stops:
            ctx.report.warn(cell, f"`{code_of(plan.stops[id(stmt)].func)}()` decides when training stops, and each rank "
                            "reads its own: ranks may stop at different steps, and one then waits for the others at "
                            "its next collective (a hang); stop by a step count (max_steps), or by a value rank 0 "
                            "decides and every rank gets (torch.distributed.broadcast_object_list)", line(stmt))
        if id(stmt) in plan.differs:
            ctx.report.warn(cell, f"`{code_of(plan.differs[id(stmt)].func)}()` gives each rank a value of its own (the "
                            "clock, a uuid, the OS's entropy) and training needs what this line does with it: the "
                            "ranks differ; bind the value to a name first (nbddp gives rank 0's to every rank)",
                            line(stmt))
    body = kept
    rest = body[end + 1:]
    guards.rest = {id(stmt) for stmt in rest}
    if plan.marked or not rest:
        return body
    cells = [starts_cell(stmt) for stmt in body[:end + 1] if starts_cell(stmt) is not None]
    later = sorted({c for c in map(starts_cell, rest) if c is not None})
    ctx.report.change(cells[-1] if cells else None,
                      "training ends here: the rest of the notebook" + (
                          "" if not later else f" (cell {later[0]})" if len(later) == 1 else
                          f" (cells {later[0]}-{later[-1]})") +
                      " runs on rank 0 alone; the other ranks wait for it, then end")
    comment = cst.EmptyLine(comment=cst.Comment("# nbddp: training ends here; rank 0 runs the rest alone, the other "
                                                "ranks wait for it"))
    line = cst.SimpleStatementLine([cst.Expr(cst.Call(cst.Name(REST)))], leading_lines=[comment])
    return body[:end + 1] + [line] + rest


def _set_up(body, plan, ctx, line):
    """The report's line for each statement every rank runs as a library's set-up (nbddp.needs' plan.setup)."""
    cell = None
    for stmt in body:
        cell = starts_cell(stmt) or cell
        libraries = plan.setup.get(id(stmt))
        if libraries:
            ours = set(libraries) <= plan.libraries  # else one whose calls make what training reads: its state
            where = "runs on every rank" if ours else "runs on every rank, the first rank of each machine first"
            whose = "training's own objects come from" if ours else \
                f"whose calls make values {'every rank' if plan.end is None else 'training'} reads"
            ctx.report.change(cell, f"{where}: it calls {' and '.join(libraries)} for its effect, a library {whose} "
                                    "(set-up; a library they do not come from would run once)", line(stmt))


def _unread(body, plan, ctx):
    cell = None
    for stmt in body:
        cell = starts_cell(stmt) or cell
        for line in plan.unread.get(id(stmt), ()):
            ctx.report.change(cell, f"`{line}`: nbddp cannot read the code it runs (a computed line or text, or "
                                    "no such file written by the notebook or beside it), so every rank runs it")


def alone(guards, plan):
    """Where there is no training's end to plan by (a notebook that does not train, a `%ddp` session's cell): what
    only acts outside the process (nbddp.alone) is rank-0 work, and the files it is given go to machines without rank
    0's storage."""
    guards.once, guards.files = set(plan.alone), {key: paths for key, paths in plan.alone.items() if paths}
    guards.once_why = "it only acts outside the process"
    guards.shares = guards.results = plan.results  # a program's result (nbddp.alone.program_results): rank 0's,
    # given to every rank


def on_body(plan, read, body, names, hoisted) -> Plan:
    """The plan, read on the statements `read` (the first tree's), for the statements of `body` (the steps' rewrites:
    a statement is the one the plan read where `names.orig` leads to it; several may: what the plan says of one
    statement holds for each, and what it gives (shares, files, report lines) goes to the first). Training's end is
    the last statement from the plan's end or before it that is not the rank-0 part of a hoisted collective (what
    shows its result)."""
    at = {id(stmt): i for i, stmt in enumerate(read)}
    where = [at.get(id(names.orig(stmt))) for stmt in body]
    new = Plan(marked=plan.marked, libraries=plan.libraries, packages=plan.packages,
               calls={id(stmt): live_calls(stmt) for stmt in body})
    first: dict = {}
    for stmt in body:
        first.setdefault(id(names.orig(stmt)), id(stmt))
    new.unread = {first[key]: value for key, value in plan.unread.items() if key in first}
    new.alone = {id(stmt): plan.alone[id(names.orig(stmt))] for stmt in body if id(names.orig(stmt)) in plan.alone}
    new.results = {first[key]: value for key, value in plan.results.items() if key in first}
    new.later = {first[key]: value for key, value in plan.later.items() if key in first}
    new.setup = {first[key]: value for key, value in plan.setup.items() if key in first}
    if plan.end is None:
        return new
    for stmt in body:
        if id(names.orig(stmt)) in plan.once:
            new.once.add(id(stmt))
    for name in ("files", "shares", "differs", "outside", "stops"):
        setattr(new, name, {first[key]: value for key, value in getattr(plan, name).items() if key in first})
    ends = [i for i, w in enumerate(where) if w is not None and w <= plan.end and id(body[i].body) not in hoisted]
    new.end = ends[-1] if ends else None
    new.nested_once = {id(s) for stmt in body for s in statements_in(stmt) if id(names.orig(s)) in plan.nested_once}
    return new


def take_given(guards, stmt):
    """A statement training needs that generates or reads the clock, a uuid, the OS's entropy: rank 0 runs it,
    and every rank gets the values it binds that training reads (nbddp_share_values, after the barrier)."""
    names = guards.shares[id(stmt)]
    calls = guards.calls.get(id(stmt)) or live_calls(stmt)
    why = [r for r in map(guards.reason, calls) if r]
    own = [parts(code_of(c.func))[-1] for c in calls if OWN_VALUE in guards.effects.of_call(c)]
    word = why[0][2] if why else own[0] if own else _started(calls, guards.names).removesuffix("()") if calls \
        else "rank 0"
    guards.taken[id(stmt.body)] = (frozenset().union(*(k for k, _, _ in why)) | {GIVEN}, word)
    guards.sharing[id(stmt.body)] = names
    them = "it" if len(names) == 1 else "them"
    later = "line reads" if guards.options.whole else "cell may read"  # (%ddp: the later cells are unknown)
    guards.reasons.setdefault(guards.cell, []).append(
        f"{why[0][1] + ', ' if why else ''}every rank gets rank 0's {', '.join(names)} " + (
            f"(`{_started(calls, guards.names)}` starts a program: once)" if id(stmt) in guards.results else
            f"(a later {later} {them})" if id(stmt) in guards.later else
            f"(training reads {them}; each rank would compute {'its' if len(names) == 1 else 'their'} own)"))
    guards.tainted |= reads_writes(stmt)[1] - set(names)
    return TAKE


def _started(calls, names) -> str:
    """How the report shows the program a line starts: `!cmd` for IPython's `x = !cmd`, else the starting call's
    name (`check_output()`)."""
    captured = next((c for c in calls if isinstance(c.func, cst.Name) and c.func.value == CAPTURED and c.args), None)
    if captured is not None and isinstance(captured.args[0].value, cst.SimpleString):
        return f"!{captured.args[0].value.evaluated_value}"
    start = next((c for c in calls if started(names.meanings(c.func))), calls[0])
    return f"{parts(code_of(start.func))[-1]}()"


def _assigned(stmt) -> set[str]:
    """The names a line binds by assignment (`run = namer.slug()`), not those a call or an attribute changes."""
    smalls = stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ()
    return {t.target.value for small in smalls if isinstance(small, cst.Assign) for t in small.targets
            if isinstance(t.target, cst.Name)} | {small.target.value for small in smalls if isinstance(
                small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value is not None}


def _line_of(tree):
    """stmt -> the line in its cell where a statement the plan read starts (one code generation, when first asked)."""
    lines = functools.cache(lambda: statement_lines(tree.first.body))

    def line(stmt):
        starts, cells = lines()
        where = cells.at(starts.get(tree.names.orig(stmt), 0))
        return where[1] if where else None
    return line


def _objects(module) -> set[str]:
    """The names whose attributes the notebook reads (`metric.compute`, `codec.to(...)`): objects, no plain values."""
    found: set[str] = set()

    class _Bases(cst.CSTVisitor):
        def visit_Attribute(self, node):
            if isinstance(node.value, cst.Name):
                found.add(node.value.value)

    walk(module, _Bases())
    return found


def _calls(stmt, name) -> bool:
    """The statement is a call of the runtime's `name` alone."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    return isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and \
        isinstance(small.value.func, cst.Name) and small.value.func.value == name


def given_names(stmt) -> set[str]:
    """The names a `nbddp_share_values(globals(), "a", ...)` line gives every rank."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    call = small.value if isinstance(small, cst.Expr) else None
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == GIVE):
        return set()
    return {a.value.evaluated_value for a in call.args if isinstance(a.value, cst.SimpleString)}
