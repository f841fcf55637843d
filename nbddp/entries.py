"""Library APIs by qualified name: the vocabulary's tables (nbddp.vocabulary reads them) and how a meaning matches
an entry. An entry is a library's public name (`trl.SFTTrainer`); a meaning matches it where the package and the name
are the same, wherever in the package the notebook imported it from (`trl.trainer.sft_trainer.SFTTrainer`), and a
name the notebook never binds matches an entry of that name (a cell converted alone, its import in an earlier cell).
tests/test_entries.py holds every entry to an importable name where its library is installed."""
from __future__ import annotations

import sys
from pathlib import Path

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
    *(f"{t}().{w}" for t in ("lightning.Trainer", "pytorch_lightning.Trainer") for w in ("validate", "test")),
})
TORCH_DISTRIBUTED_FACTS = frozenset({"get_rank", "get_world_size", "is_initialized", "is_available", "get_backend",
                                     "get_node_local_rank", "is_torchelastic_launched"})
# torch.distributed's collectives, by name for a module nbddp cannot follow (`dist.barrier()` in a cell converted
# alone); any function of torch.distributed but TORCH_DISTRIBUTED_FACTS is one where the import is seen.
TORCH_COLLECTIVES = frozenset(f"torch.distributed.{name}" for name in (
    "barrier", "monitored_barrier", "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather",
    "gather_object", "scatter", "scatter_object_list", "all_to_all", "all_to_all_single"))
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


# Demo servers whose launch() returns at once in a notebook (they see IPython) and blocks a script for good.
DEMOS = frozenset({"gradio.Blocks().launch", "gradio.Interface().launch", "gradio.ChatInterface().launch",
                   "gradio.TabbedInterface().launch"})
# Values each process computes for itself: the clock, a uuid, the OS's entropy, the process's id. Where training
# needs one, rank 0's is given to every rank (nbddp.needs' shares).
PER_PROCESS = frozenset({
    "time.time", "time.time_ns", "time.localtime", "time.gmtime", "time.ctime", "time.asctime", "time.strftime",
    "time.monotonic", "time.perf_counter", "datetime.datetime.now", "datetime.datetime.utcnow",
    "datetime.datetime.today", "datetime.date.today", "uuid.uuid1", "uuid.uuid4", "os.urandom", "os.getpid",
    "secrets.token_hex", "secrets.token_bytes", "secrets.token_urlsafe", "secrets.randbits", "secrets.randbelow",
    "secrets.choice", *(f"{cls}().{m}" for cls in ("random.SystemRandom", "secrets.SystemRandom") for m in (  # (one
        "random", "randint", "randrange", "choice", "choices", "sample", "shuffle", "uniform", "gauss",
        "normalvariate", "getrandbits", "randbytes", "triangular", "expovariate")),  # class) each draw: OS entropy
    "tempfile.mkdtemp", "tempfile.mktemp", "time.monotonic_ns", "time.perf_counter_ns", "time.process_time",
    "time.process_time_ns", "time.thread_time", "time.thread_time_ns",
    "os.getrandom", "os.times", "threading.get_ident", "threading.get_native_id", "time.clock_gettime",
    "time.clock_gettime_ns", "multiprocessing.current_process", "pandas.Timestamp.now", "pandas.Timestamp.utcnow",
    "pandas.Timestamp.today", "socket.gethostname", "platform.node",  # (the machine's: several machines differ)
})
# Constructors that read the clock when given the string "now" or "today" (`np.datetime64("now")`): a value of the
# process's own by what they are given (nbddp.effects)
CLOCK_BY_VALUE = frozenset({"numpy.datetime64", "pandas.Timestamp", "pandas.to_datetime"})
# The classes whose subclasses' methods a trainer calls on every rank while it trains: callbacks, Lightning's module
# (and logging's handlers, by what the class is: nbddp.inside.is_handler).
TRAINING_HOOKS = frozenset({"transformers.TrainerCallback", "lightning.Callback", "pytorch_lightning.Callback",
                            "lightning.LightningModule", "pytorch_lightning.LightningModule"})
