"""Step: which modules of `nbddp/runtime/` the converted notebook needs, and why (the script carries only those).

Read from the converted cells: the helpers the other steps wrote (`nbddp_shell`, `nbddp_main_process_first`, …),
what the notebook imports (Unsloth, a Trainer from transformers/trl/unsloth, xformers), and what it asks for
(gradient checkpointing, a quantized load, Unsloth's TiledMLP, its own DDP settings), and where it asks the user for a
value (input(), getpass(), a library's login without a key: each is reported, with what the script does). Where a
value cannot be read (a variable, `**kwargs`), the module is carried.
"""
from __future__ import annotations

import libcst as cst

from ..cells import starts_cell
from ..cst_helpers import code_of, is_if_false, keyword
from ..inline import Choice
from ..meanings import IPYTHON_BUILTINS
from ..runtime import HELPERS
from ..entries import is_entry, is_trainer
from ..entry_match import Table
from ..vocabulary import CONFIG, CREDENTIALS, LOAD, SAVE, is_unsloth_loader, known, parts, prompt
from ..walk import walk
from .base import TreeStep
from .placement import OURS
from .trainer_args import uses_peft

CHECKPOINTS = Table(values={"transformers.PreTrainedModel().gradient_checkpointing_enable"})
QUANTIZERS = frozenset({"transformers.BitsAndBytesConfig"})
CHECKPOINTING = frozenset({"gradient_checkpointing", "use_gradient_checkpointing", "activation_checkpointing"})
QUANTIZED = frozenset({"load_in_4bit", "load_in_8bit", "quantization_config"})
VLLM = frozenset({"fast_inference", "use_vllm"})  # Unsloth's loader, TRL's GRPO/online configs


MODEL_KEYWORDS = ("model_name", "pretrained_model_name_or_path")


def _off(value) -> bool:
    """A keyword value that certainly turns the feature off: False, None, 0."""
    return (isinstance(value, cst.Name) and value.value in ("False", "None")) or \
        (isinstance(value, cst.Integer) and value.value == "0")


def _rank_0_only(node) -> bool:
    """`if NBDDP_IS_MAIN:` without else: the converter's block for what runs on rank 0 only."""
    return isinstance(node.test, cst.Name) and node.test.value == "NBDDP_IS_MAIN" and node.orelse is None


