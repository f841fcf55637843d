"""Step: every model load puts the whole model on the rank's own device (`device_map=nbddp_device_map()`).

A notebook's own splitting placement ("balanced", "auto", ...) stays as the argument, `nbddp_device_map("balanced")`:
the script uses it when the model fits only split over every GPU, in one process (runtime/fit.py decides)."""
from __future__ import annotations

import libcst as cst

from ..cst import add_keyword, callee_owner, callee_tail, code_of, keyword, parse
from .base import CallRewriter, CstTransform, cell_number

FAST_LOADERS = frozenset({"FastLanguageModel", "FastVisionModel", "FastModel", "FastSentenceTransformer", "FastTextModel"})
MODEL_SUFFIXES = (
    "ForCausalLM", "ForConditionalGeneration", "ForSequenceClassification", "ForTokenClassification",
    "ForQuestionAnswering", "ForMaskedLM", "ForSeq2SeqLM", "ForImageTextToText", "ForSpeechSeq2Seq",
    "ForVision2Seq", "ForAudioClassification", "ForImageClassification", "ForCTC",
)
SPLITTING_MAPS = frozenset({"auto", "balanced", "balanced_low_0", "sequential"})
OURS = "nbddp_device_map"
DEVICE_CALLS = frozenset({"to", "device"})  # x.to("cuda:0"), torch.device("cuda:0")


def is_model_loader(call: cst.Call, loaders=frozenset()) -> bool:
    """`X.from_pretrained(...)` of a model class: Unsloth's loaders (every `Fast...Model`, whatever the model family;
    `loaders`: the names the notebook imported them under), `Auto*Model*`, `...ForCausalLM` and the like."""
    if callee_tail(call) != "from_pretrained":
        return False
    owner = callee_owner(call) or ""
    if owner.startswith("Peft"):
        return False
    return (owner in FAST_LOADERS or owner in loaders or (owner.startswith("Fast") and owner.endswith("Model"))
            or (owner.startswith("Auto") and "Model" in owner) or owner.endswith(MODEL_SUFFIXES))


def unsloth_loaders(cells, step) -> frozenset:
    """The names the notebook's `from unsloth... import Fast...` lines bind (its own `as` names included)."""
    found = _UnslothNames()
    for cell in cells:
        if "unsloth" in cell.source:
            parse(cell.source, cell=cell_number(cell), step=step).visit(found)
    return frozenset(found.names)


class _UnslothNames(cst.CSTVisitor):
    """The names `from unsloth... import Fast... as name` binds: Unsloth's loaders under the notebook's names."""

    def __init__(self):
        self.names = set()

    def visit_ImportFrom(self, node):
        module = cst.Module([]).code_for_node(node.module) if node.module is not None else ""
        if node.relative or module.split(".")[0] != "unsloth" or isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            if isinstance(alias.name, cst.Name) and alias.name.value.startswith("Fast"):
                self.names.add(alias.asname.name.value if alias.asname else alias.name.value)


class _Placement(CallRewriter):
    loaders = frozenset()

    def leave_Call(self, original, updated):
        if callee_tail(updated) in DEVICE_CALLS:
            return self._fixed_gpu(updated)
        if not is_model_loader(updated, self.loaders):
            return updated
        ours = cst.Call(cst.Name(OURS))
        loader = f"{callee_owner(updated)}.from_pretrained"
        existing = keyword(updated, "device_map")
        if existing is None:
            if any(arg.star == "**" for arg in updated.args):
                self.report.warn(self.cell, f"{loader}(**kwargs): cannot tell if device_map is set; "
                                 "make sure it is device_map=nbddp_device_map()")
                return updated
            self.report.change(self.cell, f"{loader}: device_map → this rank's own device")
            return add_keyword(updated, "device_map", ours)
        value = existing.value
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == OURS:
            return updated
        shown = code_of(value)
        if isinstance(value, (cst.SimpleString, cst.Dict, cst.Integer)) or (isinstance(value, cst.Name)
                                                                          and value.value == "None"):
            if isinstance(value, cst.SimpleString) and value.evaluated_value in SPLITTING_MAPS:
                self.report.warn(self.cell, f"{loader}: device_map={shown} split the model across GPUs; under DDP "
                                 "each GPU holds the whole model, and where it does not fit one GPU the script runs "
                                 f"one process with device_map={shown} instead (decided at run time)")
                ours = ours.with_changes(args=[cst.Arg(value)])
            else:
                self.report.change(self.cell, f"{loader}: device_map={shown} → this rank's own device")
            args = [a.with_changes(value=ours) if a is existing else a for a in updated.args]
            return updated.with_changes(args=args)
        self.report.warn(self.cell, f"{loader}: device_map={shown} is computed by the notebook; left as is, "
                         "but under DDP it must be this rank's device (nbddp_device_map())")
        return updated


    def _fixed_gpu(self, call):
        """`.to("cuda:0")` / `torch.device("cuda:0")` would put every rank on GPU 0: use the rank's own device."""
        args = []
        for arg in call.args:
            value = arg.value
            if (arg.keyword is None or arg.keyword.value == "device") and isinstance(value, cst.SimpleString) \
                    and isinstance(value.evaluated_value, str) and value.evaluated_value.startswith("cuda:") \
                    and value.evaluated_value[5:].isdigit():
                self.report.change(self.cell, f"{callee_tail(call)}({code_of(value)}) → this rank's own GPU "
                                   "(NBDDP_DEVICE); a fixed GPU number would put every rank on one GPU")
                arg = arg.with_changes(value=cst.Name("NBDDP_DEVICE"))
            args.append(arg)
        return call.with_changes(args=args)


class Placement(CstTransform):
    name = "placement"
    rewriter = _Placement
    triggers = ("from_pretrained", "cuda:")

    def preprocess(self, nb, ctx):
        self.loaders = unsloth_loaders(nb.cells, self.name)
        return super().preprocess(nb, ctx)

    def rewrite(self, module, cell_no, ctx):
        rewriter = self.rewriter(cell_no, ctx)
        rewriter.loaders = self.loaders
        return module.visit(rewriter)
