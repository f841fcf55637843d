"""What a call does, through the notebook's own functions: the vocabulary's kinds of the callee, and for a function,
lambda, `functools.partial` or method the notebook defines, or a function of a module of its own (`%%writefile
utils.py`, then `utils.run(...)`: nbddp.written), the kinds of everything its body calls, transitively.

    effects = Effects(names)             # names: nbddp.meanings.Names of the notebook's tree
    effects.of_call(call)    -> frozenset of nbddp.vocabulary kinds
    effects.of_def(node)     -> the kinds a FunctionDef/Lambda's body does when it runs
    effects.main_only(call)  -> True where the call does only rank-0 work (saves, pushes, generates, displays, logs)
    effects.mixed(node)      -> True for a def that does work every rank must do *and* rank-0 work: it runs on every
                                rank, and the rank-0 work inside its body is guarded where it stands
    effects.prepares_data(call) -> True for a call of the notebook's own function that loads or maps datasets and does
                                nothing else every rank must do together: main-process-first as a whole

A custom training loop is a loop whose body (through the notebook's functions too) does a backward pass and an
optimizer step: `{BACKWARD, STEP} <= effects.of_node(loop.body)` (nbddp.vocabulary's kinds; `loss.backward()`,
`accelerator.backward(loss)`, `optimizer.step()` of a torch.optim/bitsandbytes optimizer or `scaler.step(opt)`).
"""
from __future__ import annotations

import libcst as cst

from .cst_helpers import LiveVisitor, arguments, keyword, live_calls
from .entries import CLOCK_BY_VALUE, TRACKER_PACKAGES
from .rank_conditions import RANK, reads_rank
from .vocabulary import (BACKWARD, COLLECTIVE, DATA, GENERATE, LOAD, MAIN_ONLY, NOTEBOOK_LAUNCHERS, OWN_VALUE, PEFT,
                         PRINT, RANK_LOGIC, SAVE, STEP, SYNC, TRAINS, is_file_write, is_generation_pipeline)
from .walk import walk

FUNCTION_MAIN_ONLY = MAIN_ONLY - {PRINT}  # a helper that only prints still runs everywhere (it may compute too)
TOGETHER_KINDS = frozenset({COLLECTIVE, SYNC, TRAINS, BACKWARD, STEP})  # work every rank does together


