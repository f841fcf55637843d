"""Conditions that pick one process: an `if` that tests the rank, so its body already runs per process (the rank
guards, nbddp.needs and the other steps leave it as it is)."""
from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .cst_helpers import names_in

# Names that only ever appear in a test that picks one process: code under such an `if` is already guarded.
RANK_NAMES = frozenset({
    "NBDDP_IS_MAIN", "NBDDP_RANK", "NBDDP_LOCAL_RANK", "is_main_process", "is_local_main_process",
    "is_world_process_zero", "is_main", "get_rank", "rank", "local_rank", "global_rank", "RANK",
    "LOCAL_RANK", "process_index", "local_process_index", "should_save",
})
RANK_VARIABLES = frozenset({"RANK", "LOCAL_RANK"})  # torchrun's environment


def is_rank_test(node, names=None) -> bool:
    """An `if` whose test mentions a rank or main-process flag, or reads the launcher's rank from the environment
    (`os.environ["RANK"]`, `os.getenv("LOCAL_RANK")`), also through the values of the names it reads where `names`
    (nbddp.meanings.Names) is given (`main = int(os.environ["RANK"]) == 0`, then `if main:`): its body is already
    per-process."""
    return isinstance(node, cst.If) and _is_rank_expr(node.test, names, 0)


def _is_rank_expr(expr, names, depth) -> bool:
    strings = {s.evaluated_value for s in m.findall(expr, m.SimpleString())}
    if names_in(expr) & RANK_NAMES or strings & RANK_VARIABLES:
        return True
    if names is None or depth >= 3:
        return False
    values = (names.value(name) for name in m.findall(expr, m.Name()))
    return any(value is not None and _is_rank_expr(value, names, depth + 1) for value in values)
