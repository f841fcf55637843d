"""Which names a statement reads and which it binds: the flow of values between the notebook's statements and cells.

  reads_writes(node) -> (names read, names bound): `x = f(y)` reads f and y and binds x; def and class bodies run
                        later (only their names are bound); a comprehension's or lambda's own names are its own.
  header_of(stmt)    -> the parts of a compound statement that run before its blocks decide anything.
  at_definition(stmt) -> what a def or class computes when it is defined (decorators, defaults, class attributes)
  free_reads(node)   -> the names a def or class reads from outside it
  file_of(call, ...) -> the file or folder a saving call writes by a literal path, as a name (`file:<path>`)
  files_named(call)  -> every literal path a call is given, as such names (what it may read)

Used by the rank guards (what reads a value made on rank 0 only), nbddp.needs (what training needs, transitively)
and nbddp.tree.Tree.visit (the statements that name an alias of given names). What a name means is nbddp.meanings.
"""
from __future__ import annotations

import posixpath
from functools import lru_cache

import libcst as cst

from .cst_helpers import arguments, names_in
from .vocabulary import PATH_KEYWORDS
from .walk import walk


class _ReadsWrites(cst.CSTVisitor):
    def __init__(self):
        self.reads: set[str] = set()
        self.writes: set[str] = set()

    def _bind(self, target):
        if isinstance(target, cst.Name):
            self.writes.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind(element.value)
        elif isinstance(target, cst.StarredElement):
            self._bind(target.value)
        else:  # x.attr = … / x[i] = …: reads x
            walk(target, self)

    def visit_Assign(self, node):
        for target in node.targets:
            self._bind(target.target)
        walk(node.value, self)
        return False

    def visit_AnnAssign(self, node):
        self._bind(node.target)
        if node.value is not None:
            walk(node.value, self)
        return False

    def visit_AugAssign(self, node):
        walk(node.target, self)
        self._bind(node.target)
        walk(node.value, self)
        return False

    def visit_For(self, node):
        self._bind(node.target)
        for part in (node.iter, node.body, node.orelse):
            if part is not None:
                walk(part, self)
        return False

    def visit_WithItem(self, node):
        walk(node.item, self)
        if node.asname is not None:
            self._bind(node.asname.name)
        return False

    def visit_ImportAlias(self, node):
        if node.asname is not None:
            self._bind(node.asname.name)
        else:
            name = node.name
            while isinstance(name, cst.Attribute):
                name = name.value
            self._bind(name)
        return False

    def visit_FunctionDef(self, node):
        self.writes.add(node.name.value)
        return False  # its body runs later, when called

    def visit_ClassDef(self, node):
        self.writes.add(node.name.value)
        return False

    def visit_Name(self, node):
        self.reads.add(node.value)

    def visit_Attribute(self, node):
        walk(node.value, self)  # `x.attr` reads x, not a name `attr`
        return False

    def visit_Arg(self, node):
        walk(node.value, self)  # `f(key=v)` reads v, not a name `key`
        return False

    def _own_scope(self, node, local, outer):
        """A comprehension or lambda: the names it binds are its own (`[0 for _ in x]` reads x, not `_`); `outer`
        (the first iterable, the defaults) runs in the enclosing scope."""
        inner = _ReadsWrites()
        for child in node.children:
            walk(child, inner)
        self.reads |= inner.reads - local
        for part in outer:
            walk(part, self)
        return False

    def _comprehension(self, node):
        bound, loop = _ReadsWrites(), node.for_in
        while loop is not None:
            bound._bind(loop.target)
            loop = loop.inner_for_in
        return self._own_scope(node, bound.writes, [node.for_in.iter])

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Lambda(self, node):
        params = node.params
        every = [*params.posonly_params, *params.params, *params.kwonly_params]
        stars = [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
        local = {p.name.value for p in every + stars}
        return self._own_scope(node, local, [p.default for p in every if p.default is not None])


@lru_cache(maxsize=8192)  # the rank guards and the needs analysis ask of the same statements
def reads_writes(node) -> tuple[frozenset, frozenset]:
    """The names a statement reads and those it binds (def and class bodies run later: only their names)."""
    visitor = _ReadsWrites()
    walk(node, visitor)
    return frozenset(visitor.reads), frozenset(visitor.writes)


def header_of(stmt) -> list:
    """The parts of a compound statement that run before its blocks decide anything."""
    if isinstance(stmt, (cst.If, cst.While)):
        return [stmt.test]
    if isinstance(stmt, cst.For):
        return [stmt.iter]
    if isinstance(stmt, cst.With):
        return list(stmt.items)
    return []


def at_definition(stmt) -> list:
    """The expressions a def or class computes when it is defined: its decorators, its parameters' defaults, its
    bases, and its class body's own lines (a class attribute, a field's default; of its methods, the same)."""
    found = [d.decorator for d in stmt.decorators]
    if isinstance(stmt, cst.FunctionDef):
        params = stmt.params
        return found + [p.default for p in (*params.posonly_params, *params.params, *params.kwonly_params) if p.default]
    found += [arg.value for arg in (*stmt.bases, *stmt.keywords)]
    for line in stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else ():
        found += at_definition(line) if isinstance(line, (cst.FunctionDef, cst.ClassDef)) else [line]
    return found


def _as_file(text):
    return f"file:{posixpath.normpath(text)}" if isinstance(text, str) and text else None


def file_of(call: cst.Call, meanings, names):
    """`file:<path>` of the literal path (or a name last assigned one) that a saving call writes: its first
    argument, `torch.save`'s second, or a path keyword (nbddp.vocabulary.PATH_KEYWORDS); else None."""
    if "torch.save" in meanings:
        value = arguments(call, "obj", "f")[1]
    else:
        value = next((a.value for a in call.args if a.keyword is None and not a.star), None) or next(
            (a.value for a in call.args if a.keyword is not None and a.keyword.value in PATH_KEYWORDS), None)
    return _as_file(names.literal(value)) if value is not None else None


def files_named(call: cst.Call, names) -> set:
    """`file:<path>` of every literal string (or name last assigned one) a call is given: what any call may read,
    whatever library it belongs to (`open(p)`, `np.load(p)`, `from_pretrained(p)`)."""
    found = (_as_file(names.literal(arg.value)) for arg in call.args if not arg.star)
    return {name for name in found if name}


def free_reads(node) -> set[str]:
    """The names a def or class body reads from outside it (its parameters and local names are its own), and what
    its decorators, defaults and bases read."""
    reads, local = set(), set()
    if isinstance(node, cst.FunctionDef):
        params = node.params
        every = [*params.posonly_params, *params.params, *params.kwonly_params,
                 *(p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param))]
        local = {p.name.value for p in every}
        reads = set().union(*(names_in(p.default) for p in every if p.default is not None))
    else:
        reads = set().union(*(names_in(b.value) for b in node.bases))
    reads |= set().union(*(names_in(d.decorator) for d in node.decorators))
    for stmt in node.body.body if isinstance(node.body, cst.IndentedBlock) else [node.body]:
        inner = free_reads(stmt) if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) else None
        body_reads, body_writes = reads_writes(stmt)
        reads |= body_reads | (inner or set())
        local |= body_writes
    return reads - local