class Effects:
    def __init__(self, names):
        self.names = names
        self._defs: dict = {}
        self._calls: dict = {}
        self._modules: dict = {}  # the Names of a module of the notebook's own (nbddp.written) -> its Effects
        own = getattr(names, "own", None)
        self._module_def = own.definition if own is not None else lambda meaning: None

    def of_call(self, call: cst.Call) -> frozenset:
        call = self.names.orig(call)
        if call not in self._calls:
            self._calls[call] = self._of_call(call)
        return self._calls[call]

    def _of_call(self, call: cst.Call) -> frozenset:
        names = self.names
        meanings = names.meanings(call.func)
        found = set(names.kinds(call.func))
        for arg in call.args:  # generation handed over rather than called: Thread(target=model.generate)
            if isinstance(arg.value, cst.Attribute) and GENERATE in names.kinds(arg.value):
                found.add(GENERATE)
        if is_generation_pipeline(meanings, *map(names.literal, arguments(call, "task"))):
            found.add(GENERATE)
        if is_file_write(meanings, *map(names.literal, arguments(call, "file", "mode"))):
            found.add(SAVE)
        if meanings & CLOCK_BY_VALUE and call.args and names.literal(call.args[0].value) in ("now", "today"):
            found.add(OWN_VALUE)  # `np.datetime64("now")`: the clock, by what it is given
        for node in names.definitions(call.func) + (names.definitions(call.args[0].value) if call.args and
                                                     meanings & NOTEBOOK_LAUNCHERS else []):  # the launcher runs it
            found |= self.of_def(node)
        for arg in call.args if any("()." in m for m in meanings) else ():  # a function of the notebook's that a
            for node in names.definitions(arg.value):  # method runs now (`study.optimize(objective)`): its training is
                found |= self.of_def(node) & TOGETHER_KINDS  # the call's (a class it is given, `Thread(target=f)`,
                # runs it later: when the value's method is called)
        for inner, node in filter(None, map(self._module_def, meanings)):  # a function of a module of its own
            if inner not in self._modules:
                self._modules[inner] = Effects(inner)
            found |= self._modules[inner].of_def(node)
        for cls in names.classes:  # a class of the notebook's: making one runs its fields' default factories
            if f"__main__.{cls.name.value}" in meanings:
                found |= self._factories(cls)
        return frozenset(found)

    def _factories(self, cls: cst.ClassDef) -> set:
        """What the default factories of a (data)class's fields do: `field(default_factory=lambda: now())`."""
        found = set()
        for line in cls.body.body:
            for small in line.body if isinstance(line, cst.SimpleStatementLine) else ():
                value = getattr(small, "value", None)  # dataclasses', pydantic's, msgspec's keyword
                factory = keyword(value, "default_factory") if isinstance(value, cst.Call) else None
                if factory is not None:
                    found |= self.names.kinds(factory.value) | set().union(
                        *(self.of_def(node) for node in self.names.definitions(factory.value)))
        return found

    def of_def(self, node) -> frozenset:
        node = self.names.orig(node)
        if node not in self._defs:
            self._defs[node] = frozenset()  # a recursive function: what is known so far
            self._defs[node] = self.of_node(node.body) | (  # a def's block, a lambda's expression; and its own
                {RANK_LOGIC} if self._by_rank(node) else set())  # test of the rank
        return self._defs[node]

    def _by_rank(self, node) -> bool:
        """What the function does depends on the rank: its body reads it, or a decorator picks the processes it runs
        on."""
        return RANK in reads_rank(node.body, self.names) or bool(self.picking(node))

    def picking(self, node) -> list:
        """The decorators of a def that pick the processes it runs on, by what they read (accelerate's
        `on_process(process_index=1)`, `on_last_process`), or by what a decorator of the notebook's own does
        (`@on_rank(1)` whose wrapper tests `dist.get_rank()`)."""
        def own(decorator):
            return RANK_LOGIC in (self.of_call(decorator) if isinstance(decorator, cst.Call) else frozenset().union(
                *(self.of_def(d) for d in self.names.definitions(decorator))))
        return [d.decorator for d in getattr(node, "decorators", ())
                if RANK in reads_rank(d.decorator, self.names) or own(d.decorator)]

    def of_node(self, node) -> frozenset:
        """The kinds of everything a statement or expression runs (def and lambda bodies: when called)."""
        return frozenset().union(*(self.of_call(c) for c in live_calls(node)))

    def collective(self, call) -> bool:
        return COLLECTIVE in self.of_call(call)

    def main_only(self, call) -> bool:
        """Only rank-0 work: not a collective, nor a function of the notebook's that decides by the rank itself."""
        found = self.of_call(call)
        return bool(found & FUNCTION_MAIN_ONLY) and not found & {COLLECTIVE, RANK_LOGIC}

    def mixed(self, node, prints: bool = True) -> bool:
        found = self.of_def(node)
        return COLLECTIVE in found and bool(found & (MAIN_ONLY if prints else FUNCTION_MAIN_ONLY))

    def prepares_data(self, call) -> bool:
        """`dataset = get_questions()` whose body loads and maps a dataset: every collective in the function's body is
        dataset work, made there (not in a function it calls), and it saves, generates and logs nothing."""
        definitions = self.names.definitions(call.func)
        for node in definitions:
            found = self.of_def(node)
            if DATA not in found or found & (FUNCTION_MAIN_ONLY | {BACKWARD, STEP, LOAD, PEFT}):
                return False
            for inner in live_calls(node.body):
                if COLLECTIVE in self.of_call(inner) and (DATA not in self.of_call(inner) or self.helper(inner)):
                    return False
        return bool(definitions)

    def reads_tracker(self, node) -> bool:
        """The node reads state a tracker keeps (`wandb.run.name`, `mlflow.active_run().info`): rank 0's alone, where
        only rank 0 started the run."""
        attributes = _Attributes()
        walk(node, attributes)
        return any(m.split(".")[0] in TRACKER_PACKAGES for a in attributes.found for m in self.names.meanings(a))

    def helper(self, call) -> bool:
        """The callee is one of the notebook's own functions."""
        return bool(self.names.definitions(call.func))


class _Attributes(LiveVisitor):
    """The attribute reads in live code (a def's body runs when called)."""

    def __init__(self):
        self.found: list[cst.Attribute] = []

    def visit_Attribute(self, node):
        self.found.append(node)
