"""Step: what the notebook does once (save, write a file, push, generate, display, log to a tracker, print) runs on
global rank 0.

Each run of such statements becomes `if NBDDP_IS_MAIN: ...`, followed by `nbddp_barrier("<what>")` where other ranks
may depend on it (a saved folder) or where rank 0 may take long (generation): at the top level every guard but a
tracker's gets one; inside loops and function bodies, only guards of saving, pushing and generation (a barrier per
logged step would cost every step). What a statement does is nbddp.effects': through the notebook's own functions,
lambdas, `partial`s and methods. A function that only saves, generates or logs is rank-0 work where it is called;
one that also does work every rank must do (train, evaluate, load, a collective) runs on every rank, and its own
rank-0 statements are guarded where they stand, as are those in loops. A collective inside what prints or logs
(`print(trainer.evaluate())`) is first bound to a temporary on every rank (nbddp.transforms.hoist). Values made
under a guard exist on rank 0 only, so later statements that read them are guarded too. `if False:` blocks are left
alone, and code already under a rank test gets no second guard."""
from __future__ import annotations

import libcst as cst

from ..alone import loop_names, own_names
from ..cells import starts_cell
from ..cst_helpers import (DESCEND, LEAVE, TAKE, arguments, code_of, is_if_false, leaves_block, live_calls, names_in,
                           regroup, statement_blocks)
from ..inside import is_hooks
from ..ran_files import said
from ..runtime import HELPERS
from ..training_end import IN_RANK_BLOCK, REST
from ..rank_conditions import RANK, is_rank_test, reads_rank
from ..reads_writes import header_of, reads_writes
from ..vocabulary import DISPLAY, GENERATE, MEMORY, OPEN, PUSH, SAVE, TRACK, exchanges, is_generation_pipeline, parts
from .base import TreeStep
from .block_reads import read_after
from .callbacks import callback
from .rank_blocks import is_rank_block
from .hoist import hoist
from .whole import GIVE, GIVEN, SAME, SHARE, after_guard, alone, apply_plan, given_names, on_body, take_given

USES = "uses"
ONCE = "once"  # training does not need it (nbddp.needs)
VERBS = {SAVE: "saves", PUSH: "pushes", GENERATE: "generates", DISPLAY: "displays", MEMORY: "reads GPU memory",
         TRACK: "logs"}


def _is_print(stmt, names) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, cst.Call)
            and "builtins.print" in names.meanings(stmt.body[0].value.func))