# Library functions that change the values they are given, in place (a notebook's own function is followed
# instead). A call of any other library is taken to read its arguments: what it is given stays as it was.
CHANGES_ARGUMENTS = frozenset({
    "builtins.setattr", "builtins.delattr", "builtins.exec", "builtins.eval", "operator.setitem", "operator.delitem",
    "struct.pack_into", "random.shuffle", "random.Random().shuffle", "numpy.random.shuffle",
    "numpy.random.Generator().shuffle", "numpy.copyto", "numpy.put", "numpy.place", "numpy.fill_diagonal",
    "heapq.heappush", "heapq.heappop", "heapq.heapify", "heapq.heapreplace", "heapq.heappushpop", "bisect.insort",
    "bisect.insort_left", "bisect.insort_right", "torch.nn.init.normal_", "torch.nn.init.uniform_",
    "torch.nn.init.zeros_", "torch.nn.init.ones_", "torch.nn.init.constant_", "torch.nn.init.xavier_uniform_",
    "torch.nn.init.xavier_normal_", "torch.nn.init.kaiming_uniform_", "torch.nn.init.kaiming_normal_",
    "torch.nn.init.trunc_normal_", "torch.nn.init.orthogonal_", "torch.nn.utils.clip_grad_norm_",
    "torch.nn.utils.clip_grad_value_", "peft.inject_adapter_in_model", "datasets.disable_caching"})
CONFIG_HOMES = ("os.environ", "os.putenv", "os.unsetenv", "os.chdir", "sys.path", "warnings.", "logging.",
                "torch.backends.", "torch._dynamo.config", "torch._inductor.config",
                "gc.", "torch.cuda.empty_cache", "torch.cuda.reset_peak_memory_stats")  # and each rank's memory
# Seeds of the random generators training draws from, whatever library it uses, also where the notebook keeps what
# the call returns (`s = torch.seed()`, `seed = L.seed_everything(42)` reseed the process's generators: every rank
# must; the runtime gives each the same seed where the call draws one). A seeding function of a library training uses
# whose value is dropped is set-up anyway (a module function called for its effect).
SEEDS = frozenset({"random.seed", "numpy.random.seed", "numpy.random.set_state", "random.setstate", "torch.seed",
                   "torch.random.seed", "torch.manual_seed", "torch.random.manual_seed", "torch.set_rng_state",
                   "torch.random.set_rng_state", "torch.cuda.seed", "torch.cuda.seed_all", "torch.cuda.manual_seed",
                   "torch.cuda.manual_seed_all", "torch.cuda.set_rng_state", "torch.cuda.set_rng_state_all",
                   "transformers.set_seed", "transformers.enable_full_determinism", "accelerate.utils.set_seed",
                   "lightning.seed_everything", "lightning.pytorch.seed_everything",
                   "pytorch_lightning.seed_everything", "lightning.fabric.seed_everything"})
# What a process sets of its own state (Python's standard library, psutil, matplotlib's backend, other libraries'):
# limits, signals, priority, CPU affinity, its workers' start method, locale, time zone, environment (dotenv), event
# loop (nest_asyncio), pandas' parallel methods (pandarallel). Every rank is a process of its own and sets it too.
PROCESS_STATE = frozenset({
    "sys.setrecursionlimit", "sys.setswitchinterval", "sys.set_int_max_str_digits", "resource.setrlimit", "os.nice",
    "os.umask", "socket.setdefaulttimeout", "signal.signal", "signal.alarm", "signal.setitimer", "signal.siginterrupt",
    "faulthandler.enable", "faulthandler.register", "faulthandler.dump_traceback_later",
    "multiprocessing.set_start_method", "multiprocessing.set_forkserver_preload", "multiprocessing.set_executable",
    "locale.setlocale", "time.tzset", "matplotlib.use", "os.sched_setaffinity", "os.sched_setscheduler",
    "os.sched_setparam", "os.setpriority", "sys.setprofile", "sys.settrace", "sys.setdlopenflags", "dotenv.load_dotenv",
    "psutil.Process().nice", "psutil.Process().cpu_affinity", "psutil.Process().ionice", "psutil.Process().rlimit",
    "nest_asyncio.apply", "pandarallel.pandarallel.initialize"})
# Calls that run Python code in this process: `exec(open("utils.py").read())` runs a file in the notebook's namespace
# (as `%run -i` does), `runpy.run_path("prep.py")` and `runpy.run_module("prep")` in one of their own (as `%run`):
# nbddp.changes reads the file as a `%run` of it (nbddp.ran_files); code it cannot read runs on every rank.
RUNS_CODE = frozenset({"builtins.exec", "runpy.run_path", "runpy.run_module"})
# Python's own calls that start a program: what it does happens outside the process, as another library's call's
# (a line that only starts one is an effect: once; an install of packages stays every machine's: nbddp.changes)
STARTS_PROGRAMS = frozenset({
    "subprocess.run", "subprocess.call", "subprocess.check_call", "subprocess.Popen", "os.system", "os.popen",
    "os.spawnl", "os.spawnlp", "os.spawnv", "os.spawnvp", "os.posix_spawn", "os.posix_spawnp", "pty.spawn",
    "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell", "subprocess.check_output",
    "subprocess.getoutput", "subprocess.getstatusoutput"})
