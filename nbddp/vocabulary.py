"""What the notebook's calls do, by what they are: one vocabulary every conversion step uses.

A call is described by its *meanings* (nbddp.meanings.Names.meanings): the dotted paths its callee resolves to through
the notebook's imports, assignments, functions and calls, e.g. `unsloth.FastLanguageModel.from_pretrained` for
`FLM.from_pretrained` after `from unsloth import FastLanguageModel as FLM`, `builtins.map` for `map(...)`,
`datasets.load_dataset().map` for `ds.map(...)` after `ds = load_dataset(...)`, `__main__.f` for the notebook's own
`f`; a name the notebook never binds stays as written (`display`). `()` after a part marks a value made by calling it.
`kinds(meanings, packages)` answers what the call is, from the entries of nbddp.entries (matched as
nbddp.entry_match says: qualified where the notebook imports the package, by name where nbddp cannot follow the
value), as a set of:

LOAD (a model loader), PEFT (adapters), DATA (dataset loading, map, filter, split: main-process-first),
COLLECTIVE (work every rank must do together: a trainer's construction and its train/fit/evaluate/predict, a model
load, adapters, dataset work, torch.distributed's and accelerate's collectives, building an Accelerator or DDP, a
backward pass, an optimizer step), SYNC (the collectives but dataset work and set-up), TRAINS (of SYNC, what trains
or talks to every rank, not a model load: the last one ends training; nbddp.needs), SAVE, PUSH, GENERATE, DISPLAY,
PRINT, MEMORY (GPU memory stats), TRACK (an experiment tracker), BACKWARD, STEP (an optimizer's step), OWN_DDP (the
notebook distributes training itself), CONFIG (a trainer config), SEEDED (a split or shuffle, which takes a seed),
OWN_VALUE (a value each process computes for itself), AMP (the deprecated torch.cuda.amp), DEVICE (`.to`, `.cuda`,
`set_device`, `torch.device`).

`prompt(meanings, ...)` says whether a call asks the user for a value (input(), getpass(), a library's login).
MAIN_ONLY holds the kinds that run on global rank 0 only; LIGHT those that need no barrier after them inside loops
and function bodies (nothing another rank reads later).
"""
from __future__ import annotations

import sys
from functools import lru_cache

from .entries import (ADAPTERS, COLLECTIVES, ENTRY_ROOTS, FUNCTIONS, INFERENCE, LOADS, OWN_DISTRIBUTION, PER_PROCESS, PIPELINE,
                      TORCH_COLLECTIVES, TORCH_DISTRIBUTED_FACTS, TRAINER_WORK, TRAINERS, UNSLOTH_LOADERS, VALUE_METHODS,
                      is_entry, parts)
from .entry_match import Table, is_tracker

LOAD, PEFT, DATA, COLLECTIVE = "load", "peft", "data", "collective"
SAVE, PUSH, GENERATE, DISPLAY, PRINT, MEMORY, TRACK = "save", "push", "generate", "display", "print", "memory", "track"
BACKWARD, STEP, CONFIG, SYNC = "backward", "step", "config", "sync"
OWN_VALUE = "own-value"  # a value each process computes for itself (the clock, a uuid, entropy): nbddp.entries
RANK_LOGIC = "rank-logic"  # a function of the notebook's that reads the rank: what it does may depend on it
TRAINS = "trains"  # of SYNC: trains or talks to every rank (not a model load): the last such statement ends training
SEEDED, AMP, DEVICE = "seeded", "amp", "device"  # a split or shuffle; torch.cuda.amp; what names a device
DEVICE_MOVES = frozenset({"to", "cuda", "cpu"})  # a method that moves any value between devices (by its name)
ENV = "env"  # a statement that names CUDA_VISIBLE_DEVICES (nbddp.tree's statement facts)
OWN_DDP = "own-ddp"  # the notebook distributes training itself: torch's DDP or FSDP, accelerate, Lightning's Fabric
# Of the collectives, those that hand each rank the others' values (a broadcast, a gather, a reduction): what only
# rank 0 computed, given to one, is every rank's after it (nbddp.transforms.rank_guards)
EXCHANGES = (TORCH_COLLECTIVES - {"torch.distributed.barrier", "torch.distributed.monitored_barrier"}) | frozenset({
    "accelerate.utils.gather", "accelerate.utils.gather_object", "accelerate.utils.broadcast",
    "accelerate.utils.broadcast_object_list", "accelerate.utils.reduce", "accelerate.Accelerator().gather",
    "accelerate.Accelerator().gather_for_metrics", "accelerate.Accelerator().reduce", "lightning.Fabric().all_reduce",
    "lightning.Fabric().all_gather", "lightning.Fabric().broadcast"})


