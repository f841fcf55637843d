"""What the notebook's calls do, by what they are: one vocabulary every conversion step uses.

A call is described by its *meanings* (nbddp.meanings.Names.meanings): the dotted paths its callee resolves to through
the notebook's imports and assignments, e.g. `unsloth.FastLanguageModel.from_pretrained` for `FLM.from_pretrained`
after `from unsloth import FastLanguageModel as FLM`, `builtins.map` for `map(...)`, `datasets.load_dataset().map`
for `ds.map(...)` after `ds = load_dataset(...)`; a name the notebook never binds stays as written (`display`).
`()` after a part marks a value made by calling it. `kinds(meanings)` answers what the call is, as a set of:

LOAD (a model loader), PEFT (get_peft_model), DATA (dataset loading, map, filter, split: main-process-first),
COLLECTIVE (work every rank must do together: building a trainer and its train/fit/evaluate/predict, the trainer
known by its qualified class (nbddp.entries.TRAINERS; for a value nbddp cannot follow, a parameter, by the method's
name), a model load, get_peft_model, dataset loading and mapping, torch.distributed's and accelerate's collectives,
building an Accelerator or DDP, a backward pass, an optimizer step), SYNC (the collectives but dataset work and set-up),
TRAINS (of SYNC, what trains or talks to every rank, not a model load: the last one ends training; nbddp.needs),
SAVE, PUSH,
GENERATE, DISPLAY, PRINT, MEMORY (GPU memory stats), TRACK (an experiment tracker: a run's start, log, finish),
BACKWARD (`loss.backward()`, `accelerator.backward(loss)`), STEP (an optimizer's `.step()`), OWN_DDP (the notebook
distributes training itself: DistributedDataParallel, FSDP, accelerate's Accelerator, Fabric), CONFIG (a trainer
config: TrainingArguments, SFTConfig, ...), SEEDED (a split or shuffle, which takes a seed), AMP (the deprecated
torch.cuda.amp), DEVICE (`.to`, `.cuda`, `set_device`, `torch.device`).

nbddp.entries holds the tables of qualified names and `is_process_config` (the process's set-up by qualified
name: the environment, warnings, logging, torch's flags, Python's and NumPy's seeds). `prompt(meanings, ...)` says whether a call asks the user for a value (input(), getpass(), a library's login).

MAIN_ONLY holds the kinds that run on global rank 0 only; LIGHT those that need no barrier after them inside loops
and function bodies (nothing another rank reads later).
"""
from __future__ import annotations

from .entries import (OWN_DISTRIBUTION, PER_PROCESS, TORCH_DISTRIBUTED_FACTS, TRAINER_WORK, UNRESOLVED_TOGETHER, is_collective_entry,
                      is_entry, is_trainer, made_by_trainer, parts, unresolved)

LOAD, PEFT, DATA, COLLECTIVE = "load", "peft", "data", "collective"
SAVE, PUSH, GENERATE, DISPLAY, PRINT, MEMORY, TRACK = "save", "push", "generate", "display", "print", "memory", "track"
BACKWARD, STEP, CONFIG, SYNC = "backward", "step", "config", "sync"
OWN_VALUE = "own-value"  # a value each process computes for itself (the clock, a uuid, entropy): nbddp.entries
TRAINS = "trains"  # of SYNC: trains or talks to every rank (not a model load): the last such statement ends training
SEEDED, AMP, DEVICE = "seeded", "amp", "device"  # a split or shuffle; torch.cuda.amp; what names a device
ENV = "env"  # a statement that names CUDA_VISIBLE_DEVICES (nbddp.tree's statement facts)
OWN_DDP = "own-ddp"  # the notebook distributes training itself: torch's DDP or FSDP, accelerate, Lightning's Fabric
MAIN_ONLY = frozenset({SAVE, PUSH, GENERATE, DISPLAY, PRINT, MEMORY, TRACK})
LIGHT = frozenset({DISPLAY, PRINT, MEMORY, TRACK})

UNSLOTH_LOADERS = frozenset({"FastLanguageModel", "FastVisionModel", "FastModel", "FastSentenceTransformer",
                             "FastTextModel"})
