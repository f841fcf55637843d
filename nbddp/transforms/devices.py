"""Step: every spelling that pins one GPU becomes the rank's own device, or gets a report line.

Under DDP each rank has its own GPU (`NBDDP_DEVICE`, `cuda:LOCAL_RANK`; the runtime makes it the current device), so
`"cuda"`, `.cuda()` and `.to("cuda")` are right already; a fixed GPU number puts every rank on that one GPU:
`torch.cuda.set_device(0)`, `.cuda(0)`, `.to(0)`, `.to("cuda:0")`, `device=0` or `device="cuda:0"` in any call,
`torch.device("cuda", 0)`, a variable or a parameter's default (`device = "cuda:0"`, `gpu = 0`, `def f(gpu=0)`)
later used as a device. A notebook's own `os.environ["CUDA_VISIBLE_DEVICES"] = ...` (also from `%env`) would hide
the other ranks' GPUs: it is removed. What cannot be rewritten safely (`set_device(gpu_id)` with a computed id) is
reported.
"""
from __future__ import annotations

import libcst as cst

from ..cst_helpers import code_of
from ..vocabulary import DEVICE, ENV, parts
from ..tree import Recording, TreeTransformer
from ..walk import walk
from .base import TreeStep
from .markers import Tidy, marker

RANK_DEVICE, RANK_INDEX = "NBDDP_DEVICE", "NBDDP_LOCAL_RANK"
VISIBLE = "CUDA_VISIBLE_DEVICES"
WHY = "a fixed GPU would put every rank on one GPU"


def pinned(value) -> bool:
    """A literal naming one GPU: `0`, `"cuda:1"`."""
    if isinstance(value, cst.Integer):
        return True
    return isinstance(value, cst.SimpleString) and isinstance(value.evaluated_value, str) and \
        value.evaluated_value.startswith("cuda:") and value.evaluated_value[5:].isdigit()


def _tails(names, call) -> set[str]:
    return {parts(m)[-1] for m in names.meanings(call.func)}


def _is_torch_device(names, call) -> bool:
    """`torch.device(...)` (or `device(...)` imported from torch)."""
    meanings = names.meanings(call.func)
    return {parts(m)[-1] for m in meanings} == {"device"} and any(m.startswith("torch.") or m == "device"
                                                                  for m in meanings)


def device_args(names, call) -> list[cst.Arg]:
    """The arguments of a call that name a device: `device=` anywhere, the first argument of `.to`/`.cuda`/
    `set_device`, every positional argument of `torch.device`."""
    tails = _tails(names, call)
    found = [a for a in call.args if a.keyword is not None and a.keyword.value == "device"]
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if tails & {"to", "cuda"} and isinstance(call.func, cst.Attribute) or "set_device" in tails:
        found += positional[:1]
    elif _is_torch_device(names, call):
        found += positional
    return found


class _DeviceUses(cst.CSTVisitor):
    """The bindings of names used as a device: `device` in `model.to(device)` after `device = "cuda:0"`."""

    def __init__(self, names):
        self.names, self.targets = names, set()

    def visit_Call(self, call):
        for arg in device_args(self.names, call):
            if isinstance(arg.value, cst.Name):
                self.targets.update(self.names.bindings(arg.value))


class _Strings(cst.CSTTransformer):
    def leave_SimpleString(self, original, updated):
        return cst.Name(RANK_DEVICE) if pinned(updated) else updated


