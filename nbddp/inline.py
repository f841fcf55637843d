"""The runtime a script carries: the source of the `nbddp/runtime/` modules a notebook needs, as one block.

The modules are read as files (never imported: the converter does not import torch). Inlining drops each module's
docstrings and its `from .x import y` lines (every module lands in the script's one namespace), hoists the other
imports into one block at the top, and puts one comment line before each module saying why it is there.
Dependencies come from the relative imports, so a module never arrives without what it uses.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import libcst as cst

from .runtime import EARLY, MODULES
from .walk import walk

RUNTIME = Path(__file__).resolve().parent / "runtime"
SKELETON = frozenset({"nbddp_start", "nbddp_teardown"})  # what nbddp/templates/ddp_script.py.j2 calls


@dataclass(frozen=True)
class Part:
    """One top-level statement of a runtime module."""
    code: str
    defines: frozenset  # names it binds (an attribute set on a function belongs to the function)
    reads: frozenset  # names it reads anywhere, function bodies included
    simple: bool  # one line of statements, no def/class/block


@dataclass(frozen=True)
class Module:
    name: str
    requires: tuple  # runtime modules it imports from
    imports: tuple  # its other top-level imports, as Parts
    parts: tuple  # its code without docstrings and imports, as Parts


def _is_docstring(stmt) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


class _DropDocstrings(cst.CSTTransformer):
    """Function and class docstrings go (a body that is only a docstring keeps it); what follows moves up. Inside a
    body, blank lines stay only before a nested def or class."""

    def on_visit(self, node):  # docstrings and blocks are statements: a simple line or an expression holds neither
        return not isinstance(node, (cst.SimpleStatementLine, cst.BaseExpression)) and super().on_visit(node)

    def leave_IndentedBlock(self, original, updated):
        blocks = (cst.FunctionDef, cst.ClassDef)
        body = [stmt if isinstance(stmt, blocks) or (i and isinstance(updated.body[i - 1], blocks)) else
                stmt.with_changes(leading_lines=[line for line in stmt.leading_lines if line.comment])
                for i, stmt in enumerate(updated.body)]
        return updated.with_changes(body=body)

    def _strip(self, updated):
        body = updated.body
        if isinstance(body, cst.IndentedBlock) and len(body.body) > 1 and _is_docstring(body.body[0]):
            rest = list(body.body[1:])
            rest[0] = rest[0].with_changes(leading_lines=[line for line in rest[0].leading_lines if line.comment])
            return updated.with_changes(body=body.with_changes(body=rest))
        return updated

    def leave_FunctionDef(self, original, updated):
        return self._strip(updated)

    def leave_ClassDef(self, original, updated):
        return self._strip(updated)


def _binds(stmt) -> set:
    """Top-level names a statement binds: def/class names, assigned names, imported names; `f.attr = …` binds f."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return {stmt.name.value}
    found = set()
    for small in getattr(stmt, "body", ()):
        if isinstance(small, cst.Assign):
            nodes = [target.target for target in small.targets]
            while nodes:
                node = nodes.pop()
                while isinstance(node, cst.Attribute):
                    node = node.value
                if isinstance(node, (cst.Tuple, cst.List)):  # `a, b = ...`
                    nodes += [element.value for element in node.elements]
                elif isinstance(node, cst.Name):
                    found.add(node.value)
        elif isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
            for alias in small.names:
                name = alias.asname.name if alias.asname else alias.name
                while isinstance(name, cst.Attribute):
                    name = name.value
                found.add(name.value)
    return found


def _part(stmt) -> Part:
    reads = set()

    class _Reads(cst.CSTVisitor):
        def visit_Name(self, node):
            reads.add(node.value)

    walk(stmt, _Reads())
    code = cst.Module([stmt.with_changes(leading_lines=[line for line in stmt.leading_lines if line.comment])]).code
    return Part(code, frozenset(_binds(stmt)), frozenset(reads), isinstance(stmt, cst.SimpleStatementLine))


@lru_cache(maxsize=None)
def _made_by() -> str:
    """What makes the parts besides a module's source: this file and libcst's version."""
    return Path(__file__).read_text(encoding="utf-8") + "\0" + metadata.version("libcst")


def _cache_file(name: str, docs: bool, source: str) -> Path:
    """Where a module's parts are kept between conversions: under the user's cache folder, named by a hash of the
    module's source and of what makes its parts (parsing every module costs about a second)."""
    key = hashlib.sha256("\0".join([source, _made_by(), str(docs)]).encode()).hexdigest()[:32]
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "nbddp" / "runtime" / f"{name}-{key}.json"


def _part_of(data) -> Part:
    return Part(data[0], frozenset(data[1]), frozenset(data[2]), data[3])


@lru_cache(maxsize=None)
def load(name: str, docs: bool = False) -> Module:
    """A runtime module as parts; with `docs`, its docstrings kept (the module's own becomes a comment block)."""
    source = (RUNTIME / f"{name}.py").read_text(encoding="utf-8")
    cache = _cache_file(name, docs, source)
    try:
        data = json.loads(cache.read_text(encoding="utf-8"))
        return Module(name, tuple(data["requires"]), tuple(map(_part_of, data["imports"])),
                      tuple(map(_part_of, data["parts"])))
    except (OSError, ValueError, KeyError, TypeError, IndexError):  # not there yet, or not whole
        module = _parse(name, source, docs)
    try:  # written whole or not at all; a folder the user cannot write to only costs the time
        cache.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"requires": module.requires, **{key: [[p.code, sorted(p.defines), sorted(p.reads), p.simple]
                                                                 for p in getattr(module, key)]
                                                           for key in ("imports", "parts")}})
        with tempfile.NamedTemporaryFile("w", dir=cache.parent, delete=False, encoding="utf-8") as fh:
            fh.write(text)
        os.replace(fh.name, cache)
    except OSError:
        pass
    return module