def exchanges(meanings) -> bool:
    """A call of one of EXCHANGES."""
    return any(is_entry(m, EXCHANGES) for m in meanings)


# Launchers that run the function they are given in processes of their own (nbddp.transforms.process_control runs
# it once on each rank instead): what the function does, the call does (nbddp.effects).
NOTEBOOK_LAUNCHERS = frozenset({"accelerate.notebook_launcher", "accelerate.launchers.notebook_launcher"})
MAIN_ONLY = frozenset({SAVE, PUSH, GENERATE, DISPLAY, PRINT, MEMORY, TRACK})
LIGHT = frozenset({DISPLAY, PRINT, MEMORY, TRACK})
OPEN = "builtins.open"  # open(path, mode): a write at a known path is a save (is_file_write)
DISPLAY_MODULE = "IPython.display"  # Audio, Image, Markdown… from here only display; datasets.Audio is data
PATH_KEYWORDS = ("pretrained_model_name_or_path", "model_name", "model_id", "save_directory", "output_dir",
                 "dataset_path", "file", "f", "path")  # where a saver takes its path by keyword
KNOWN = frozenset({"builtins", "__main__"})  # roots every notebook knows: Python's builtins, its own definitions

# kind -> the entries that have it (nbddp.entries: library APIs by qualified name), and what else a call of it is
TABLES = {kind: Table(FUNCTIONS.get(kind, ()), VALUE_METHODS.get(kind, ())) for kind in (
    DATA, SEEDED, SAVE, PUSH, GENERATE, BACKWARD, STEP, MEMORY, CONFIG, DEVICE)}
TABLES[LOAD], TABLES[PEFT] = Table(owned=LOADS), Table(FUNCTIONS[PEFT], owned=ADAPTERS)
TABLES[GENERATE] = Table(FUNCTIONS[GENERATE], VALUE_METHODS[GENERATE], owned=INFERENCE)
TOGETHER = Table(TRAINERS | {f"{t}().{work}" for t in TRAINERS for work in TRAINER_WORK} | COLLECTIVES |
                 TORCH_COLLECTIVES)
ALSO = {LOAD: {COLLECTIVE, SYNC}, PEFT: {COLLECTIVE, SYNC}, DATA: {COLLECTIVE}, BACKWARD: {COLLECTIVE, SYNC, TRAINS},
        STEP: {COLLECTIVE, SYNC, TRAINS}}
# The kinds a method of a value a library nbddp has no entries for made is matched by name for (it may be a dataset,
# a model, a DataFrame): those that put work on rank 0 or order it; training itself needs a qualified entry.
BY_NAME = (SAVE, PUSH, GENERATE, DATA, SEEDED)
ENTRY_PACKAGES = frozenset(sys.stdlib_module_names) | ENTRY_ROOTS | KNOWN
UNSLOTH = Table(owned=frozenset(f"{cls}.{name}" for cls in UNSLOTH_LOADERS for name in ("from_pretrained",
                                                                                        "get_peft_model")))


@lru_cache(maxsize=None)
def _kinds_of(meaning: str, known: bool) -> frozenset:
    """What a call of `meaning` is; `known`: its root is a package the notebook imports, Python's builtins or the
    notebook's own `__main__` (else a value nbddp cannot follow, matched by name: nbddp.entries.Table)."""
    if meaning.endswith(("()", "[]")):  # calling a value a call made (`tokenizer(...)`): not a named function
        return frozenset()
    if meaning.startswith("builtins."):
        return frozenset({PRINT} if meaning == "builtins.print" else ())
    found = {kind for kind, table in TABLES.items() if table.match(meaning, known)}
    if known and _foreign_value(meaning):  # a method of a value a library nbddp has no entries for made
        found |= {kind for kind in BY_NAME if TABLES[kind].match(meaning, False)}
    for kind in list(found):
        found |= ALSO.get(kind, set())
    if meaning == "nbddp_barrier":  # nbddp's wait for rank-0 work
        found.add(COLLECTIVE)
    tail = meaning.rsplit(".", 1)[-1]
    if TOGETHER.match(meaning, known) or (known and meaning.startswith("torch.distributed.")
                                          and tail not in TORCH_DISTRIBUTED_FACTS):
        found |= {COLLECTIVE, SYNC, TRAINS}
    if is_tracker(meaning, known):
        found.add(TRACK)
    if meaning.startswith(DISPLAY_MODULE + ".") or (meaning == "display" and not known):
        found.add(DISPLAY)
    if meaning in PER_PROCESS:
        found.add(OWN_VALUE)
    if is_entry(meaning, OWN_DISTRIBUTION):
        found |= {OWN_DDP, COLLECTIVE}
    if meaning.startswith("torch.cuda.amp."):
        found.add(AMP)
    return frozenset(found)


