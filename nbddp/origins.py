"""Where a step remakes statements outside a TreeTransformer's own leave methods (which record every node they
replace): each new statement recorded as the one the analysis read (nbddp.meanings.Names.origin), so later steps and
the plan (nbddp.tree.Tree.plan) still know it."""
from __future__ import annotations

from .cst_helpers import statements_in


def same_statements(names, old, new):
    """`new` is `old` with an expression replaced: each statement in `new` is recorded as its counterpart in `old`."""
    before, after = statements_in(old), statements_in(new)
    if len(before) == len(after):
        for was, now in zip(before, after):
            if was is not now:
                names.origin[now] = names.orig(was)