MODEL_SUFFIXES = (
    "ForCausalLM", "ForConditionalGeneration", "ForSequenceClassification", "ForTokenClassification",
    "ForQuestionAnswering", "ForMaskedLM", "ForSeq2SeqLM", "ForImageTextToText", "ForSpeechSeq2Seq",
    "ForVision2Seq", "ForAudioClassification", "ForImageClassification", "ForCTC",
)
SAVE_PREFIXES = ("save_pretrained", "save_lora", "save_model")
PATH_KEYWORDS = ("pretrained_model_name_or_path", "model_name", "model_id", "save_directory", "output_dir",
                 "dataset_path", "file", "f", "path")  # where a saver takes its path by keyword
DATA_WRITES = frozenset({"save_to_disk", "to_csv", "to_json", "to_parquet"})  # a dataset's or DataFrame's files
GENERATION = frozenset({"generate", "fast_generate", "for_inference", "TextStreamer", "print_trainable_parameters"})
GENERATION_TASKS = frozenset({"text-generation", "text2text-generation", "image-text-to-text", "summarization",
                              "translation", "automatic-speech-recognition", "text-to-audio", "text-to-speech"})
CUDA_MEMORY = frozenset({"max_memory_reserved", "max_memory_allocated", "memory_reserved", "memory_allocated",
                         "get_device_properties", "memory_summary", "mem_get_info"})
DATA_FUNCTIONS = frozenset({"load_dataset", "load_from_disk", "train_test_split"})
DATA_METHODS = frozenset({"map", "filter"})
NOT_DATASETS = frozenset({"builtins", "multiprocessing", "concurrent", "pandas", "numpy", "torch", "itertools",
                          "functools", "operator", "pd", "np"})
TRACKERS = frozenset({"wandb", "mlflow", "comet_ml", "neptune", "trackio", "swanlab", "clearml", "aim"})
TRACKER_CLASSES = frozenset({"SummaryWriter"})  # torch.utils.tensorboard / tensorboardX: writer = SummaryWriter()
OPEN = "builtins.open"  # open(path, mode): a write at a known path is a save (is_file_write)
DISPLAY_MODULE = "IPython.display"  # Audio, Image, Markdown… from here only display; datasets.Audio is data
TRL_CONFIGS = frozenset({
    "SFTConfig", "DPOConfig", "ORPOConfig", "KTOConfig", "CPOConfig", "GRPOConfig", "PPOConfig", "RewardConfig",
    "GKDConfig", "RLOOConfig", "OnlineDPOConfig", "XPOConfig", "NashMDConfig", "PRMConfig", "BCOConfig",
})
OPTIMIZER_HOMES = ("torch.optim.", "bitsandbytes.optim.", "bnb.optim.", "transformers.AdamW", "optim.")
OPTIMIZER_NAMES = frozenset({"optimizer", "optim", "opt", "scaler"})  # scaler.step(opt): a GradScaler steps it
SCHEDULERS = ("lr_scheduler", "scheduler", "Scheduler", "_schedule")


def is_model_class(owner: str, root: str = "") -> bool:
    """A class whose `from_pretrained` loads a model: Unsloth's loaders (every `Fast…Model`, any name imported
    from unsloth), `Auto*Model*`, `…ForCausalLM` and the like; not PEFT's adapters."""
    if owner.startswith("Peft"):
        return False
    return (owner in UNSLOTH_LOADERS or (owner.startswith("Fast") and owner.endswith("Model"))
            or (root == "unsloth" and owner.startswith("Fast")) or (owner.startswith("Auto") and "Model" in owner)
            or owner.endswith(MODEL_SUFFIXES))


def is_unsloth_loader(meaning: str) -> bool:
    """`FastLanguageModel.get_peft_model` and the like: Unsloth's, or a name the notebook never imports."""
    names = parts(meaning)
    owner = names[-2] if len(names) > 1 else ""
    if len(names) > 2 and names[0] != "unsloth" and "(" not in meaning:
        return False  # imported from another library
    return owner in UNSLOTH_LOADERS or (owner.startswith("Fast") and owner.endswith("Model")) or (
        names[0] == "unsloth" and owner.startswith("Fast"))


