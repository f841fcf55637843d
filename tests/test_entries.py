"""The vocabulary's entries are library APIs by qualified name: each one imports where its library is installed
(nbddp.entries; the rank readers of nbddp.rank_conditions). No entry is a bare method name or a word."""
from __future__ import annotations

import importlib
import importlib.util

import pytest

from nbddp import entries, rank_conditions

TABLES = {
    "TRAINERS": entries.TRAINERS, "COLLECTIVES": entries.COLLECTIVES, "OWN_DISTRIBUTION": entries.OWN_DISTRIBUTION,
    "PASS_THROUGH": entries.PASS_THROUGH, "SEEDS": entries.SEEDS, "STATE_CLASSES": rank_conditions.STATE_CLASSES,
    "DISTRIBUTED": frozenset(rank_conditions.DISTRIBUTED),
}
ALL = sorted((table, entry) for table, names in TABLES.items() for entry in names)


def _resolve(entry: str):
    """The object an entry names: the longest importable module, then attributes (`Accelerator()` is the class)."""
    names = entry.replace("()", "").split(".")
    for cut in range(len(names), 0, -1):
        try:
            value = importlib.import_module(".".join(names[:cut]))
        except ImportError:
            continue
        for name in names[cut:]:
            value = getattr(value, name)
        return value
    raise ImportError(entry)


@pytest.mark.parametrize("table, entry", ALL, ids=[f"{t}:{e}" for t, e in ALL])
def test_every_entry_is_an_importable_qualified_name(table, entry):
    assert "." in entry, f"{table}: {entry} is a bare name"
    package = entry.split(".")[0]
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed here")
    assert callable(_resolve(entry)), entry


def test_a_meaning_matches_an_entry_by_package_and_name():
    assert entries.is_trainer("trl.trainer.sft_trainer.SFTTrainer") and entries.is_trainer("SFTTrainer")
    assert not entries.is_trainer("mylib.SFTTrainer") and not entries.is_trainer("trl.SFTTrainer()")
    assert entries.is_collective_entry("accelerate.state.PartialState().wait_for_everyone")
    assert not entries.is_collective_entry("mylib.Accelerator().wait_for_everyone")
    assert entries.library_of("unsloth.PatchFastRL") == "unsloth" and entries.library_of("ds.map()") is None
