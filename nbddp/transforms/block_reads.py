"""Part of the rank-guards step: what the other lines of a block read after a line (in a loop's block, also the lines
before it, which run again), leaving out the lines that are rank-0 work by the vocabulary alone (a print, a tracker's
log) and `return` lines. A line inside a loop or a function that is rank-0 work (`acc = check(model)`, whose function also writes a
file) but binds a value such a line reads (`if acc > 0.9: break`) runs on every rank: each rank needs the value, and
the runtime's one writer keeps what the line writes once."""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import statement_blocks
from ..reads_writes import reads_writes
from ..walk import walk


class _Blocks(cst.CSTVisitor):
    def __init__(self, effects, names):
        self.effects, self.names, self.found = effects, names, {}

    def _rank_0(self, stmt) -> bool:
        """A line of calls that are rank-0 work by the vocabulary (a print too: `print(tok.decode(out[0]))`); a `return`
        (what rank-0 work gives back is rank 0's there: the others get None, nbddp.transforms.rank_guards)."""
        smalls = stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ()
        return any(isinstance(small, cst.Return) for small in smalls) or bool(smalls) and all(
            isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and (
                self.effects.main_only(small.value) or "builtins.print" in self.names.meanings(small.value.func))
            for small in smalls)

    def on_visit(self, node):
        if isinstance(node, cst.BaseCompoundStatement):
            loop = isinstance(node, (cst.For, cst.While))
            for block in statement_blocks(node, defs=True):
                lines = list(block.body)
                reads = [set() if self._rank_0(s) else reads_writes(s)[0] for s in lines]
                for at, stmt in enumerate(lines):
                    self.found[id(stmt)] = set().union(*reads[at + 1:], *(reads[:at] if loop else ()))
        return True


def read_after(module, effects, names) -> dict:
    """id of each line inside a block -> the names the block's other lines read after it (see the module)."""
    blocks = _Blocks(effects, names)
    walk(module, blocks)
    return blocks.found
