"""What the notebook asks of the runtime, read once from the first tree: part of the one analysis (`Tree.features`).

    found = tree.features
    found.trainer, .checkpointing, .quantized, .adapters, ...  -> what its calls and keywords ask for
    found.models   -> (model id, bits, cell, the notebook's placement) of each load whose id is a literal
    found.prompts  -> the calls that ask the user for a value -> (cell, what it asks, how to give it instead)
    found.own_ddp  -> why the DDP settings the converter writes may not hold

The call-site decisions these facts follow from are made here too, so the steps that carry them out only rewrite:
where a model load puts the model (`placement`, read by nbddp.transforms.placement) and whether a trainer's
configuration gets `ddp_find_unused_parameters=False` (`ddp_setting`, read by nbddp.transforms.trainer_args). The
runtime step (nbddp.transforms.runtime_needs) turns these facts, and the runtime's helpers the other steps wrote,
into the modules the script carries.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from .cells import starts_cell
from .cst_helpers import code_of, has_star_kwargs, is_if_false, keyword
from .entries import is_entry, is_trainer
from .entry_match import Table
from .meanings import IPYTHON_BUILTINS
from .vocabulary import CONFIG, CREDENTIALS, LOAD, PEFT, SAVE, is_unsloth_loader, known, parts, prompt
from .walk import walk

CHECKPOINTS = Table(values={"transformers.PreTrainedModel().gradient_checkpointing_enable"})
QUANTIZERS = frozenset({"transformers.BitsAndBytesConfig"})
CHECKPOINTING = frozenset({"gradient_checkpointing", "use_gradient_checkpointing", "activation_checkpointing"})
QUANTIZED = frozenset({"load_in_4bit", "load_in_8bit", "quantization_config"})
VLLM = frozenset({"fast_inference", "use_vllm"})  # Unsloth's loader, TRL's GRPO/online configs
MODEL_KEYWORDS = ("model_name", "pretrained_model_name_or_path")

OURS = "nbddp_device_map"  # the runtime's placement: this rank's own device, or the notebook's split where needed
SPLITTING_MAPS = frozenset({"auto", "balanced", "balanced_low_0", "sequential"})
ADD, STARS, PLACED, SPLIT, OWN, COMPUTED = "add", "stars", "placed", "split", "own", "computed"
UNUSED = "ddp_find_unused_parameters"
SET, FULL, WRITE = "set", "full", "write"


def placement(call: cst.Call) -> str:
    """Where a model load puts the model, and so what the placement step does: ADD (no device_map: ours added),
    STARS (none given, but `**kwargs` may hold one: left, with a warning), PLACED (ours already), SPLIT (a splitting
    map of the notebook's, "auto", "balanced", ...: kept as ours' argument), OWN (another literal: replaced by ours),
    COMPUTED (a value the notebook computes: left, with a warning)."""
    existing = keyword(call, "device_map")
    if existing is None:
        return STARS if has_star_kwargs(call) else ADD
    value = existing.value
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == OURS:
        return PLACED
    if isinstance(value, cst.SimpleString) and value.evaluated_value in SPLITTING_MAPS:
        return SPLIT
    if isinstance(value, (cst.SimpleString, cst.Dict, cst.Integer)) or (isinstance(value, cst.Name)
                                                                      and value.value == "None"):
        return OWN
    return COMPUTED


def split_map(call: cst.Call):
    """The notebook's splitting map a load keeps (the literal, or the argument of ours in converted code), else None."""
    value = getattr(keyword(call, "device_map"), "value", None)
    if placement(call) == PLACED and value.args:
        return value.args[0].value
    return value if placement(call) == SPLIT else None


def ddp_setting(call: cst.Call, adapters: bool) -> str:
    """What becomes of a trainer configuration's `ddp_find_unused_parameters`: SET (the notebook's own), FULL (a full
    fine-tune: the Trainer's default), STARS (`**kwargs` may set it: a warning), WRITE (False written: every adapter
    parameter gets a gradient each step)."""
    if keyword(call, UNUSED) is not None:
        return SET
    return FULL if not adapters else STARS if has_star_kwargs(call) else WRITE


def _off(value) -> bool:
    """A keyword value that certainly turns the feature off: False, None, 0."""
    return (isinstance(value, cst.Name) and value.value in ("False", "None")) or \
        (isinstance(value, cst.Integer) and value.value == "0")


@dataclass
class Features:
    modules: set  # the packages the notebook imports
    adapters: bool = False  # it makes or loads adapters: get_peft_model (Unsloth's or peft's), or anything of peft's
    trainer: bool = False
    checkpointing: bool = False
    quantized: bool = False
    weight_tying: bool = False
    tiled_mlp: bool = False
    own_ddp: list = field(default_factory=list)  # why the DDP settings the converter writes may not hold
    split_model: bool = False  # a model load that keeps a placement of the notebook's own
    models: list = field(default_factory=list)  # (model id, bits, cell, the notebook's placement), ids it reads
    unsized: list = field(default_factory=list)  # (cell, the id as written) of loads whose id or size it cannot read
    saved: set = field(default_factory=set)  # folders the notebook saves a model to (not there when the script starts)
    ipython: set = field(default_factory=set)  # IPython's builtins the notebook reads (display, get_ipython)
    prompts: dict = field(default_factory=dict)  # a call that asks for a value -> (cell, what, how to give it instead)
    vllm: dict = field(default_factory=dict)  # cell -> the keyword that asks for vLLM (fast_inference=True, ...)

    def sized_loads(self) -> list:
        """The model loads the script sizes: those whose id the converter read, but not a folder the notebook itself
        saves a model to (it is not there when the script starts)."""
        return [load for load in self.models if load[0] not in self.saved]