WAITS_FOR_PROGRAM = frozenset({  # of those, the ones that give back the program's result once it has ended
    "subprocess.run", "subprocess.call", "subprocess.check_call", "subprocess.check_output", "subprocess.getoutput",
    "subprocess.getstatusoutput", "os.system"})
EMITS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "log", "showwarning"})
NOT_LIBRARIES = frozenset({"builtins", "__main__"})  # Python's own, the notebook's own


def is_process_config(meaning: str) -> bool:
    """A call that sets up the process rather than computing or writing something, by qualified name: the
    environment, the working folder, warning and logging set-up, torch's flags, the process's memory (gc, the CUDA
    cache), the seeds of the generators, the process's own state (PROCESS_STATE). Every rank does it. (A module
    function of a library that training's objects come from, called for its effect alone, is set-up too:
    nbddp.needs decides that, knowing the libraries.)"""
    names = parts(meaning)
    if meaning.startswith(CONFIG_HOMES) or meaning in ("os.environ", "sys.path"):
        return names[-1] not in EMITS
    return meaning in SEEDS or meaning in PROCESS_STATE


def library_of(meaning: str) -> str | None:
    """The package of a module function a meaning names (`unsloth` of `unsloth.PatchFastRL`); None for a method of a
    value (`ds.map`), a builtin, or a name the notebook binds itself."""
    if "(" in meaning or "[" in meaning or "." not in meaning:
        return None
    root = meaning.split(".", 1)[0]
    return None if root in NOT_LIBRARIES else root


def _data(name: str) -> list[str]:
    text = (Path(__file__).parent / "data" / name).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line and not line.startswith("#")]


# Model loaders: the classes whose from_pretrained loads a model. Unsloth's loaders, PEFT's auto classes, and
# transformers' model classes (its AutoModel* classes and every model class its auto mappings name, read from the
# installed transformers by tools/transformers_models.py into nbddp/data/transformers_models.txt). A tokenizer's,
# a processor's or a config's from_pretrained is no model load.
UNSLOTH_LOADERS = frozenset(f"unsloth.{name}" for name in (
    "FastLanguageModel", "FastVisionModel", "FastTextModel", "FastModel", "FastLlamaModel", "FastMistralModel",
    "FastQwen2Model", "FastQwen3Model", "FastQwen3MoeModel", "FastGraniteModel", "FastFalconH1Model",
    "FastSentenceTransformer"))
MODEL_CLASSES = UNSLOTH_LOADERS | frozenset(f"peft.{name}" for name in (
    "AutoPeftModel", "AutoPeftModelForCausalLM", "AutoPeftModelForSeq2SeqLM", "AutoPeftModelForSequenceClassification",
    "AutoPeftModelForTokenClassification", "AutoPeftModelForQuestionAnswering",
    "AutoPeftModelForFeatureExtraction")) | frozenset(
    f"transformers.{name}" for name in _data("transformers_models.txt"))
LOADS = frozenset(f"{cls}.from_pretrained" for cls in MODEL_CLASSES)
ADAPTERS = frozenset(f"{cls}.get_peft_model" for cls in UNSLOTH_LOADERS)  # and peft.get_peft_model
INFERENCE = frozenset(f"{cls}.for_inference" for cls in UNSLOTH_LOADERS)  # Unsloth's switch to generation
# Methods of the values a library makes, by the class that defines them (`transformers.GenerationMixin().generate`).
# The converter does not import the libraries, so it follows a value to the library call that made it, not to its
# class: such a method matches where a call of the class's package made the value, or of a package whose values are
# of that package's classes (VALUE_HOMES: the model that Unsloth's loader makes is a transformers model).
VALUE_HOMES = {
    "transformers": frozenset({"transformers", "unsloth", "unsloth_zoo", "peft", "trl", "sentence_transformers",
                               "setfit", "accelerate", "torch"}),  # `accelerator.unwrap_model(m)`, `torch.compile(m)`
    "peft": frozenset({"peft", "unsloth", "unsloth_zoo", "trl", "accelerate", "torch"}),
    "unsloth": frozenset({"unsloth", "unsloth_zoo", "trl", "peft"}),
    "datasets": frozenset({"datasets", "unsloth", "unsloth_zoo", "trl"}),
    "torch": frozenset({"torch", "transformers", "unsloth", "unsloth_zoo", "peft", "trl", "accelerate",
                        "sentence_transformers", "bitsandbytes", "__main__"}),
}  # any other package: its own values only
# The keyword that seeds a split or a shuffle (nbddp.transforms.data_prep gives it where the notebook does not).
SEED_KEYWORDS = {"seed": frozenset({"datasets.Dataset().shuffle", "datasets.Dataset().train_test_split"}),
                 "random_state": frozenset({"sklearn.model_selection.train_test_split"})}