class _Facts(cst.CSTVisitor):
    def __init__(self, names):
        self.analysis = names  # nbddp.meanings.Names: what the notebook's calls are
        self.modules = set(names.packages)  # the packages the notebook imports (the one name analysis')
        self.names: set[str] = set()
        self.trainer = self.checkpointing = self.quantized = self.weight_tying = self.tiled_mlp = False
        self.adapters = False  # it makes or loads adapters (trainer_args.uses_peft: by what its calls are)
        self.own_ddp = []  # why the DDP settings the converter wrote may not hold
        self.split_model = False  # a model load that keeps a placement of the notebook's own
        self.models = []  # (model id, bits, cell, the notebook's placement) of each load whose id is a literal
        self.unsized = []  # model loads whose id or size the converter cannot read
        self.saved = set()  # folders the notebook saves a model to (not there when the script starts)
        self.ipython = set()  # IPython's builtins the notebook reads (display, get_ipython)
        self.prompts = {}  # (cell, what a call asks, on rank 0 only) -> how to give the value instead (vocabulary)
        self.cell = 0
        self.vllm = {}  # cell -> the keyword that asks for vLLM (fast_inference=True, use_vllm=True)
        self.main_only = 0  # how deep in `if NBDDP_IS_MAIN:` blocks (rank-0-only calls)

    def on_visit(self, node):
        if isinstance(node, cst.BaseStatement):
            self.cell = starts_cell(node) or self.cell
        return super().on_visit(node)

    def _model(self, node):
        """The id and weight bits of a model load: load_in_4bit/8bit, float32, else 16 bits; Unsloth's loaders load
        in 4 bits unless told otherwise. A flag nbddp cannot read counts as set (the smaller model)."""
        arg = keyword(node, MODEL_KEYWORDS[0]) or keyword(node, MODEL_KEYWORDS[1]) or next(
            (a for a in node.args if a.keyword is None and not a.star), None)
        model = self.analysis.literal(arg.value) if arg is not None else ...

        def flag(key):
            return self.analysis.literal(keyword(node, key).value) if keyword(node, key) is not None else None

        dtype = keyword(node, "dtype") or keyword(node, "torch_dtype")
        unsloth = any(is_unsloth_loader(m, self.analysis.packages) for m in self.analysis.meanings(node.func))
        unsloth_default = unsloth and flag("load_in_4bit") is None and not any(
            flag(key) for key in ("load_in_8bit", "load_in_16bit", "full_finetuning"))
        if flag("load_in_4bit") or unsloth_default:
            bits = 4
        elif flag("load_in_8bit"):
            bits = 8
        else:
            bits = 32 if dtype is not None and self._float32(dtype.value) else 16
        placement = keyword(node, "device_map")
        placement = code_of(placement.value.args[0].value) if placement is not None and isinstance(
            placement.value, cst.Call) and placement.value.args else "none"
        if isinstance(model, str):
            self.models.append((model, bits, self.cell, placement))
        else:
            self.unsized.append((self.cell, code_of(arg.value) if arg is not None else ""))

    def _trainers_model(self, node):
        """A trainer given a hub id or folder (`SFTTrainer(model="org/m", ...)`: TRL loads it with from_pretrained):
        a load of that id, 4 or 8 bits where the trainer's quantization_config says so, else at the dtype of its
        configuration's model_init_kwargs, float32 where none is given (TRL's default)."""
        arg = keyword(node, "model") or next((a for a in node.args if a.keyword is None and not a.star), None)
        model = self.analysis.literal(arg.value) if arg is not None else None
        if not isinstance(model, str):
            return
        quantization, config = self._call_of(keyword(node, "quantization_config")), self._call_of(keyword(node, "args"))
        bits = next((b for b, key in ((4, "load_in_4bit"), (8, "load_in_8bit")) if quantization is not None and
                     keyword(quantization, key) is not None and not _off(keyword(quantization, key).value)), None)
        init = keyword(config, "model_init_kwargs") if config is not None else None
        dtype = next((e.value for e in getattr(init.value, "elements", ()) if isinstance(e, cst.DictElement) and
                      self.analysis.literal(e.key) in ("dtype", "torch_dtype")), None) if init is not None else None
        self.models.append((model, bits or (32 if dtype is None or self._float32(dtype) else 16), self.cell,
                            "the trainer's"))

    def _float32(self, dtype) -> bool:
        """A dtype argument that is float32: `torch.float32` (`torch.float`), or the string "float32"."""
        return self.analysis.literal(dtype) == "float32" or bool(
            self.analysis.meanings(dtype) & {"torch.float32", "torch.float"})

    def _call_of(self, arg):
        """The call a keyword's value is, or the call a name it reads was last assigned (`args = SFTConfig(...)`)."""
        value = arg.value if arg is not None else None
        value = self.analysis.value(value) if isinstance(value, cst.Name) else value
        return value if isinstance(value, cst.Call) else None

    def visit_If(self, node):
        self.main_only += _rank_0_only(node)
        return not is_if_false(node)  # dead code asks for nothing

    def leave_If(self, node):
        self.main_only -= _rank_0_only(node)

    def visit_Call(self, node):
        name = parts(code_of(node.func))[-1]
        what, meanings = self.analysis.kinds(node.func), self.analysis.meanings(node.func)
        trainer = any(map(is_trainer, meanings))  # building a trainer (a class the notebook derives from one too)
        self.trainer = self.trainer or trainer
        if trainer:
            self._trainers_model(node)
        self.checkpointing = self.checkpointing or any(CHECKPOINTS.match(m, known(m, self.analysis.packages))
                                                       for m in meanings)
        self.quantized = self.quantized or any(is_entry(m, QUANTIZERS) for m in meanings)
        credentials = any((arg.keyword is None and not arg.star) or (arg.keyword is not None and
                                                                      arg.keyword.value in CREDENTIALS)
                          for arg in node.args)
        asks = prompt(meanings, credentials, self.modules)
        if asks:
            self.prompts.setdefault((self.cell, asks[0], self.main_only > 0), asks[1])
        if CONFIG in what:
            unused, static = keyword(node, "ddp_find_unused_parameters"), keyword(node, "ddp_static_graph")
            if any(arg.star == "**" for arg in node.args):
                self.own_ddp.append(f"{name}(**kwargs)")
            elif unused is None or not _off(unused.value):
                self.own_ddp.append(f"{name}(ddp_find_unused_parameters=...)")
            if static is not None and not _off(static.value):
                self.own_ddp.append(f"{name}(ddp_static_graph=...)")
        elif trainer and node.args and keyword(node, "args") is None \
                and sum(arg.keyword is None and not arg.star for arg in node.args) < 2:
            self.own_ddp.append(f"{name}() without args")
        elif SAVE in what and node.args and node.args[0].keyword is None:
            self.saved.add(self.analysis.literal(node.args[0].value))
        elif LOAD in what:
            self._model(node)
            device_map = keyword(node, "device_map")
            if device_map is None or not isinstance(device_map.value, cst.Call) \
                    or code_of(device_map.value.func) != OURS or device_map.value.args:
                self.split_model = True

    def visit_Name(self, node):
        self.names.add(node.value)
        if node.value in IPYTHON_BUILTINS and self.analysis.meanings(node) == {node.value}:
            self.ipython.add(node.value)  # display(...) without an import: IPython's builtin

    def visit_Arg(self, node):
        key = node.keyword.value if node.keyword is not None else None
        if key in CHECKPOINTING and not _off(node.value):
            self.checkpointing = True
        elif key in QUANTIZED and not _off(node.value):
            self.quantized = True
        elif key == "ensure_weight_tying":
            self.weight_tying = True
        elif key == "unsloth_tiled_mlp" and not _off(node.value):
            self.tiled_mlp = True
        elif key in VLLM and not _off(node.value):
            self.vllm.setdefault(self.cell, key)

    def visit_SimpleString(self, node):  # os.environ["UNSLOTH_TILED_MLP"] = ...
        if node.evaluated_value == "UNSLOTH_TILED_MLP":
            self.tiled_mlp = True


