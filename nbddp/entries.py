"""Library APIs by qualified name: the vocabulary's tables (nbddp.vocabulary reads them) and how a meaning matches
an entry. An entry is a library's public name (`trl.SFTTrainer`); a meaning matches it where the package and the name
are the same, wherever in the package the notebook imported it from (`trl.trainer.sft_trainer.SFTTrainer`), and a
name the notebook never binds matches an entry of that name (a cell converted alone, its import in an earlier cell).
tests/test_entries.py holds every entry to an importable name where its library is installed."""
from __future__ import annotations

# Trainers, by qualified name (the class's package and name: `trl.SFTTrainer` is also
# `trl.trainer.sft_trainer.SFTTrainer`, and `trl.ORPOTrainer` of a trl before it moved to trl.experimental). A class
# the notebook derives from one is one too (nbddp.meanings follows a class to its bases). Building one, and its
# train/fit/evaluate/predict, is work every rank does together.
TRAINERS = frozenset({
    "transformers.Trainer", "transformers.Seq2SeqTrainer",
    "trl.SFTTrainer", "trl.DPOTrainer", "trl.GRPOTrainer", "trl.KTOTrainer", "trl.RLOOTrainer", "trl.RewardTrainer",
    "trl.DistillationTrainer", "trl.experimental.orpo.ORPOTrainer", "trl.experimental.cpo.CPOTrainer",
    "trl.experimental.gkd.GKDTrainer", "trl.experimental.online_dpo.OnlineDPOTrainer",
    "trl.experimental.gold.GOLDTrainer", "trl.experimental.kto.KTOTrainer",
    "unsloth.UnslothTrainer", "sentence_transformers.SentenceTransformerTrainer",
    "sentence_transformers.cross_encoder.CrossEncoderTrainer", "setfit.Trainer", "setfit.SetFitTrainer",
    "lightning.Trainer", "pytorch_lightning.Trainer",
})
# Library functions that give back the value they are handed (first argument), changed: the trainer that
# `train_on_responses_only(trainer, ...)` returns is a trainer (nbddp.meanings follows the argument).
PASS_THROUGH = frozenset({"unsloth.chat_templates.train_on_responses_only",
                          "unsloth_zoo.dataset_utils.train_on_responses_only"})
TRAINER_WORK = frozenset({"train", "fit", "evaluate", "predict"})
# The collectives of libraries that distribute training (every rank calls them together), by qualified name;
# `Accelerator()` marks a method of a value the class made.
COLLECTIVES = frozenset({
    "accelerate.Accelerator().wait_for_everyone", "accelerate.Accelerator().gather",
    "accelerate.Accelerator().gather_for_metrics", "accelerate.Accelerator().reduce",
    "accelerate.Accelerator().pad_across_processes", "accelerate.Accelerator().prepare",
    "accelerate.Accelerator().save_state", "accelerate.Accelerator().load_state",
    "accelerate.Accelerator().main_process_first", "accelerate.Accelerator().local_main_process_first",
    "accelerate.PartialState().wait_for_everyone", "accelerate.PartialState().main_process_first",
    "accelerate.PartialState().local_main_process_first",
    "accelerate.utils.wait_for_everyone", "accelerate.utils.gather", "accelerate.utils.gather_object",
    "accelerate.utils.broadcast", "accelerate.utils.broadcast_object_list", "accelerate.utils.reduce",
    "accelerate.utils.pad_across_processes",
    "lightning.Fabric().barrier", "lightning.Fabric().all_reduce", "lightning.Fabric().all_gather",
    "lightning.Fabric().broadcast", "lightning.Fabric().setup", "lightning.Fabric().backward",
})
TORCH_DISTRIBUTED_FACTS = frozenset({"get_rank", "get_world_size", "is_initialized", "is_available", "get_backend",
                                     "get_node_local_rank", "is_torchelastic_launched"})
UNRESOLVED_TOGETHER = TRAINER_WORK | {"barrier", "all_reduce", "broadcast", "gather", "all_gather", "reduce_scatter",
                                      "wait_for_everyone", "gather_for_metrics"}
# The notebook distributes training itself: building one of these is every rank's work (by qualified name).
OWN_DISTRIBUTION = frozenset({"torch.nn.parallel.DistributedDataParallel",
                              "torch.distributed.fsdp.FullyShardedDataParallel", "torch.distributed.fsdp.fully_shard",
                              "accelerate.Accelerator", "accelerate.PartialState", "lightning.Fabric",
                              "accelerate.notebook_launcher"})
def parts(meaning: str) -> list[str]:
    """`a.b().c` -> ['a', 'b', 'c']."""
    return meaning.replace("()", "").replace("[]", "").split(".")