MODEL_VALUE = "unsloth.FastLanguageModel.from_pretrained()"  # what Unsloth's loaders give: a model it patched
VALUE_METHODS = {
    "generate": frozenset({"transformers.GenerationMixin().generate", f"{MODEL_VALUE}.fast_generate",
                           "vllm.LLM().generate", "vllm.LLM().chat", "peft.PeftModel().print_trainable_parameters"}),
    "save": frozenset({"transformers.PreTrainedModel().save_pretrained", "transformers.Trainer().save_model",
                       "transformers.Trainer().save_state", "peft.PeftModel().save_pretrained",
                       *(f"{MODEL_VALUE}.{name}" for name in ("save_pretrained_merged", "save_pretrained_gguf",
                                                              "save_pretrained_torchao", "save_lora")),
                       "datasets.Dataset().save_to_disk", "datasets.Dataset().to_csv", "datasets.Dataset().to_json",
                       "datasets.Dataset().to_parquet", "pandas.DataFrame().to_csv", "pandas.DataFrame().to_json",
                       "pandas.DataFrame().to_parquet", "pandas.DataFrame().to_pickle", "pandas.DataFrame().to_excel"}),
    "push": frozenset({"transformers.PreTrainedModel().push_to_hub", "transformers.Trainer().push_to_hub",
                       "datasets.Dataset().push_to_hub",
                       *(f"{MODEL_VALUE}.{name}" for name in ("push_to_hub_merged", "push_to_hub_gguf",
                                                              "push_to_hub_torchao"))}),
    "data": frozenset({"datasets.Dataset().map", "datasets.Dataset().filter", "datasets.Dataset().train_test_split"}),
    "seeded": frozenset(e for entries in SEED_KEYWORDS.values() for e in entries if "()" in e),
    "backward": frozenset({"torch.Tensor().backward"}),
    "step": frozenset({"bitsandbytes.optim.optimizer.Optimizer8bit().step"}),
    "device": frozenset({"torch.nn.Module().to", "torch.nn.Module().cuda", "torch.Tensor().to", "torch.Tensor().cuda"}),
}
# Library functions and the methods of one class's values, by qualified name.
FUNCTIONS = {
    "data": frozenset({"datasets.load_dataset", "datasets.load_from_disk"}),
    "seeded": frozenset({"torch.utils.data.random_split"} |  # seeded by its generator
                        {e for entries in SEED_KEYWORDS.values() for e in entries if "()" not in e}),
    "save": frozenset({"torch.save", "safetensors.torch.save_file", "safetensors.torch.save_model", "numpy.save",
                       "numpy.savez", "numpy.savez_compressed", "numpy.savetxt", "pandas.to_pickle",
                       "scipy.io.savemat", "pyarrow.parquet.write_table", "pyarrow.feather.write_feather"}),
    "push": frozenset({"huggingface_hub.upload_folder", "huggingface_hub.upload_file",
                       "huggingface_hub.HfApi().upload_folder", "huggingface_hub.HfApi().upload_file"}),
    "generate": frozenset({"transformers.TextStreamer", "transformers.TextIteratorStreamer"}),
    "peft": frozenset({"peft.get_peft_model"}),
    "backward": frozenset({"accelerate.Accelerator().backward", "lightning.Fabric().backward"}),
    "step": frozenset({*(f"torch.optim.{name}().step" for name in (
        "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "ASGD", "LBFGS", "NAdam", "RAdam", "RMSprop",
        "Rprop", "SGD", "SparseAdam", "Optimizer")), "torch.amp.GradScaler().step", "torch.cuda.amp.GradScaler().step",
        "transformers.Adafactor().step", "accelerate.Accelerator().prepare().step"}),
    "memory": frozenset(f"torch.cuda.{name}" for name in (
        "max_memory_reserved", "max_memory_allocated", "memory_reserved", "memory_allocated",
        "get_device_properties", "memory_summary", "mem_get_info")),
    "config": frozenset({"transformers.TrainingArguments", "transformers.Seq2SeqTrainingArguments",
                         "unsloth.UnslothTrainingArguments",
                         "sentence_transformers.SentenceTransformerTrainingArguments",
                         "sentence_transformers.cross_encoder.CrossEncoderTrainingArguments",
                         "setfit.TrainingArguments", "trl.SFTConfig", "trl.DPOConfig", "trl.GRPOConfig",
                         "trl.KTOConfig",
                         "trl.RLOOConfig", "trl.RewardConfig", "trl.DistillationConfig",
                         "trl.experimental.orpo.ORPOConfig", "trl.experimental.cpo.CPOConfig",
                         "trl.experimental.gkd.GKDConfig", "trl.experimental.online_dpo.OnlineDPOConfig",
                         "trl.experimental.gold.GOLDConfig"}),
    "device": frozenset({"torch.cuda.set_device", "torch.device"}),
}
# What already orders the processes around dataset work: rank 0 first, the others after it.
MAIN_FIRST = frozenset({"accelerate.Accelerator().main_process_first",
                        "accelerate.Accelerator().local_main_process_first",
                        "accelerate.PartialState().main_process_first",
                        "accelerate.PartialState().local_main_process_first",
                        "transformers.TrainingArguments().main_process_first"})
