"""What the notebook's names and expressions are: the one name and value analysis every conversion step shares.

Built once on the notebook's tree right after the magics step (nbddp.tree.Tree.names), from libcst's scope
analysis (ScopeProvider, computed once: nbddp.walk.scopes), so a name means what it is bound to where it is
read: imports and their aliases (`from unsloth import FastLanguageModel as FLM`), assignments (`FLM2 = FLM`,
`model, tok = FLM.from_pretrained(...)`), builtins (`map`), the notebook's own functions, lambdas and
`functools.partial`s, in every scope.

API (every node may be one a step rewrote: `orig()` maps it back to the node the analysis saw):
  names.meanings(expr)    -> frozenset of dotted paths: `unsloth.FastLanguageModel.get_peft_model` for
                             `FLM.get_peft_model`, `datasets.load_dataset().map` for `ds.map` of `ds = load_dataset()`,
                             `()` marks a value made by a call; the notebook's own `f` is `__main__.f`; a parameter is
                             what the notebook's calls give it (`sites`); `self.bot` in a method is what the class's
                             methods assign to it; `getattr(m, "x")` is m.x (else m.?); a name bound nowhere: as is.
  names.sites(function)   -> each call of the notebook's function with the arguments it binds (parameter -> argument);
                             names.passed(param): what those calls (and its default) give one parameter.
  names.definitions(expr) -> the notebook's own FunctionDef/Lambda nodes a callee refers to (a def, a lambda bound to
                             a name, `partial(f, ...)`, a method of a class the notebook defines, through `obj.m`).
  names.value(name)       -> the expression a name was last assigned, or None; names.literal(node): its literal, or ...
  names.bindings(name)    -> the nodes a read of the name may be bound by (an Assign, a Param, a def, an import).
  names.orig(node)        -> the node the analysis saw (steps record rewrites in `names.origin`; see tree.py).
Which names a statement reads and binds (the flow across cells): nbddp.reads_writes."""
from __future__ import annotations

import libcst as cst
from libcst.metadata import BuiltinAssignment, GlobalScope, ImportAssignment

from .bindings import Bindings, receivers, returns_of, static
from .cst_helpers import dotted
from .entries import PASS_THROUGH
from .vocabulary import kinds
from .walk import scopes, walk

MAX_MEANINGS, MAX_DEPTH = 12, 12
MAIN = "__main__"  # the notebook's own functions and classes are `__main__.name`, as in the script
PARTIALS = frozenset({"functools.partial", "partial"})
IMPORTS = frozenset({"importlib.import_module", "builtins.__import__"})  # a module, by its name
# What IPython adds to the builtins of the process it runs in (where %%torchrun and %ddp convert): the notebook's own
# names, as in a script, not Python's builtins (libcst asks the live `builtins` module).
IPYTHON_BUILTINS = frozenset({"display", "get_ipython"})