class _Facts(cst.CSTVisitor):
    def __init__(self, names, adapters):
        self.analysis = self.names = names  # nbddp.meanings.Names: what the notebook's calls are (a module's own
        # while one of its functions is read)
        self.found = Features(set(names.packages), adapters)
        self.cell = 0
        self.followed: set = set()  # the functions of the notebook's own modules read so far (nbddp.written)

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
        shown = code_of(split_map(node)) if split_map(node) is not None else "none"
        if isinstance(model, str):
            self.found.models.append((model, bits, self.cell, shown))
        else:
            self.found.unsized.append((self.cell, code_of(arg.value) if arg is not None else ""))

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
        self.found.models.append((model, bits or (32 if dtype is None or self._float32(dtype) else 16), self.cell,
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
        return not is_if_false(node)  # dead code asks for nothing

    def _own_ddp(self, node, name):
        """Why the DDP graph settings of a trainer configuration may not be the converter's (nbddp.runtime's strategy
        then chooses them at run time)."""
        found = self.found.own_ddp
        if has_star_kwargs(node):
            found.append(f"{name}(**kwargs)")
        elif ddp_setting(node, self.found.adapters) == FULL or (keyword(node, UNUSED) is not None
                                                                and not _off(keyword(node, UNUSED).value)):
            found.append(f"{name}({UNUSED}=...)")
        static = keyword(node, "ddp_static_graph")
        if static is not None and not _off(static.value):
            found.append(f"{name}(ddp_static_graph=...)")

    def visit_Call(self, node):
        name = parts(code_of(node.func))[-1]
        what, meanings, found = self.analysis.kinds(node.func), self.analysis.meanings(node.func), self.found
        trainer = any(map(is_trainer, meanings))  # building a trainer (a class the notebook derives from one too)
        found.trainer = found.trainer or trainer
        if trainer:
            self._trainers_model(node)
        found.checkpointing = found.checkpointing or any(CHECKPOINTS.match(m, known(m, self.analysis.packages))
                                                         for m in meanings)
        found.quantized = found.quantized or any(is_entry(m, QUANTIZERS) for m in meanings)
        credentials = any((arg.keyword is None and not arg.star) or (arg.keyword is not None and
                                                                      arg.keyword.value in CREDENTIALS)
                          for arg in node.args)
        asks = prompt(meanings, credentials, found.modules)
        if asks:
            found.prompts[node] = (self.cell, *asks)
        if CONFIG in what:
            self._own_ddp(node, name)
        elif trainer and node.args and keyword(node, "args") is None \
                and sum(arg.keyword is None and not arg.star for arg in node.args) < 2:
            found.own_ddp.append(f"{name}() without args")
        elif SAVE in what and node.args and node.args[0].keyword is None:
            found.saved.add(self.analysis.literal(node.args[0].value))
        elif LOAD in what:
            self._model(node)
            found.split_model = found.split_model or placement(node) in (STARS, COMPUTED) or split_map(node) is not None
        self._follow(meanings)

    def _follow(self, meanings):
        """A function of a module of the notebook's own that it calls asks for what its body asks for (a Trainer
        built in `utils.run(...)`), read with that module's names."""
        own = getattr(self.analysis, "own", None)
        for inner, definition in filter(None, map(own.definition, meanings)) if own is not None else ():
            if definition not in self.followed:
                self.followed.add(definition)
                outer, self.analysis = self.analysis, inner
                walk(definition.body, self)
                self.analysis = outer

    def visit_Name(self, node):
        if node.value in IPYTHON_BUILTINS and self.analysis is self.names and self.analysis.meanings(node) == {
                node.value}:
            self.found.ipython.add(node.value)  # display(...) without an import: IPython's builtin

    def visit_Arg(self, node):
        key, found = node.keyword.value if node.keyword is not None else None, self.found
        if key in CHECKPOINTING and not _off(node.value):
            found.checkpointing = True
        elif key in QUANTIZED and not _off(node.value):
            found.quantized = True
        elif key == "ensure_weight_tying":
            found.weight_tying = True
        elif key == "unsloth_tiled_mlp" and not _off(node.value):
            found.tiled_mlp = True
        elif key in VLLM and not _off(node.value):
            found.vllm.setdefault(self.cell, key)

    def visit_SimpleString(self, node):  # os.environ["UNSLOTH_TILED_MLP"] = ...
        if node.evaluated_value == "UNSLOTH_TILED_MLP":
            self.found.tiled_mlp = True


def uses_peft(tree) -> bool:
    """The notebook makes or loads PEFT adapters: get_peft_model (Unsloth's or peft's), or anything of peft's
    (`PeftModel.from_pretrained`, a `LoraConfig` handed to a trainer as peft_config)."""
    names = tree.names
    return any(PEFT in tree.facts(stmt) or any(m.split(".")[0] == "peft" for c in tree.calls_in(stmt)
                                              for m in names.meanings(c.func)) for stmt in tree.first.body)


def read_features(tree) -> Features:
    """The notebook's features, from its first tree (before any step rewrote it)."""
    facts = _Facts(tree.names, uses_peft(tree))
    walk(tree.first, facts)
    return facts.found