def _rank0_return(stmt):
    """`return model.generate(x)` -> `return model.generate(x) if NBDDP_IS_MAIN else None`; None for other statements
    (a `break` stays on every rank) and for a return that is already so."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    if not isinstance(small, cst.Return) or small.value is None:
        return None
    value = small.value
    if isinstance(value, cst.IfExp) and isinstance(value.test, cst.Name) and value.test.value == "NBDDP_IS_MAIN":
        return None
    if isinstance(value, (cst.Tuple, cst.Lambda, cst.IfExp, cst.NamedExpr)) and not value.lpar:
        value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    guarded = cst.IfExp(test=cst.Name("NBDDP_IS_MAIN"), body=value, orelse=cst.Name("None"))
    return stmt.with_changes(body=[small.with_changes(value=guarded)])


class _Guards:
    """The walk over one tree: which statements to guard, and the report, cell by cell."""

    def __init__(self, tree, ctx):
        self.tree, self.names, self.report, self.options = tree, tree.names, ctx.report, ctx.options
        self.effects, self.cell = tree.effects, None
        self.tainted: set[str] = set()  # names bound on rank 0 only, so far in the notebook
        self.read_after: dict = {}  # id of a line in a block -> what the block's other lines read after it
        self.taken: dict = {}  # id of a taken statement's body (regroup moves its leading lines) -> (kinds, what)
        self.reasons: dict = {}  # cell -> what its guards hold, in order
        self.used: dict = {}  # cell -> rank-0-only names read under its guards
        self.waits: set = set()  # cells with a barrier after a guard
        self.hoisted: set = set()  # ids of the bodies of statements that show a collective's result (hoist.py)
        self.once: set = set()  # ids of top-level statements training does not need (nbddp.needs)
        self.nested_once: set = set()  # ids of effect-only lines in blocks and functions, and their holders (needs)
        self.files: dict = {}  # id of a top-level save whose files training reads later -> paths (nbddp.needs)
        self.for_machines, self.machine_cells = {}, set()  # the body of such a save, taken -> its paths; their cells
        self.rest: set = set()  # ids of the statements after training's end: rank 0 runs them alone
        self.unneeded: dict = {}  # cell -> what its statements training does not need do (the report's words)
        self.calls: dict = {}  # id of a top-level statement -> its live calls (nbddp.needs read them)
        self.libraries, self.packages = set(), set()  # training's own objects' libraries, the imports (nbddp.needs)
        self.shares: dict = {}  # id of a top-level statement rank 0 runs for every rank -> the names it gives them
        self.sharing: dict = {}  # id of the body of such a statement, taken -> those names
        self.results, self.later = {}, {}  # of those, a program's kept result; a %ddp cell's loop's names (alone)
        self.once_why = "training does not need it"  # the report's words for `once` (no training's end: nbddp.alone)

    def reason(self, call):
        """(kinds, what the report says, the barrier's word) of a call that is rank-0 work, else None."""
        if not self.effects.main_only(call):
            return None
        kinds = self.effects.of_call(call)
        name = parts(code_of(call.func))[-1]
        handed = [a.value for a in call.args if isinstance(a.value, cst.Attribute)
                  and GENERATE in self.effects.of_call(cst.Call(a.value))]  # Thread(target=model.generate)
        if handed:
            return kinds, f"{name}({code_of(handed[0])})", handed[0].attr.value
        if self.effects.helper(call):
            verbs = [VERBS[k] for k in sorted(kinds) if k in VERBS]
            return kinds, f"{name}(), which {' and '.join(verbs)}", name
        if MEMORY in kinds:
            return kinds, "GPU memory stats", name
        meanings = self.names.meanings(call.func)
        if OPEN in meanings:  # a file write at a known path (is_file_write)
            return kinds, f"writes {code_of(arguments(call, 'file')[0])}", name
        task = self.names.literal(arguments(call, "task")[0])
        if is_generation_pipeline(meanings, task):
            return kinds, f"pipeline({task!r})", name
        if TRACK in kinds:  # wandb.init, writer.add_scalar: the tracker's own name says more
            name = ".".join(parts(code_of(call.func))[-2:])
        return kinds, name, name.split(".")[-1]

    def select(self, stmt, nested):
        self.cell = starts_cell(stmt) or self.cell
        self.tree.at = stmt
        if not nested and id(stmt) in self.rest:
            return LEAVE
        if not nested and id(stmt) in self.shares and not leaves_block(stmt):
            return take_given(self, stmt)
        given = given_names(stmt)
        if given:  # converting converted code: what rank 0 gave every rank exists everywhere
            self.tainted -= given
            return LEAVE
        if not nested and id(stmt) in self.once and not leaves_block(stmt):  # else rank 0 alone skips what follows
            return self.unneeded_work(stmt, self.calls[id(stmt)])
        if nested and id(stmt) in self.nested_once and isinstance(stmt, cst.SimpleStatementLine):
            return self.unneeded_work(stmt, live_calls(stmt))
        reads, writes = reads_writes(stmt)
        if isinstance(stmt, cst.FunctionDef):
            self.tainted -= writes
            return self.function(stmt) if self.effects.mixed(stmt, self.options.main_prints) or \
                id(stmt) in self.nested_once else LEAVE
        if isinstance(stmt, cst.ClassDef):
            self.tainted -= writes
            if self.libraries and is_hooks(stmt, self.names):  # a trainer calls its methods on every rank
                return callback(self, stmt)
            return DESCEND if any(isinstance(s, cst.FunctionDef) and self.effects.mixed(s, self.options.main_prints)
                                  for s in stmt.body.body) else LEAVE
        if is_if_false(stmt):
            self.tainted -= writes
            return LEAVE
        if is_rank_test(stmt, self.names) or is_rank_block(stmt):  # the notebook's own rank logic, as written
            self.tainted |= writes
            return LEAVE
        calls = live_calls(stmt) if nested or id(stmt) not in self.calls else self.calls[id(stmt)]
        blocks = statement_blocks(stmt)
        headers = header_of(stmt)
        header_calls = [c for h in headers for c in live_calls(h)]
        header_reads = set().union(*(reads_writes(h)[0] for h in headers)) if blocks else reads
        why = [r for r in map(self.reason, header_calls if blocks else calls) if r]
        collective = any(self.effects.collective(c) for c in calls)
        if why and (blocks or headers) and collective:  # a one-line `with ...: trainer.train()` too
            if blocks and isinstance(stmt, cst.With) and all(kinds <= {TRACK} for kinds, _, _ in why):
                return self.tracked(stmt)
            self.report.warn(self.cell, f"{why[0][2]}(...) opens a block that also does work every rank must do; it "
                                        "runs on every rank: put what it writes or prints under `if NBDDP_IS_MAIN:`")
            return DESCEND
        if header_reads & self.tainted:
            if not why and collective:  # a collective given rank 0's value (a broadcast): every rank's after it
                shared = {n for c in calls if exchanges(self.names.meanings(c.func)) for n in names_in(c)}
                if not header_reads & self.tainted <= shared:
                    self.report.warn(self.cell, f"uses {', '.join(sorted(header_reads & self.tainted))}, which only "
                                     "rank 0 computed, in work every rank must do; left unguarded: compute it where "
                                     "every rank runs it (outside the rank-0 part)")
                self.tainted -= writes | shared
                return LEAVE
            self.used.setdefault(self.cell, set()).update(header_reads & self.tainted)
            why.append((frozenset({USES}), "", ""))
        if not blocks and self.options.main_prints and _is_print(stmt, self.names) and not collective and \
                RANK not in reads_rank(stmt, self.names):  # `print(dist.get_rank())`: each rank says its own
            why.append((frozenset({"print"}), "print", "print"))
        if why and leaves_block(stmt):  # guarded whole, rank 0 would skip what follows (a barrier: a hang)
            if blocks:
                return DESCEND
            returned = _rank0_return(stmt)
            if returned is not None:
                self.reasons.setdefault(self.cell, []).extend(text for k, text, _ in why if USES not in k)
            return returned or LEAVE
        if why and nested and writes & self.read_after.get(id(stmt), set()) and all(USES not in k for k, _, _ in why):
            self.tainted -= writes  # a value the block goes on with: every rank computes it (transforms.block_reads)
            return LEAVE
        if why:
            if not nested and id(stmt) in self.files:
                self.for_machines[id(stmt.body)] = self.files[id(stmt)]
            self.taken[id(stmt.body)] = (frozenset().union(*(k for k, _, _ in why)), why[0][2])
            self.reasons.setdefault(self.cell, []).extend(text for k, text, _ in why if USES not in k)
            self.tainted |= writes
            return TAKE
        own = own_names(stmt)  # `with open(p) as fh:`, `for row in rows:`: names made anew on every rank
        self.tainted -= own
        if blocks and (any(self.reason(c) for c in calls) or reads & self.tainted or self._prints_in(blocks) or
                       id(stmt) in self.nested_once):
            return DESCEND
        self.tainted -= writes
        return LEAVE

    def unneeded_work(self, stmt, calls):
        """A statement training does not need: rank 0 runs it, whatever it calls."""
        why = [r for r in map(self.reason, calls) if r]
        kinds = frozenset().union(*(k for k, _, _ in why)) | {ONCE}
        named = [text for _, text, _ in why] or list(filter(None, map(self._named, calls)))[:1]
        self.taken[id(stmt.body)] = (kinds, why[0][2] if why else named[0] if named else "rank 0")
        if id(stmt) in self.files:
            self.for_machines[id(stmt.body)] = self.files[id(stmt)]
        self.reasons.setdefault(self.cell, []).extend(named)
        self.unneeded.setdefault(self.cell, set()).update(named)
        self.tainted |= reads_writes(stmt)[1]
        return TAKE

    def _named(self, call):
        """What the report calls a call rank 0 runs: `%run prep.py`, else its name; None for Python's (but print) and
        nbddp's own."""
        if said(call, self.names) or not any(m.startswith(("builtins.", "nbddp_")) and m != "builtins.print"
                                             for m in self.names.meanings(call.func)):
            return said(call, self.names) or parts(code_of(call.func))[-1]
        return None

    def tracked(self, stmt: cst.With):
        """`with mlflow.start_run():` around training: the tracker's context on rank 0 (`nbddp_no_context()` on the
        others, so `as run` is None there and what reads it is guarded), the block itself on every rank."""
        items = []
        for item in stmt.items:
            why = self.reason(item.item) if isinstance(item.item, cst.Call) else None
            if why:
                self.reasons.setdefault(self.cell, []).append(f"{why[1]}(...) as a context, the block on every rank")
                guarded = cst.IfExp(test=cst.Name("NBDDP_IS_MAIN"), body=item.item,
                                    orelse=cst.Call(cst.Name("nbddp_no_context")),
                                    lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
                item = item.with_changes(item=guarded)
            if item.asname is not None and isinstance(item.item, cst.IfExp):
                self.tainted |= reads_writes(item)[1]
            items.append(item)
        body = regroup(stmt.body.body, self.select, self.wrap, True, self.names.origin)
        return stmt.with_changes(items=items, body=stmt.body.with_changes(body=body))

    def _prints_in(self, blocks) -> bool:
        """A block that shows what a collective returned (`for d in sets: print(trainer.evaluate(d))`)."""
        return self.options.main_prints and any(id(s.body) in self.hoisted for b in blocks for s in b.body)

    def function(self, node: cst.FunctionDef):
        """A function that does work every rank must do and rank-0 work: its body guarded where it stands (its
        local names do not taint the notebook's)."""
        outer = set(self.tainted)
        body = regroup(node.body.body, self.select, self.wrap, True, self.names.origin)
        self.tainted = outer
        return node.with_changes(body=node.body.with_changes(body=body))

    def wrap(self, group, nested):
        kinds = frozenset().union(*(self.taken[id(s.body)][0] for s in group))
        guard = cst.If(test=cst.Name("NBDDP_IS_MAIN"), body=cst.IndentedBlock(body=group))
        paths = sorted({p for s in group for p in self.for_machines.get(id(s.body), ())})  # saved, then loaded
        if (TRACK in kinds and kinds <= {TRACK, USES}) or (nested and not kinds & {SAVE, PUSH, GENERATE, GIVEN}):
            return [guard]  # nothing another rank waits for, or a barrier on every pass of a loop
        self.waits.add(self.cell)
        words = [self.taken[id(s.body)] for s in group if self.taken[id(s.body)][1]]  # (kinds, word)
        what = next((w for k, w in words if k & {SAVE, PUSH, GENERATE}), words[0][1] if words else None)
        calls = [c for s in group for c in live_calls(s)  # the notebook's own, not the runtime's helpers
                 if not (isinstance(c.func, cst.Name) and c.func.value in HELPERS)]
        what = what or (parts(code_of(calls[0].func))[-1] if calls else "rank 0")
        given = [name for s in group for name in self.sharing.get(id(s.body), ())]
        if paths and not given:
            self.machine_cells.add(self.cell)
        return [guard, *after_guard(what, given, paths)]

    def say(self):
        for cell in sorted(set(self.reasons) | set(self.used), key=lambda c: c or 0):
            said, once = list(dict.fromkeys(self.reasons.get(cell, ()))), self.unneeded.get(cell)
            alike = once is not None and all(text in once for text in said)  # else each says which it is
            shown = ", ".join(text + (f" ({self.once_why})" if once and text in once and not alike else "")
                              for text in said)
            text = "rank 0 only" + (f" ({self.once_why})" if alike else "") + (f": {shown}" if shown else "")
            if self.used.get(cell):
                text += f"; also what reads {', '.join(sorted(self.used[cell]))} (exists on rank 0 only)"
            if cell in self.machine_cells:
                text += ("; every rank loads what it saves next: machines that do not see rank 0's storage get a "
                         "copy")
            self.report.change(cell, text + ("; the other ranks wait at a barrier" if cell in self.waits else ""))


class RankGuards(TreeStep):
    name = "rank-guards"
    inserts = ("NBDDP_IS_MAIN", "nbddp_barrier", "nbddp_no_context", SHARE, GIVE, SAME, REST, IN_RANK_BLOCK)

    def run(self, tree, ctx):
        guards = _Guards(tree, ctx)
        module = hoist(tree, ctx, guards.effects, guards.hoisted)
        body, guards.read_after = list(module.body), read_after(module, guards.effects, tree.names)
        if ctx.options.whole:
            body = apply_plan(body, guards, tree, ctx)
        else:  # a %ddp session's cell: later cells unknown, what only acts outside the process is rank 0's, and a
            # loop's variable (or a `with`'s `as`), which a later cell may read, is rank 0's on every rank after it
            plan = on_body(tree.plan, tree.first.body, body, tree.names, guards.hoisted)
            guards.calls, plan.alone = plan.calls, {id(s): plan.alone[id(s)] for s in body if id(s) in plan.alone}
            alone(guards, plan)
            guards.later = {id(s): sorted(loop_names(s)) for s in body if id(s) in plan.alone and loop_names(s)}
            guards.shares = {**plan.results, **guards.later}
        module = module.with_changes(body=regroup(body, guards.select, guards.wrap, origin=tree.names.origin))
        guards.say()
        return module
