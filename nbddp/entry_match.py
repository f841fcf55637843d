"""How a meaning matches the entries of nbddp.entries: `Table`, one kind's entries found by their last name, and the
trackers' rule (`is_tracker`)."""
from __future__ import annotations

from .entries import TRACKER_CLASSES, TRACKER_PACKAGES, VALUE_HOMES


def _segments(meaning: str) -> tuple:
    return tuple(meaning.split("."))


def _bare(segment: str) -> str:
    return segment.replace("()", "").replace("[]", "")


def _made(segment: str) -> bool:
    return segment.endswith(("()", "[]"))


class Table:
    """The entries of one kind, found by their last name. A qualified meaning (rooted in a package the notebook
    imports, Python's builtins or the notebook's own `__main__`) matches an entry of the same package: a class or a
    module's function by its name (`trl.trainer.sft_trainer.SFTTrainer` is `trl.SFTTrainer`), a class's function by
    the class and the function (`unsloth.FastLanguageModel.from_pretrained`), a method of one class's values by that
    class (`trl.SFTTrainer().train`), a method of the values a library makes (VALUE_METHODS) where the value was made
    in one of the entry's VALUE_HOMES. A meaning nbddp cannot follow (a name the notebook never binds, as in a cell
    converted alone; a loop variable; a parameter that no call of the notebook gives a value) matches by what is
    left: the method's name for a method of a value, the class and its function for a class's, the function's name
    for a module's (`match(meaning, known=False)`; nbddp.vocabulary also asks so for a value that a library without
    entries made)."""

    def __init__(self, entries=(), values=(), owned=()):
        """`entries`: functions, classes, methods of one class's values; `values`: VALUE_METHODS; `owned`: functions
        of a class (`unsloth.FastLanguageModel.from_pretrained`)."""
        self.by_name: dict = {}
        for group, how in ((entries, FUNCTION), (values, VALUE), (owned, OWNED)):
            for entry in group:
                self.by_name.setdefault(entry.rsplit(".", 1)[-1], []).append((_segments(entry), how))

    def match(self, meaning: str, known: bool) -> bool:
        found = self.by_name.get(meaning.rsplit(".", 1)[-1])
        return bool(found) and any(_matches(_segments(meaning), entry, how, known) for entry, how in found)


FUNCTION, VALUE, OWNED = "function", "value", "owned"


def _matches(m: tuple, e: tuple, how: str, known: bool) -> bool:
    value = how == VALUE
    if not known:
        if value or (len(e) > 2 and _made(e[-2])):  # a method of a value: its name
            return len(m) > 1
        if how == OWNED:  # a class's function: the class's name and the function's
            return len(m) > 1 and _bare(m[-2]) == e[-2]
        return True  # a module's function or a class: its name
    if value:
        homes = VALUE_HOMES.get(e[0], frozenset({e[0]}))
        return m[0] in homes and len(m) > 2 and any(map(_made, m[1:-1]))
    if m[0] != e[0] or len(m) < 2:
        return False
    if how == OWNED:  # the class and its function, wherever in the package the class lives
        return m[-2:] == e[-2:]
    made = next((i for i, segment in enumerate(e) if _made(segment)), None)  # a method of one class's values
    return made is None or m[-(len(e) - made):] == e[made:]  # else a class or a module's function: its name


def is_tracker(meaning: str, known: bool) -> bool:
    """A tracker's function or a value it made (`wandb.init().log`), or a SummaryWriter's (`writer.add_scalar`)."""
    m = _segments(meaning)
    return m[0] in TRACKER_PACKAGES or any(
        (m[0] == entry.split(".")[0] or not known) and _bare(segment) == entry.rsplit(".", 1)[-1]
        for entry in TRACKER_CLASSES for segment in m)
