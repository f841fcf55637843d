"""Step: the body of the notebook's own test of the rank (`if dist.get_rank() == 1:`, by what it reads:
nbddp.rank_conditions; not one only rank 0 passes) that calls what the runtime's nets act on runs under
`with nbddp_rank_block():`, so what it writes there, the ranks the notebook picked write as it says: the runtime's
nets (one writer for saves, a rank's own copy of the notebook's files and databases, logging's senders on rank 0
only: runtime/one_writer.py, runtime/files.py) are for code written for one process."""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import leaves_block, live_calls
from ..rank_conditions import OWN, RANK_ZERO, is_rank_test, node_reads
from ..runtime import NETTED
from ..training_end import is_own_test
from ..tree import TreeTransformer
from ..vocabulary import SAVE
from .base import TreeStep

BLOCK = "nbddp_rank_block"


def _picks_rank_0(test, names, depth=0) -> bool:
    """A test that only rank 0 (of the job, or of each machine) passes, where the nets write anyway: a main-process
    flag of a value that tells the rank (`acc.is_main_process`, `trainer.is_world_process_zero()`), the runtime's
    own, a name bound to one, or `<rank> == 0`."""
    if is_own_test(test):  # nbddp's own guard (a logging handler's: rank 0, or the rank a test of the notebook picks)
        return True
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _picks_rank_0(test.left, names, depth) or _picks_rank_0(test.right, names, depth)
    if isinstance(test, cst.Call):
        test = test.func
    if isinstance(test, cst.Attribute):  # a flag of a value accelerate or a trainer made (by meaning)
        return test.attr.value in RANK_ZERO and bool(node_reads(test, names))
    if isinstance(test, cst.Name) and test.value in OWN:  # the runtime's own names
        return test.value in RANK_ZERO
    if isinstance(test, cst.Name) and depth < 4:  # any other name: by the value it holds
        value = names.value(test)
        return value is not None and _picks_rank_0(value, names, depth + 1)
    return _with_0(test, cst.Equal)


def _with_0(test, operator) -> bool:
    """`<x> == 0` (or `0 != <x>`, as the operator says)."""
    return isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and \
        isinstance(test.comparisons[0].operator, operator) and \
        any(isinstance(side, cst.Integer) and side.value == "0" for side in (test.left, test.comparisons[0].comparator))


def _leaves_rank_0(test, names) -> bool:
    """The `else` of a test that leaves only rank 0 out (`not acc.is_main_process`, `rank != 0`): rank 0's branch."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _picks_rank_0(test.expression, names)
    return _with_0(test, cst.NotEqual)


def is_rank_block(stmt) -> bool:
    """`with nbddp_rank_block():`: what the notebook's own test of the rank lets some ranks run, as written."""
    first = stmt.items[0].item if isinstance(stmt, cst.With) else None
    return isinstance(first, cst.Call) and isinstance(first.func, cst.Name) and first.func.value == BLOCK


def _blocked(body) -> bool:
    """Converting converted code: the body is already the runtime's block."""
    stmts = body.body if isinstance(body, cst.IndentedBlock) else ()
    return len(stmts) == 1 and is_rank_block(stmts[0])


class _Blocks(TreeTransformer):
    def __init__(self, tree, ctx):
        super().__init__(tree, ctx)
        self.top = {id(stmt) for stmt in tree.module.body}
        self.acting = {id(stmt) for stmt in tree.module.body if any(map(self._acts, tree.calls_in(stmt)))}

    def _acts(self, call) -> bool:
        """A call one of the runtime's nets for code written for one process acts on: a save or file write, a call of
        a library the runtime says its nets intercept (runtime.NETTED: a log record sent away, a database)."""
        return SAVE in self.tree.effects.of_call(call) or any(
            m.split(".")[0] in NETTED for m in self.names.meanings(call.func))

    def on_visit(self, node):
        if id(node) in self.top and id(node) not in self.acting:
            super().on_visit(node)
            return False  # a top-level statement none of whose calls the nets act on
        return super().on_visit(node)

    def leave_If(self, original, updated):
        if not is_rank_test(original, self.names):
            return updated
        body = self._block(original.body, updated.body, _picks_rank_0(original.test, self.names))
        orelse = updated.orelse  # an `else:`: the ranks the test leaves out (an `elif` is a test of its own)
        if isinstance(orelse, cst.Else):
            orelse = orelse.with_changes(body=self._block(original.orelse.body, orelse.body,
                                                          _leaves_rank_0(original.test, self.names)))
        if body is updated.body and orelse is updated.orelse:
            return updated
        self.report.change(self.cell, "a test of the rank of the notebook's own: what its block saves, writes and "
                                      "logs, the ranks it picks do as written (nbddp_rank_block)")
        return updated.with_changes(body=body, orelse=orelse)

    def leave_FunctionDef(self, original, updated):
        """A function a decorator runs on the processes it picks (accelerate's `on_process(process_index=1)`,
        `on_last_process`): its body under `with nbddp_rank_block():` where those are not rank 0 alone."""
        picking = self.tree.effects.picking(original)
        if not picking or any(_picks_rank_0(d, self.names) for d in picking):
            return updated
        body = self._block(original.body, updated.body, False)
        if body is updated.body:
            return updated
        self.report.change(self.cell, f"{updated.name.value}: a decorator runs it on the processes it picks: what it "
                                      "saves, writes and logs, they do as written (nbddp_rank_block)")
        return updated.with_changes(body=body)

    def leave_IndentedBlock(self, original, updated):
        """After the notebook's own test of the rank that leaves the block (`if dist.get_rank() != 1: return`), the
        rest of the block is what the ranks it lets through run: under `with nbddp_rank_block():` where those are not
        rank 0 alone and the rest calls what the nets act on."""
        at = next((i for i, stmt in enumerate(original.body) if isinstance(stmt, cst.If) and stmt.orelse is None and
                   is_rank_test(stmt, self.names) and leaves_block(stmt)), None)
        if at is None or at + 1 == len(updated.body) or _leaves_rank_0(original.body[at].test, self.names):
            return updated
        rest = cst.IndentedBlock(list(updated.body[at + 1:]))
        block = self._block(cst.IndentedBlock(list(original.body[at + 1:])), rest, False)
        if block is rest:
            return updated
        self.report.change(self.cell, "a test of the rank of the notebook's own that leaves its block: what follows "
                                      "it, the ranks it lets through save, write and log as written (nbddp_rank_block)")
        return updated.with_changes(body=[*updated.body[:at + 1], *block.body])

    def _block(self, original, updated, rank_0):
        """A branch's body under `with nbddp_rank_block():` where ranks other than 0 run it and it calls what the
        nets act on; else as it is."""
        if rank_0 or _blocked(updated) or not any(map(self._acts, live_calls(original))):
            return updated
        block = updated if isinstance(updated, cst.IndentedBlock) else \
            cst.IndentedBlock([cst.SimpleStatementLine(list(updated.body))])
        return cst.IndentedBlock([cst.With(items=[cst.WithItem(cst.Call(cst.Name(BLOCK)))], body=block)])


class RankBlocks(TreeStep):
    name = "rank-blocks"
    inserts = (BLOCK,)
    rewriter = _Blocks