def is_entry(meaning: str, entries) -> bool:
    """The meaning names one of the qualified `entries` (see the module's docstring)."""
    names = parts(meaning)
    return any(names[-1] == entry.rsplit(".", 1)[-1] and (len(names) == 1 or names[0] == entry.split(".", 1)[0])
               for entry in entries)


def is_trainer(meaning: str) -> bool:
    return "(" not in meaning and "[" not in meaning and is_entry(meaning, TRAINERS)


def made_by_trainer(receiver: str) -> bool:
    """`trl.SFTTrainer()`: a value a trainer class made."""
    return receiver.endswith("()") and is_trainer(receiver[:-2])


def unresolved(names) -> bool:
    """`trainer.train` where `trainer` is a parameter or a name the notebook never binds: what it is, unknown."""
    return len(names) == 2


def _entry_key(meaning: str):
    """(package, owner, a method of a value the owner made, name): `accelerate.state.PartialState().wait_for_everyone`
    and `accelerate.PartialState().wait_for_everyone` are the same entry."""
    names = meaning.split(".")
    return names[0], parts(names[-2])[-1] if len(names) > 1 else "", names[-2].endswith("()"), names[-1]


COLLECTIVE_KEYS = frozenset(map(_entry_key, COLLECTIVES))


def is_collective_entry(meaning: str) -> bool:
    """One of COLLECTIVES, wherever in its package the notebook imported it from."""
    return "." in meaning and _entry_key(meaning) in COLLECTIVE_KEYS


# Demo servers whose launch() returns at once in a notebook (they see IPython) and blocks a script for good.
DEMOS = frozenset({"gradio.Blocks().launch", "gradio.Interface().launch", "gradio.ChatInterface().launch",
                   "gradio.TabbedInterface().launch"})
DEMO_KEYS = frozenset(map(_entry_key, DEMOS))


def is_demo_launch(meaning: str) -> bool:
    return "." in meaning and _entry_key(meaning) in DEMO_KEYS


# Values each process computes for itself: the clock, a uuid, the OS's entropy, the process's id. Where training
# needs one, rank 0's is given to every rank (nbddp.needs' shares).
PER_PROCESS = frozenset({
    "time.time", "time.time_ns", "time.localtime", "time.gmtime", "time.ctime", "time.asctime", "time.strftime",
    "time.monotonic", "time.perf_counter", "datetime.datetime.now", "datetime.datetime.utcnow",
    "datetime.datetime.today", "datetime.date.today", "uuid.uuid1", "uuid.uuid4", "os.urandom", "os.getpid",
    "secrets.token_hex", "secrets.token_bytes", "secrets.token_urlsafe", "secrets.randbits", "secrets.randbelow",
    "secrets.choice", "random.SystemRandom",
})
CONFIG_HOMES = ("os.environ", "os.putenv", "os.unsetenv", "os.chdir", "sys.path", "warnings.", "logging.",
                "torch.backends.", "torch._dynamo.config", "torch._inductor.config",
                "gc.", "torch.cuda.empty_cache", "torch.cuda.reset_peak_memory_stats")  # and each rank's memory
# Seeds of the random generators training draws from, whatever library it uses (torch's and the training libraries'
# own are theirs: a module function of a library training uses, called for its effect, is set-up of every rank).
SEEDS = frozenset({"random.seed", "numpy.random.seed", "numpy.random.set_state", "random.setstate"})
EMITS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "log", "showwarning"})
NOT_LIBRARIES = frozenset({"builtins"})


def is_process_config(meaning: str) -> bool:
    """A call that sets up the process rather than computing or writing something, by qualified name: the
    environment, the working folder, warning and logging set-up, torch's flags, the process's memory (gc, the CUDA
    cache), the seeds of Python's and NumPy's generators. Every rank does it. (A module function of a library that
    training's objects come from, called for its effect alone, is set-up too: nbddp.needs decides that, knowing
    the libraries.)"""
    names = parts(meaning)
    if meaning.startswith(CONFIG_HOMES) or meaning in ("os.environ", "sys.path"):
        return names[-1] not in EMITS
    return meaning in SEEDS


def library_of(meaning: str) -> str | None:
    """The package of a module function a meaning names (`unsloth` of `unsloth.PatchFastRL`, `transformers` of
    `transformers.logging.set_verbosity_error`); None for a method of a value (`ds.map`), a builtin, or a name
    the notebook binds itself."""
    if "(" in meaning or "[" in meaning or "." not in meaning:
        return None
    root = meaning.split(".", 1)[0]
    return None if root in NOT_LIBRARIES else root
