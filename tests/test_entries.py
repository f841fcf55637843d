"""The vocabulary's entries are library APIs by qualified name: each one imports where its library is installed
(nbddp.entries; the rank readers of nbddp.rank_conditions). No entry is a bare method name or a word."""
from __future__ import annotations

import importlib
import importlib.util

import pytest

from nbddp import entries, rank_conditions
from nbddp.vocabulary import DATA, GENERATE, LOAD, SAVE, STEP, TRAINS, kinds

TABLES = {
    "TRAINERS": entries.TRAINERS, "COLLECTIVES": entries.COLLECTIVES, "OWN_DISTRIBUTION": entries.OWN_DISTRIBUTION,
    "PASS_THROUGH": entries.PASS_THROUGH, "SEEDS": entries.SEEDS, "PROCESS_STATE": entries.PROCESS_STATE,
    "STATE_CLASSES": rank_conditions.STATE_CLASSES,
    "DISTRIBUTED": frozenset(rank_conditions.DISTRIBUTED), "TORCH_COLLECTIVES": entries.TORCH_COLLECTIVES,
    "ADAPTERS": entries.ADAPTERS, "INFERENCE": entries.INFERENCE,
    "PER_PROCESS": entries.PER_PROCESS, "DEMOS": entries.DEMOS, "TRACKER_CLASSES": entries.TRACKER_CLASSES,
    "CHANGES_ARGUMENTS": entries.CHANGES_ARGUMENTS, "MAIN_FIRST": entries.MAIN_FIRST,
    "RUNS_CODE": entries.RUNS_CODE, "STARTS_PROGRAMS": entries.STARTS_PROGRAMS,
    "CLOCK_BY_VALUE": entries.CLOCK_BY_VALUE,
    **{f"SEED_KEYWORDS[{name}]": table for name, table in entries.SEED_KEYWORDS.items()},
    **{f"FUNCTIONS[{kind}]": table for kind, table in entries.FUNCTIONS.items()},
    **{f"VALUE_METHODS[{kind}]": table for kind, table in entries.VALUE_METHODS.items()},
}
ALL = sorted((table, entry) for table, names in TABLES.items() for entry in names)


def _resolve(entry: str):
    """The object an entry names: the longest importable module, then attributes; `X()` is a value X made: its class
    where X is one (`Accelerator().prepare` is the class's method), else X itself (the value of `prepare()`, of
    `from_pretrained()`, is not known before the call)."""
    names = entry.split(".")
    for cut in range(len(names), 0, -1):
        module = ".".join(names[:cut])
        try:
            value = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and not module.startswith(exc.name):  # it needs a package that is not installed here
                pytest.skip(f"{module}: {exc}")
            continue
        except ImportError as exc:  # the module needs an optional dependency that is not installed here
            pytest.skip(f"{module}: {str(exc).strip().splitlines()[0]}")
        for name in names[cut:]:
            value = getattr(value, name.replace("()", ""))
            if name.endswith("()") and not isinstance(value, type):
                return value
        return value
    raise ImportError(entry)


@pytest.mark.parametrize("table, entry", ALL, ids=[f"{t}:{e}" for t, e in ALL])
def test_every_entry_is_an_importable_qualified_name(table, entry):
    assert "." in entry, f"{table}: {entry} is a bare name"
    package = entry.split(".")[0]
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed here")
    try:
        found = _resolve(entry)
    except ImportError as exc:  # a lazy module's attribute that needs an optional dependency
        if "requires" not in str(exc):
            raise
        pytest.skip(str(exc).strip().splitlines()[0])
    assert callable(found), entry


def test_every_model_load_is_a_class_its_package_exports():
    """`LOADS`, over a thousand (transformers' model classes): each class is among the names its package exports,
    read from the package's own list without importing every model (each loads like any PreTrainedModel)."""
    missing, exported = [], {}
    for entry in sorted(entries.LOADS):
        package, *path, _ = entry.split(".")
        module = ".".join([package, *path[:-1]])
        if importlib.util.find_spec(package) is None:
            continue
        if module not in exported:
            exported[module] = set(dir(importlib.import_module(module)))
        if path[-1] not in exported[module]:
            missing.append(entry)
    assert not missing, missing[:10]