def _foreign_value(meaning: str) -> bool:
    """A method of a value that a library made which nbddp has no entries for and which is not Python's own
    (`llama_index...RAFTDatasetPack().run().to_json`): what the value is, nbddp cannot tell."""
    segments = meaning.split(".")
    return segments[0] not in ENTRY_PACKAGES and any(s.endswith(("()", "[]")) for s in segments[1:-1])


def known(meaning: str, packages) -> bool:
    """The meaning is a qualified name: its root is one of the `packages` the notebook imports
    (nbddp.meanings.Names.packages), Python's builtins or the notebook's own `__main__`."""
    root = meaning.split(".", 1)[0]
    return root in packages or root in KNOWN


def matches(table, meaning: str, packages) -> bool:
    """A meaning matches one of the table's entries; a method of a value a library nbddp has no entries for made,
    by the method's name (as BY_NAME's kinds)."""
    qualified = known(meaning, packages)
    return table.match(meaning, qualified) or (qualified and _foreign_value(meaning) and table.match(meaning, False))


def kinds(meanings, packages=frozenset()) -> frozenset:
    """What a call whose callee has these meanings does (the union over its meanings)."""
    found: set[str] = set()
    for meaning in meanings:
        found |= _kinds_of(meaning, known(meaning, packages))
    return frozenset(found)


def is_unsloth_loader(meaning: str, packages=frozenset()) -> bool:
    """`FastLanguageModel.from_pretrained` / `.get_peft_model` of one of Unsloth's loaders."""
    return UNSLOTH.match(meaning, known(meaning, packages))


def is_file_write(meanings, path, mode) -> bool:
    """`open("notes.txt", "w")` (also "a", "x", "+"): a file the notebook writes is written by rank 0 only, as saves
    are. Only a path known before the run (a literal, or a name assigned one): a computed path (`f"log-{rank}.txt"`)
    may be each rank's own."""
    return OPEN in meanings and isinstance(path, str) and isinstance(mode, str) and \
        any(c in mode for c in "wax+")


PROMPTS = {"builtins.input": "input()", "getpass.getpass": "getpass()"}  # and every library prompt through them
LOGINS = frozenset({"login", "interpreter_login", "notebook_login"})  # a library's login: without a key, it asks
CREDENTIALS = frozenset({"token", "key", "api_key", "password"})  # keywords that give a login its key
HUB = "huggingface_hub"
ASK_INSTEAD = "set the value in the notebook instead (from an environment variable or a Kaggle/Colab secret)"
HF_TOKEN_INSTEAD = "set HF_TOKEN (in the environment, or a Kaggle/Colab secret of that name)"


def prompt(meanings, credentials: bool, modules=frozenset()):
    """What a call that asks the user for a value asks, as (what, how to give the value instead), else None: input(),
    getpass(), a library's login() (`login`, `interpreter_login`, `notebook_login` of a module the notebook imports,
    one of `modules`) given no key (`credentials`: a positional argument or a key keyword); huggingface_hub's is told
    by name (HF_TOKEN)."""
    for meaning in sorted(meanings):
        names = parts(meaning)
        if meaning in PROMPTS:
            return PROMPTS[meaning], ASK_INSTEAD
        if credentials or len(names) < 2 or names[0] not in modules or names[-1] not in LOGINS or \
                "(" in meaning or "[" in meaning:  # a method of a value (`ftp.login()`) is not a library's login
            continue
        if names[0] != HUB:
            return f"{meaning}() without a key", ASK_INSTEAD.replace("set the value", "pass the key")
        if names[-1] == "notebook_login":
            return f"{meaning}() (a notebook widget; the script asks in the terminal)", HF_TOKEN_INSTEAD
        return f"{meaning}() without a token", HF_TOKEN_INSTEAD
    return None


GENERATION_TASKS = frozenset({"text-generation", "text2text-generation", "image-text-to-text", "summarization",
                              "translation", "automatic-speech-recognition", "text-to-audio", "text-to-speech"})


def is_generation_pipeline(meanings, task) -> bool:
    """`pipeline("text-generation", ...)`: a generation pipeline runs on rank 0 only."""
    return task in GENERATION_TASKS and any(
        parts(m)[-1] == "pipeline" and (parts(m)[0] == parts(PIPELINE)[0] or m == "pipeline") for m in meanings)
