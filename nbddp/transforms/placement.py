"""Step: every model load puts the whole model on the rank's own device (`device_map=nbddp_device_map()`).

A load is what nbddp.vocabulary calls LOAD: `from_pretrained` of a model class, through the notebook's imports and
aliases (`FLM = FastLanguageModel`). A notebook's own splitting placement ("balanced", "auto", ...) stays as the
argument, `nbddp_device_map("balanced")`: the script uses it when the model fits only split over every GPU, in one
process (runtime/fit.py decides)."""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import add_keyword, code_of, dotted, keyword
from ..features import ADD, COMPUTED, OURS, PLACED, SPLIT, STARS, placement
from ..vocabulary import LOAD, parts
from .base import CallRewriter, TreeStep


def loader_name(call) -> str:
    """How the report names a load: `FastLanguageModel.from_pretrained`, as the notebook wrote it."""
    return ".".join(parts(dotted(call.func) or code_of(call.func))[-2:])


class _Placement(CallRewriter):
    def leave_Call(self, original, updated):
        if LOAD not in self.kinds(original):
            return updated
        where, ours, loader = placement(original), cst.Call(cst.Name(OURS)), loader_name(updated)
        if where in (PLACED, STARS):
            if where == STARS:
                self.report.warn(self.cell, f"{loader}(**kwargs): cannot tell if device_map is set; "
                                 "make sure it is device_map=nbddp_device_map()")
            return updated
        if where == ADD:
            self.report.change(self.cell, f"{loader}: device_map → this rank's own device")
            return add_keyword(updated, "device_map", ours)
        existing = keyword(updated, "device_map")
        shown = code_of(existing.value)
        if where == COMPUTED:
            self.report.warn(self.cell, f"{loader}: device_map={shown} is computed by the notebook; left as is, "
                             "but under DDP it must be this rank's device: use device_map=nbddp_device_map()")
            return updated
        if where == SPLIT:
            self.report.warn(self.cell, f"{loader}: device_map={shown} split the model across GPUs; under DDP "
                             "each GPU holds the whole model, and where it does not fit one GPU the script runs "
                             f"one process with device_map={shown} instead (decided at run time)")
            ours = ours.with_changes(args=[cst.Arg(existing.value)])
        else:
            self.report.change(self.cell, f"{loader}: device_map={shown} → this rank's own device")
        return updated.with_changes(args=[a.with_changes(value=ours) if a is existing else a for a in updated.args])


class Placement(TreeStep):
    name = "placement"
    inserts = (OURS,)
    rewriter = _Placement
    wants = frozenset({LOAD})