class Names:
    def __init__(self, module: cst.Module, watcher=None):
        self.module, self.scopes = module, scopes(module)
        bindings = Bindings(set(module.body), watcher)
        walk(module, bindings)
        self.values, self.classes, self.order = bindings.values, bindings.classes, bindings.order
        self.fields, self.class_fields, self.attribute_reads = bindings.fields, bindings.class_fields, bindings.reads
        self.receivers = receivers(bindings.calls)  # x of x.m() and of x.y.m(): a method called of what it holds
        self.params, self._calls, self._sites = bindings.params, bindings.calls, None  # packages: roots whose
        self.packages = frozenset(bindings.packages)  # meanings are qualified names (nbddp.vocabulary)
        self.methods = {method for methods in self.classes.values() for method in methods.values()}
        self.referents = {access.node: access.referents for scope in set(self.scopes.values()) if scope is not None
                          for access in scope.accesses}
        self.origin: dict[cst.CSTNode, cst.CSTNode] = {}  # a rewritten node -> the node the analysis saw
        self.rank_reads: dict = {}  # what a node reads of the job's shape (nbddp.rank_conditions), once per analysis
        self._cache, self._visiting = {}, set()  # node -> its meanings; the values being read now

    def orig(self, node):
        return self.origin.get(node, node)

    def _assignments(self, name: cst.Name):
        """The bindings a read of `name` may see: at a notebook's top level, the latest one before it (cells run in
        order); in a function, every binding of its scope and the enclosing ones (it may run at any time). A name a
        step wrote (not in the analysed tree) reads the notebook's global bindings of that name."""
        referents = self.referents.get(name)
        if referents is None:
            scope = self.scopes.get(name, self.scopes.get(self.module))
            return None if scope is None else scope[name.value]
        scope = self.scopes.get(name)
        if isinstance(scope, GlobalScope) and len(referents) > 1:
            ordered = [r for r in referents if getattr(r, "node", None) in self.order]
            if len(ordered) == len(referents):
                return [max(ordered, key=lambda r: self.order[r.node])]
        return referents

    def meanings(self, expr, depth: int = 0) -> frozenset:
        expr = self.orig(expr)
        if expr in self._cache:
            return self._cache[expr]
        found = self._meanings(expr, depth) if depth < MAX_DEPTH else frozenset()
        found = frozenset(sorted(found)[:MAX_MEANINGS]) or frozenset({dotted(expr) or "?"})
        if depth == 0:
            self._cache[expr] = found
        return found

    def kinds(self, expr) -> frozenset:
        """What calling `expr` does (nbddp.vocabulary's kinds of its meanings, qualified where the notebook imports
        the package)."""
        return kinds(self.meanings(expr), self.packages)

    def _meanings(self, expr, depth) -> set:
        if isinstance(expr, cst.Attribute):
            held = self.field_values(expr, depth)  # `self.bot` in a method, `h.bot` of `h = Helper()`: what the
            if held:  # class's methods assign it
                return {m for value in held for m in self.meanings(value, depth + 1)}
            return {f"{m}.{expr.attr.value}" for m in self.meanings(expr.value, depth + 1)}
        if isinstance(expr, cst.Call):
            called = self.meanings(expr.func, depth + 1)
            if called & PARTIALS and expr.args:  # partial(f, ...) is f, with some arguments given
                return set(self.meanings(expr.args[0].value, depth + 1))
            named = self.literal(expr.args[0].value) if called & IMPORTS and expr.args else None
            if isinstance(named, str):  # `importlib.import_module("requests")` is the module `requests`
                return {named}
            if "builtins.getattr" in called and len(expr.args) > 1:  # getattr(m, "x") is m.x; some attribute of m
                got = self.literal(expr.args[1].value)
                got = got if isinstance(got, str) else "?"
                return {f"{m}.{got}" for m in self.meanings(expr.args[0].value, depth + 1)}
            if called & PASS_THROUGH and expr.args and expr.args[0].keyword is None:  # gives back its argument
                return set(self.meanings(expr.args[0].value, depth + 1)) | {f"{m}()" for m in called}
            return {f"{m}()" for m in called} | self._returned(expr.func, depth)
        if isinstance(expr, cst.Subscript):  # of a display the notebook built (`steps["fit"]`): any of its items
            held = self.value(expr.value) if isinstance(expr.value, cst.Name) else None
            items = held.elements if isinstance(held, (cst.Dict, cst.List, cst.Tuple, cst.Set)) else ()
            found = {m for item in items for m in self.meanings(item.value, depth + 1)} - {"?"}
            return found or {f"{m}[]" for m in self.meanings(expr.value, depth + 1)}
        if not isinstance(expr, cst.Name):
            return {dotted(expr) or "?"}
        assignments = self._assignments(expr)
        if not assignments:
            return {expr.value}
        found = set()
        for assignment in assignments:
            if isinstance(assignment, BuiltinAssignment):
                found.add(expr.value if expr.value in IPYTHON_BUILTINS else f"builtins.{expr.value}")
            elif isinstance(assignment, ImportAssignment):
                found |= {q.name for q in assignment.get_qualified_names_for(expr.value)}
            elif assignment.node in self.values and assignment.node not in self._visiting:
                self._visiting.add(assignment.node)  # `ds = ds.map(f)`: ds's own earlier meanings, once
                try:
                    found |= set(self.meanings(self.values[assignment.node], depth + 1))
                finally:
                    self._visiting.discard(assignment.node)
            elif isinstance(assignment.node, cst.Param) and assignment.node not in self._visiting:
                self._visiting.add(assignment.node)  # a parameter: what the notebook's calls pass it
                try:
                    passed = [m for arg in self.passed(assignment.node) for m in self.meanings(arg, depth + 1)]
                finally:
                    self._visiting.discard(assignment.node)
                found |= set(passed) or {expr.value}  # no call gives it a value: its own name
            elif isinstance(assignment.node, (cst.FunctionDef, cst.ClassDef)):  # the notebook's own: `__main__.f`
                found.add(f"{MAIN}.{expr.value}")
                if isinstance(assignment.node, cst.ClassDef):  # and a class of the notebook's is what it derives from
                    found |= {m for base in assignment.node.bases for m in self.meanings(base.value, depth + 1)}
            else:
                found.add(expr.value)  # a loop variable, an exception: its own name (what it holds, unknown)
        return found

    def _fields(self, expr: cst.Attribute):
        """The `self.x` facts of the class of the notebook whose method reads `expr` through its own `self`."""
        if isinstance(expr.value, cst.Name):
            for assignment in self._assignments(expr.value) or ():
                if getattr(assignment, "node", None) in self.fields:
                    return self.fields[assignment.node]
        return None

    def field_values(self, expr: cst.Attribute, depth: int = 0) -> list:
        """The values the methods of a class of the notebook assign to `self.<attr>`, where `expr` is read through a
        method's own `self`, or through an instance the class made (`h.bot` after `h = Helper()`)."""
        if self._fields(expr) is not None:
            return self._fields(expr).values.get(expr.attr.value, [])
        return [value for cls in self._classes_of(expr.value, depth + 1) if cls in self.class_fields
                for value in self.class_fields[cls].values.get(expr.attr.value, [])]

    def only_called(self, expr) -> bool:
        """Every read of the value `expr` names (a name of the notebook's, `self.x` in a method) calls one of its
        methods, or its attributes' (`client.chat_postMessage(...)`, `dk.containers.run(...)`): no other code sees
        what those calls do to it."""
        expr = self.orig(expr)
        reads = self._field_reads(expr) if isinstance(expr, cst.Attribute) else [
            r.node for a in self._assignments(expr) or () for r in getattr(a, "references", ())] if isinstance(
            expr, cst.Name) else []
        return bool(reads) and all(r in self.receivers for r in reads)

    def _returned(self, func, depth) -> set:
        """What calling the notebook's own function gives: its `return` values' meanings (`make_trainer()` is
        `trl.SFTTrainer()` where the function returns one)."""
        found = set()
        for definition in self.definitions(func, depth + 1):
            if isinstance(definition, cst.FunctionDef) and definition not in self._visiting:
                self._visiting.add(definition)
                try:
                    for value in returns_of(definition):
                        found |= set(self.meanings(value, depth + 1))
                finally:
                    self._visiting.discard(definition)
        return found

    def sites(self, function: cst.FunctionDef) -> list[tuple[cst.Call, dict]]:
        """Each call of the notebook's `function`, anywhere in the notebook, with the arguments it binds: parameter
        name -> argument (by position, past `self` for a method, or by keyword; none past a `*args`)."""
        function = self.orig(function)
        if self._sites is None:
            self._sites = {}
            defined = {f.name.value for f in set(self.params.values())} | {c.name.value for c in self.classes}
            for call in self._calls:
                name = call.func.value if isinstance(call.func, cst.Name) else \
                    call.func.attr.value if isinstance(call.func, cst.Attribute) else None
                if name in defined:
                    for definition in self.definitions(call.func):
                        self._sites.setdefault(definition, []).append(call)
        if not isinstance(function, cst.FunctionDef):
            return []
        positional = [*function.params.posonly_params, *function.params.params][
            1 if function in self.methods and not static(function) else 0:]
        found = []
        for call in self._sites.get(function, ()):
            given = [a for a in call.args if a.keyword is None]
            given = given[:next((i for i, a in enumerate(given) if a.star), len(given))]  # `f(*args)`: unknown
            bound = {p.name.value: a.value for p, a in zip(positional, given)}
            bound.update((a.keyword.value, a.value) for a in call.args if a.keyword is not None)
            found.append((call, bound))
        return found

    def passed(self, param: cst.Param) -> list:
        """What the notebook gives a parameter of one of its functions: its default, and what each call binds."""
        param = self.orig(param)
        found = [param.default] if param.default is not None else []
        function = self.params.get(param)
        name = param.name.value
        return found + [bound[name] for _, bound in self.sites(function) if name in bound] if function else found

    def function_of(self, param: cst.Param):
        """The notebook's def a parameter belongs to."""
        return self.params.get(self.orig(param))

    def bindings(self, name: cst.Name) -> list:
        """The nodes a read of `name` may be bound by (an assignment, a parameter, a def, an import, ...)."""
        return [getattr(a, "node", None) for a in self._assignments(self.orig(name)) or ()]

    def value(self, name: cst.Name):
        """The expression a read of `name` was last bound to by an assignment (None: an import, a def, a parameter,
        or nothing nbddp can read)."""
        assignments = [a for a in self._assignments(self.orig(name)) or () if getattr(a, "node", None) in self.values]
        if not assignments:
            return None
        latest = max(assignments, key=lambda a: self.order.get(a.node, -1))
        return self.values[latest.node]

    def literal(self, node, depth: int = 0):
        """The value of a literal (a string, True, False, None), or of a name last assigned one; else `...`."""
        if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)) and isinstance(node.evaluated_value, str):
            return node.evaluated_value
        if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[node.value]
        if isinstance(node, cst.Name) and depth < MAX_DEPTH:
            value = self.value(node)
            return self.literal(value, depth + 1) if value is not None else ...
        return ...

    def _field_reads(self, expr: cst.Attribute) -> list:
        """Every read of the attribute `expr` names, of a class of the notebook's: through its methods' own `self`
        and through the instances it made (`h.client` after `h = Helper()`), where and how its value is used."""
        fields, attr = self._fields(expr), expr.attr.value
        classes = {cls for cls, record in self.class_fields.items() if record is fields} if fields is not None else \
            {cls for cls in self._classes_of(expr.value, 1) if cls in self.class_fields}
        reads = [read for cls in classes for read in self.class_fields[cls].reads.get(attr, [])]
        return reads + [read for read in self.attribute_reads.get(attr, ())
                        if read not in reads and classes & set(self._classes_of(read.value, 1))]

    def definitions(self, expr, depth: int = 0) -> list:
        """The notebook's own functions (FunctionDef or Lambda) a callee refers to."""
        expr = self.orig(expr)
        if depth > MAX_DEPTH:
            return []
        if isinstance(expr, cst.Lambda):
            return [expr]
        if isinstance(expr, cst.Call) and PARTIALS & self.meanings(expr.func) and expr.args:
            return self.definitions(expr.args[0].value, depth + 1)
        if isinstance(expr, cst.Attribute):  # obj.method, obj made by a class the notebook defines
            found = []
            for cls in self._classes_of(expr.value, depth + 1):
                method = self.classes[cls].get(expr.attr.value)
                found += [method] if method is not None else []
            return found
        if not isinstance(expr, cst.Name):
            return []
        found = []
        for assignment in self._assignments(expr) or ():
            node = getattr(assignment, "node", None)
            if isinstance(node, cst.FunctionDef):
                found.append(node)
            elif isinstance(node, cst.ClassDef):  # calling a class runs its __init__
                init = self.classes[node].get("__init__")
                found += [init] if init is not None else []
            elif node in self.values and node is not expr:
                found += self.definitions(self.values[node], depth + 1)
        return found

    def _classes_of(self, expr, depth) -> list:
        """The notebook's classes an instance expression was made by: `h` after `h = Helper(...)`."""
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name):
            return [a.node for a in self._assignments(expr.func) or () if isinstance(getattr(a, "node", None),
                                                                                     cst.ClassDef)]
        if isinstance(expr, cst.Name) and depth <= MAX_DEPTH:
            return [cls for a in self._assignments(expr) or () if getattr(a, "node", None) in self.values
                    for cls in self._classes_of(self.values[a.node], depth + 1)]
        return []