def _parse(name: str, source: str, docs: bool) -> Module:
    tree = cst.parse_module(source)
    tree = tree if docs else tree.visit(_DropDocstrings())
    requires, imports, parts = [], [], []
    for i, stmt in enumerate(tree.body):
        if i == 0 and _is_docstring(stmt):
            if docs:
                text = stmt.body[0].value.evaluated_value.strip()
                parts.append(Part("".join(f"# {line}".rstrip() + "\n" for line in text.splitlines()), frozenset(),
                                  frozenset(), True))
            continue
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) else None
        if isinstance(small, cst.ImportFrom) and small.relative:
            if not isinstance(small.module, cst.Name) or len(small.relative) != 1:
                raise ValueError(f"runtime/{name}.py: write `from .module import name` (inlining drops it)")
            requires.append(small.module.value)
        elif isinstance(small, (cst.Import, cst.ImportFrom)):
            imports.append(_part(stmt))
        else:
            parts.append(_part(stmt))
    return Module(name, tuple(requires), tuple(imports), tuple(parts))


def closure(names) -> list[str]:
    """The modules `names` need, with all they import from, in inlining order (what a module uses comes first)."""
    order: list[str] = []

    def add(name):
        if name not in order:
            for dep in load(name).requires:
                add(dep)
            order.append(name)

    for name in sorted(names, key=MODULES.index):
        add(name)
    return order


def _import_key(part: Part):
    words = part.code.split()
    return (words[1].split(".")[0] == "torch", words[0] == "from", words[1])


def _needed(parts, roots) -> list:
    """The parts that run something at import (no binding), and those that define what is read, transitively."""
    wanted, keep = set(roots), set()
    changed = True
    while changed:
        changed = False
        for part in parts:
            if part not in keep and (not part.defines or part.defines & wanted):
                keep.add(part)
                wanted |= part.reads
                changed = True
    return [part for part in parts if part in keep]


def _join(parts) -> str:
    """One blank line around each def or class; simple statements stay together."""
    out = parts[0].code
    for before, part in zip(parts, parts[1:]):
        out += ("" if before.simple and part.simple else "\n") + part.code
    return out


@dataclass(frozen=True)
class Choice:
    """What a notebook needs of the runtime: module -> why, and the names its code reads (None: keep every part)."""
    reasons: dict
    uses: frozenset | None = frozenset()
    models: tuple = ()  # (model id, weight bits) of the notebook's model loads, for runtime/fit.py
    scale_batch: bool = False  # converted with --scale-batch: N times the samples a step unless NBDDP_BATCH=keep

    @property
    def sizes_models(self) -> bool:
        return bool(self.models) and "fit" in self.reasons

    def start(self) -> str:
        """The script's start call: the job's mode from the notebook's models where the script can size them; the
        process group now, or after the notebook's `import unsloth`."""
        args = [f"nbddp_fit({list(self.models)!r})"] if self.sizes_models else []
        args += ["group=False"] if "unsloth_group" in self.reasons else []
        args += ['batch="scale"'] if self.scale_batch and "global_batch" in self.reasons else []
        return f"nbddp_start({', '.join(args)})"


def everything() -> Choice:
    """The whole runtime, every part kept (what the tests load to exercise all of it)."""
    return Choice({name: "all of the runtime" for name in MODULES}, None)


def render(choice: Choice, docs: bool = False, skeleton: bool = True) -> str:
    """The runtime block: the chosen modules and what they import from, each cut to what runs at import and what
    the script reads, transitively; with `docs`, their documentation kept (a runtime file beside the script);
    without `skeleton`, only what the script's cells read (no start and teardown of a DDP job)."""
    reasons, uses = choice.reasons, choice.uses
    names = closure(reasons)
    every = [part for name in names for part in load(name, docs).parts]
    roots = set(uses or ()) | (SKELETON if skeleton else set()) | ({"nbddp_fit"} if choice.sizes_models else set())
    kept = set(every if uses is None else _needed(every, roots))
    parts = {name: [part for part in load(name, docs).parts if part in kept] for name in names}
    reads = set().union(*(part.reads for part in kept))
    imports = sorted({part for name in names for part in load(name, docs).imports if part.defines & reads},
                     key=_import_key)
    def block(name):
        if not any(part.reads or part.defines for part in parts[name]):  # nothing but its documentation
            return ""
        used_by = [n for n in names if name in load(n, docs).requires and parts[n]]
        return f"# -- {name}: {reasons.get(name) or 'needed by ' + ', '.join(used_by)}\n" + _join(parts[name])

    blocks = ["".join(part.code for part in imports if not _import_key(part)[0]),
              *(block(name) for name in names if name in EARLY),  # before torch's import
              "".join(part.code for part in imports if _import_key(part)[0]),
              *(block(name) for name in names if name not in EARLY)]
    return "\n\n".join(block.rstrip("\n") for block in blocks if block)