def sized_loads(facts: _Facts) -> list:
    """The model loads the script sizes: those whose id the converter read, but not a folder the notebook itself
    saves a model to (it is not there when the script starts)."""
    return [load for load in facts.models if load[0] not in facts.saved]


def needs(facts: _Facts) -> dict[str, str]:
    """Runtime module -> why this notebook needs it."""
    why = {"hash_seed": "every script: one string hash on every rank (a rank another launcher started begins again "
                        "with PYTHONHASHSEED=0, before torch's import)",
           "group": "every script: ranks from torchrun's environment, this rank's device, the process group",
           "one_writer": "every script: saving and pushing on rank 0 only, also where the converter cannot see it",
           "files": "every script: a file that every rank writes is written by one rank per machine",
           "file_races": "every script: a folder that every rank makes or a file that every rank moves, made or "
                         "moved once",
           "agree": "every script: rank 0 says whether the ranks trained the same weights",
           "stdin_fd": "every script: rank 0 alone reads stdin, every rank reads the same, a stdin that gives "
                       "nothing ends, never a hang",
           "same_random": "every script: one random state on every rank, also for generators made without a seed",
           "owner": "every script: a rank leaves when the kernel or shell that started its job is gone"}
    if facts.prompts:
        asked = ", ".join(dict.fromkeys(what.split(" ")[0] for _, what, _ in facts.prompts))
        why["ask"] = f"the notebook asks for values ({asked}): rank 0 asks, every rank gets the answer, or EOFError " \
                     "and a line saying what to set"
    if sized_loads(facts):
        why["fit"] = "the notebook loads a model: DDP if it fits one GPU, else one process split over all of them"
    unsloth = bool(facts.modules & {"unsloth", "unsloth_zoo"})
    if sized_loads(facts) and facts.adapters and not facts.vllm:  # vLLM's engine would load it whole
        why["shard_mode"] = "the notebook loads a model and trains adapters (peft's or Unsloth's): where the model " \
                            "does not fit one GPU, its frozen layers sharded over the processes (NBDDP_MODE=shard)"
    helpers = {module: sorted(n for n in facts.names if n in HELPERS and HELPERS[n].module == module)
               for module in ("files", "share", "ipython_forms", "loop")}  # the steps' helpers of these (HELPERS)
    forms = helpers["ipython_forms"] + sorted(facts.ipython)
    if forms:
        why["ipython_forms"] = f"the notebook uses what IPython gives it ({', '.join(forms)}): in the script too"
    used = helpers["files"]
    if used:
        why["files"] += f"; the notebook calls {', '.join(used)}: once per machine, the other ranks wait"
    if helpers["share"]:
        why["share"] = f"rank 0's values or saved files, which every rank needs ({', '.join(helpers['share'])})"
    if facts.trainer and (facts.checkpointing or unsloth) and facts.own_ddp:
        why["strategy"] = (f"gradient checkpointing and {facts.own_ddp[0]}: DDP's graph settings chosen at run time "
                           "from the checkpointing mode")
    if facts.trainer and (facts.quantized or unsloth):
        why["lean_sync"] = "a quantized or Unsloth model: DDP's start-up sync without a copy of the largest weight"
    if unsloth:
        why["unsloth_group"] = "the notebook imports Unsloth: the process group starts right after that import"
    if unsloth and facts.tiled_mlp:
        why["tiled_mlp"] = "the notebook turns on Unsloth's TiledMLP, whose chunked backward DDP cannot follow"
    if facts.split_model and (unsloth or "xformers" in facts.modules):
        why["xformers_shim"] = "a model load keeps the notebook's device_map, which may spread it over GPUs: " \
                               "xformers' attention bias follows the query's device"
    if unsloth or facts.weight_tying:
        why["peft_shim"] = "LoraConfig(ensure_weight_tying=...) " + (
            "from Unsloth's get_peft_model" if unsloth else "in the notebook") + " on any peft version"
    if facts.trainer:
        why["global_batch"] = "the notebook trains with a Trainer: its global batch kept where the process count " \
                              "divides gradient_accumulation_steps (NBDDP_BATCH=scale: N times its samples)"
    loop = helpers["loop"]
    if loop:
        why["loop"] = f"the notebook trains in a loop of its own ({', '.join(loop)}): one model over every rank"
    if facts.trainer:
        why["balance"] = "the notebook trains with a Trainer: each step's samples dealt to the ranks by length"
    return why


