"""Step: which modules of `nbddp/runtime/` the converted notebook needs, and why (the script carries only those).

A function of the analysis' facts (nbddp.features: what the notebook imports, Unsloth, a Trainer from
transformers/trl/unsloth, xformers; what it asks for, gradient checkpointing, a quantized load, Unsloth's TiledMLP,
its own DDP settings; where it asks the user for a value, input(), getpass(), a library's login without a key: each
is reported, with what the script does) and of the runtime's helpers the other steps wrote into the script
(`nbddp_shell`, `nbddp_main_process_first`, ...). Where a value cannot be read (a variable, `**kwargs`), the module is
carried.
"""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import names_in
from ..features import Features
from ..inline import Choice
from ..runtime import HELPERS
from ..training_end import is_own_guard
from ..walk import walk
from .base import TreeStep


class _RankZero(cst.CSTVisitor):
    """The calls of the first tree that the converted script makes under `if NBDDP_IS_MAIN:` (no else): rank 0's."""

    def __init__(self, names):
        self.names, self.depth, self.calls = names, 0, set()

    @staticmethod
    def _guard(node) -> bool:
        return is_own_guard(node) and node.orelse is None

    def visit_If(self, node):
        self.depth += self._guard(node)

    def leave_If(self, node):
        self.depth -= self._guard(node)

    def visit_Call(self, node):
        if self.depth:
            self.calls.add(self.names.orig(node))


def needs(facts: Features, names) -> dict[str, str]:
    """Runtime module -> why this notebook needs it (`names`: those the converted script holds)."""
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
        asked = ", ".join(dict.fromkeys(what.split(" ")[0] for _, what, _ in facts.prompts.values()))
        why["ask"] = f"the notebook asks for values ({asked}): rank 0 asks, every rank gets the answer, or EOFError " \
                     "and a line saying what to set"
    if facts.sized_loads():
        why["fit"] = "the notebook loads a model: DDP if it fits one GPU, else one process split over all of them"
    unsloth = bool(facts.modules & {"unsloth", "unsloth_zoo"})
    if facts.sized_loads() and facts.adapters and not facts.vllm:  # vLLM's engine would load it whole
        why["shard_mode"] = "the notebook loads a model and trains adapters (peft's or Unsloth's): where the model " \
                            "does not fit one GPU, its frozen layers sharded over the processes (NBDDP_MODE=shard)"
    helpers = {module: sorted(n for n in names if n in HELPERS and HELPERS[n].module == module)
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
        facts, names, guarded = tree.features, names_in(tree.module), _RankZero(tree.names)
        walk(tree.module, guarded)
        loads = facts.sized_loads()
        models = tuple(dict.fromkeys((model, bits) for model, bits, _, _ in loads))
        why = needs(facts, names)
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
        asked = {(cell, what, call in guarded.calls): instead for call, (cell, what, instead) in facts.prompts.items()}
        for (cell, what, main_only), instead in asked.items():
            who = "in a rank-0-only block: only rank 0 asks and gets the answer" if main_only else \
                "rank 0 asks, every rank gets the answer"
            ctx.report.change(cell, f"{what}: {who}; with no answer the job stops: {instead}")
        ctx.runtime = Choice(why, frozenset(names), models, scale_batch=ctx.options.scale_batch)
        return tree.module