def test_a_meaning_matches_an_entry_by_package_and_name():
    assert entries.is_trainer("trl.trainer.sft_trainer.SFTTrainer") and entries.is_trainer("SFTTrainer")
    assert not entries.is_trainer("mylib.SFTTrainer") and not entries.is_trainer("trl.SFTTrainer()")
    assert TRAINS in kinds(["accelerate.state.PartialState().wait_for_everyone"], {"accelerate"})
    assert TRAINS not in kinds(["mylib.Accelerator().wait_for_everyone"], {"mylib"})
    assert entries.library_of("unsloth.PatchFastRL") == "unsloth" and entries.library_of("ds.map()") is None


@pytest.mark.parametrize("meaning, packages, found", [
    ("transformers.models.auto.modeling_auto.AutoModelForCausalLM.from_pretrained", {"transformers"}, LOAD),
    ("unsloth.FastLanguageModel.from_pretrained().generate", {"unsloth"}, GENERATE),  # a value Unsloth made
    ("trl.SFTTrainer().model.generate", {"trl"}, GENERATE),  # the trainer's model
    ("torch.optim.AdamW().step", {"torch"}, STEP),
    ("accelerate.Accelerator().unwrap_model().save_pretrained", {"accelerate"}, SAVE),  # accelerate's idiom
    ("FastLanguageModel.from_pretrained", set(), LOAD),  # a name never bound (a cell converted alone): by name
    ("model.generate", set(), GENERATE), ("opt.step", set(), STEP), ("trainer.train", set(), TRAINS),
])
def test_qualified_meanings_match_their_entries_and_names_never_bound_by_name(meaning, packages, found):
    assert found in kinds([meaning], packages)


@pytest.mark.parametrize("meaning, packages, absent", [
    ("transformers.AutoTokenizer.from_pretrained", {"transformers"}, LOAD),  # a tokenizer is no model
    ("AutoTokenizer.from_pretrained", set(), LOAD),
    ("other.FastLanguageModel.from_pretrained", {"other"}, LOAD),  # another library's class of the same name
    ("sklearn.linear_model.LogisticRegression().fit", {"sklearn"}, TRAINS),
    ("torch.nn.Linear().train", {"torch"}, TRAINS),  # a module's train mode
    ("transformers.get_linear_schedule_with_warmup().step", {"transformers"}, STEP),  # a scheduler
    ("torch.optim.lr_scheduler.LinearLR().step", {"torch"}, STEP),
    ("gym.make().step", {"gym"}, STEP), ("sklearn.ensemble.RandomForestClassifier().predict", {"sklearn"}, TRAINS),
])
def test_a_qualified_meaning_without_an_entry_is_nothing_of_the_kind(meaning, packages, absent):
    assert absent not in kinds([meaning], packages)


@pytest.mark.parametrize("meaning, found", [
    ("llama_index.packs.RAFTDatasetPack().run().to_json", SAVE),  # a dataset another library made
    ("llama_index.packs.RAFTDatasetPack().run().map", DATA),
    ("mylib.Sampler().generate", GENERATE),
])
def test_a_method_of_a_value_a_library_without_entries_made_is_matched_by_name_for_rank_0_work(meaning, found):
    assert found in kinds([meaning], {meaning.split(".")[0]})


@pytest.mark.parametrize("meaning", ["mylib.Estimator().fit", "gym.make().step", "mylib.Net().backward"])
def test_training_is_never_matched_by_name_for_such_a_value(meaning):
    assert not kinds([meaning], {meaning.split(".")[0]}) & {TRAINS, STEP, LOAD}


@pytest.mark.parametrize("module", sorted(entries.IN_PROCESS | entries.SENDS))
def test_every_in_process_library_is_a_package(module):
    """nbddp.entries.IN_PROCESS names packages (a module function of one, called for its effect, is set-up); so does
    SENDS (the libraries that send to other machines)."""
    if module not in entries.STANDARD and importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed here")
    assert "." not in module and importlib.import_module(module)