class _Devices(TreeTransformer):
    def __init__(self, tree, ctx, targets):
        super().__init__(tree, ctx)
        self.targets, self.removed = targets, set()

    def leave_Call(self, original, updated):
        tails = _tails(self.names, original)
        if _is_torch_device(self.names, original) and any(pinned(a.value) for a in original.args):
            self.report.change(self.cell, f"{code_of(original)} → torch.device(NBDDP_DEVICE), this rank's own GPU; {WHY}")
            return updated.with_changes(args=[cst.Arg(cst.Name(RANK_DEVICE))])
        index = "set_device" in tails or ("cuda" in tails and isinstance(original.func, cst.Attribute))
        args = list(updated.args)
        for arg in device_args(self.names, original):
            at = next(i for i, a in enumerate(original.args) if a is arg)
            if pinned(arg.value):
                name = RANK_INDEX if index and isinstance(arg.value, cst.Integer) else RANK_DEVICE
                self.report.change(self.cell, f"{code_of(original.func)}(...{code_of(arg.value)}...) → {name}, this "
                                              f"rank's own GPU; {WHY}")
                args[at] = args[at].with_changes(value=cst.Name(name))
            elif isinstance(arg.value, cst.FormattedString) and code_of(arg.value)[2:].startswith("cuda:"):
                self.report.warn(self.cell, f"{code_of(original)}: a GPU number computed by the notebook; under DDP "
                                            f"each rank must use its own: use {RANK_DEVICE}")
            elif "set_device" in tails and not self._ours(arg.value):
                self.report.warn(self.cell, f"{code_of(original)}: nbddp cannot tell which GPU this picks; under DDP "
                                            f"each rank must use its own: use {RANK_INDEX}")
        return updated.with_changes(args=args)

    def _ours(self, value) -> bool:
        """The rank's own device already: NBDDP_*, or a name this step points at it."""
        if isinstance(value, cst.Name) and any(node in self.targets for node in self.names.bindings(value)):
            return True
        return any(m.startswith("NBDDP_") for m in self.names.meanings(value))

    def _own(self, shown, value):
        """`value`, bound to a name later used as a device, made this rank's own GPU where it names a fixed one."""
        new = cst.Name(RANK_INDEX) if isinstance(value, cst.Integer) else value.visit(_Strings())
        if new.deep_equals(value):
            return value
        self.report.change(self.cell, f"{shown} → this rank's own GPU; {WHY}")
        return new

    def leave_Assign(self, original, updated):
        if any(self.names.orig(t.target) in self.targets for t in original.targets if isinstance(t.target, cst.Name)):
            return updated.with_changes(value=self._own(code_of(original).strip(), updated.value))
        return updated

    def leave_Param(self, original, updated):  # `def put(model, gpu=0)`: the default
        if self.names.orig(original) in self.targets and updated.default is not None:
            shown = f"{original.name.value}={code_of(original.default)}"
            return updated.with_changes(default=self._own(shown, updated.default))
        return updated

    def leave_SimpleStatementLine(self, original, updated):
        kept = [s for s in updated.body if not _sets_visible(s)]
        if len(kept) == len(updated.body):
            return updated
        shown = "; ".join(code_of(s).strip().rstrip(";") for s in updated.body if _sets_visible(s))
        self.report.change(self.cell, f"removed `{shown}`: each rank gets its own GPU "
                                      f"(set {VISIBLE} where you launch the job to choose the GPUs)")
        if kept:
            return updated.with_changes(body=kept)
        removed = marker(f"removed {VISIBLE}: each rank uses its own GPU").with_changes(
            leading_lines=updated.leading_lines)
        self.removed.add(removed)
        return removed


def _sets_visible(small) -> bool:
    """`os.environ["CUDA_VISIBLE_DEVICES"] = ...` or `os.environ.setdefault("CUDA_VISIBLE_DEVICES", ...)`."""
    if isinstance(small, cst.Assign):
        return any(isinstance(t.target, cst.Subscript) and _names_visible(t.target.slice) for t in small.targets)
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and isinstance(small.value.func, cst.Attribute):
        call = small.value
        return call.func.attr.value == "setdefault" and bool(call.args) and _is_visible(call.args[0].value)
    return False


def _names_visible(slices) -> bool:
    return len(slices) == 1 and isinstance(slices[0].slice, cst.Index) and _is_visible(slices[0].slice.value)


def _is_visible(value) -> bool:
    return isinstance(value, cst.SimpleString) and value.evaluated_value == VISIBLE


class Devices(TreeStep):
    name = "devices"
    inserts = (RANK_DEVICE, RANK_INDEX)

    def run(self, tree, ctx):
        uses = _DeviceUses(tree.names)
        for stmt in tree.module.body:
            if DEVICE in tree.facts(stmt):
                walk(stmt, uses)
        uses.targets.discard(None)
        devices = _Devices(tree, ctx, uses.targets)
        module = tree.visit(devices, frozenset({DEVICE, ENV}))
        return module.visit(TidiedMarkers(tree.names, devices.removed)) if devices.removed else module


class TidiedMarkers(Recording, Tidy):
    """The magics step's tidying of the markers this step left, recording what it rewrites."""

    def __init__(self, names, only):
        super().__init__(only)
        self.names = names