def _kinds_of(meaning: str) -> set[str]:
    if meaning.endswith(("()", "[]")):  # calling a value a call made (`tokenizer(...)`): not a named function
        return set()
    names = parts(meaning)
    tail, root = names[-1], names[0]
    owner = names[-2] if len(names) > 1 else ""
    method = len(names) > 1
    found: set[str] = set()
    if root == "builtins":
        return {PRINT} if tail == "print" and len(names) == 2 else found
    if tail == "from_pretrained" and is_model_class(owner, root):
        found |= {LOAD, COLLECTIVE, SYNC}
    if tail == "get_peft_model":
        found |= {PEFT, COLLECTIVE, SYNC}
    receiver = meaning[:-len(tail) - 1] if method else ""
    if meaning == "nbddp_barrier":  # nbddp's wait for rank-0 work
        found.add(COLLECTIVE)
    if is_trainer(meaning) or (tail in TRAINER_WORK and made_by_trainer(receiver)) or is_collective_entry(meaning) or (
            meaning.startswith("torch.distributed.") and tail not in TORCH_DISTRIBUTED_FACTS) or (
            tail in UNRESOLVED_TOGETHER and unresolved(names)):
        found |= {COLLECTIVE, SYNC, TRAINS}
    if tail in DATA_FUNCTIONS or (method and tail in DATA_METHODS and root not in NOT_DATASETS):
        found |= {DATA, COLLECTIVE}
    if tail == "backward" and method:
        found |= {BACKWARD, COLLECTIVE, SYNC, TRAINS}
    if tail == "step" and method and is_optimizer(".".join(meaning.split(".")[:-1])):
        found |= {STEP, COLLECTIVE, SYNC, TRAINS}
    if tail.startswith(SAVE_PREFIXES) or meaning == "torch.save" or (method and tail in DATA_WRITES):
        found.add(SAVE)
    if tail.startswith("push_to_hub"):
        found.add(PUSH)
    if tail in GENERATION or tail.endswith("Streamer"):
        found.add(GENERATE)
    if tail in CUDA_MEMORY and owner == "cuda":
        found.add(MEMORY)
    if root in TRACKERS or any(name in TRACKER_CLASSES for name in names):
        found.add(TRACK)
    if meaning.startswith(DISPLAY_MODULE + ".") or meaning == "display":
        found.add(DISPLAY)
    if tail in TRL_CONFIGS or tail.endswith("TrainingArguments"):
        found.add(CONFIG)
    if tail == "train_test_split" or (tail == "shuffle" and method and root not in ("builtins", "random")):
        found.add(SEEDED)
    if meaning in PER_PROCESS:
        found.add(OWN_VALUE)
    if is_entry(meaning, OWN_DISTRIBUTION):
        found |= {OWN_DDP, COLLECTIVE}
    if meaning.startswith("torch.cuda.amp."):
        found.add(AMP)
    if tail in ("to", "cuda", "set_device", "device"):
        found.add(DEVICE)
    return found


def kinds(meanings) -> frozenset:
    """What a call whose callee has these meanings does (the union over its meanings)."""
    found: set[str] = set()
    for meaning in meanings:
        found |= _kinds_of(meaning)
    return frozenset(found)


def is_optimizer(receiver: str) -> bool:
    """A value that is an optimizer: made by torch.optim/bitsandbytes (any name), or a name that says so."""
    if any(word in receiver for word in SCHEDULERS):
        return False
    return receiver.startswith(OPTIMIZER_HOMES) or parts(receiver)[-1] in OPTIMIZER_NAMES or "GradScaler" in receiver or (
        "optim" in receiver and receiver.endswith(")"))


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


def is_generation_pipeline(meanings, task) -> bool:
    """`pipeline("text-generation", ...)`: a generation pipeline runs on rank 0 only."""
    return any(parts(m)[-1] == "pipeline" for m in meanings) and task in GENERATION_TASKS