def _imports(body):
    for stmt in body:
        if isinstance(stmt, cst.SimpleStatementLine):
            yield from (small for small in stmt.body if isinstance(small, (cst.Import, cst.ImportFrom)))


def imported_values(body) -> dict[str, str]:
    """What the top-level imports of `body` bind: name -> the module (`numpy.linalg` of `import numpy.linalg as la`,
    `numpy` of `import numpy.linalg`) or the module's name (`a.b.c` of `from a.b import c`); not relative imports."""
    found = {}
    for small in _imports(body):
        if isinstance(small, cst.Import):
            for alias in small.names:
                dotted = cst.Module([]).code_for_node(alias.name)
                found[alias.asname.name.value if alias.asname else dotted.split(".")[0]] = \
                    dotted if alias.asname else dotted.split(".")[0]
        elif small.module is not None and not small.relative and not isinstance(small.names, cst.ImportStar):
            module = cst.Module([]).code_for_node(small.module)
            found.update((alias.evaluated_alias or alias.evaluated_name, f"{module}.{alias.evaluated_name}")
                         for alias in small.names)
    return found


def imported_names(body) -> set[str]:
    """The names the top-level imports of `body` bind."""
    return set().union(*(reads_writes(small)[1] for small in _imports(body)))


def imported_packages(body) -> set[str]:
    """The packages the top-level imports of `body` import from (`numpy` of `import numpy as np`, `unsloth` of
    `from unsloth import …`); not relative imports."""
    found = set()
    for small in _imports(body):
        if isinstance(small, cst.Import):
            found |= {cst.Module([]).code_for_node(alias.name).split(".")[0] for alias in small.names}
        elif small.module is not None and not small.relative:
            found.add(cst.Module([]).code_for_node(small.module).split(".")[0])
    return found