class RuntimeNeeds(TreeStep):
    """Records in the context which runtime modules the script carries; the notebook is not changed."""

    name = "runtime"

    def run(self, tree, ctx):
        facts = _Facts(tree.names)
        walk(tree.module, facts)
        facts.adapters = uses_peft(tree)
        loads = sized_loads(facts)
        models = tuple(dict.fromkeys((model, bits) for model, bits, _, _ in loads))
        why = needs(facts)
        for model, bits, cell, placement in loads[:1]:
            sharded = "else its frozen layers sharded over the processes where each one's share fits " \
                      "(NBDDP_MODE=shard), " if "shard_mode" in why else ""
            ctx.report.change(cell, f"model {model} ({bits}-bit, the notebook's placement: {placement}): one process "
                                    f"per GPU where it fits one GPU, {sharded}else one process with the model split "
                                    "over every GPU; the script decides at run time")
        for cell, shown in facts.unsized:
            ctx.report.warn(cell, f"from_pretrained({shown}, ...): nbddp cannot read which model or how it loads, "
                                  "so the script cannot check that it fits one GPU (it runs one process per GPU): "
                                  "give the id as a literal, or NBDDP_MODE=split where it does not fit one GPU")
        for cell, key in facts.vllm.items():
            ctx.report.change(cell, f"{key}=True: nbddp has not run vLLM under DDP; each process would start its own "
                                  "vLLM engine on its GPU beside training (gpu_memory_utilization of that GPU): if the "
                                  f"job fails or runs out of memory there, set {key}=False")
        for (cell, what, main_only), instead in facts.prompts.items():
            who = "in a rank-0-only block: only rank 0 asks and gets the answer" if main_only else \
                "rank 0 asks, every rank gets the answer"
            ctx.report.change(cell, f"{what}: {who}; with no answer the job stops: {instead}")
        ctx.runtime = Choice(why, frozenset(facts.names), models, scale_batch=ctx.options.scale_batch)
        return tree.module