# Experiment trackers: every function of these packages and every value they make logs (`wandb.log`, `run.log`).
TRACKER_PACKAGES = frozenset({"wandb", "mlflow", "comet_ml", "neptune", "trackio", "swanlab", "clearml", "aim"})
TRACKER_CLASSES = frozenset({"torch.utils.tensorboard.SummaryWriter", "tensorboardX.SummaryWriter"})
PIPELINE = "transformers.pipeline"

# Libraries whose calls compute values (and read files) without effects outside the process: a value training reads
# that they made is no effect on every rank worth a report line.
STANDARD = frozenset(sys.stdlib_module_names)  # Python's own packages
COMPUTES = frozenset({"numpy", "pandas", "polars", "pyarrow", "scipy", "sklearn", "einops", "tqdm", "regex"})
# Libraries whose module functions, called for their effect alone and given no file, only change the process's own
# state (`np.seterr(...)`, `pd.set_option(...)`, `tqdm.pandas()`, `sklearn.set_config(...)`, `decimal.setcontext(...)`;
# the data's and models' libraries too: `datasets.disable_caching()`): set-up every rank does (nbddp.changes).
IN_PROCESS = COMPUTES | frozenset({"decimal", "locale", "codecs", "mimetypes", "copyreg", "tracemalloc", "importlib",
                                   "random", "heapq", "bisect", "threading", "contextvars", "datasets", "transformers"})
# Libraries whose module functions send to other machines (HTTP clients, messaging): training reading their values
# (`cfg = requests.get(url).json()`) makes none of their calls set-up (`requests.post(hook)` stays once: nbddp.needs)
SENDS = frozenset({"requests", "httpx", "aiohttp", "urllib3", "slack_sdk", "discord_webhook", "telegram", "twilio"})
# Python's own modules whose calls reach other machines (a ping, a datagram: an effect, as another library's)
REACHES_OUT = ("urllib.request.", "http.client.", "smtplib.", "socket.", "ftplib.", "imaplib.", "poplib.",
               "xmlrpc.client.", "webbrowser.")

# The packages nbddp has entries for, or knows the values of: a value another library made, nbddp cannot tell
ENTRY_ROOTS = frozenset(entry.split(".")[0] for table in (
    TRAINERS, PASS_THROUGH, COLLECTIVES, TORCH_COLLECTIVES, OWN_DISTRIBUTION, DEMOS, PER_PROCESS, CHANGES_ARGUMENTS,
    SEEDS, LOADS, ADAPTERS, INFERENCE, TRACKER_CLASSES, MAIN_FIRST, *FUNCTIONS.values(), *VALUE_METHODS.values(),
    *SEED_KEYWORDS.values()) for entry in table) | TRACKER_PACKAGES | frozenset().union(*VALUE_HOMES.values())
