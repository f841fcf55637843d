"""The notebook's own modules: those it writes itself (`%%writefile utils.py`, then `import utils`) and those in its
folder (utils.py or utils/__init__.py beside the notebook, which Python imports before any installed library): what
their code calls into.

    OwnModules(body, names, folder).packages("utils") -> the packages utils' code imports ({"utils"}: not the
    notebook's own); .packages("utils", "ping"): those its def ping's body reads (and the defs it reads)
    .code("utils") -> its code, parsed; .names("utils"): its nbddp.meanings.Names; .definition("utils.run"): (those
    Names, its def run), which nbddp.effects and nbddp.rank_conditions follow as they follow the notebook's own defs

nbddp.needs reads a call into such a module as a call of the libraries the module's own code imports, not as a
library of its own: `utils.set_seed(42)` where utils.py imports torch sets up training (every rank), `utils.ping()`
where it imports only requests is an effect (once). A written module's text is the literal the notebook wrote (the
magics step made `%%writefile` a `nbddp_write_file(path, text)` line) and comes before a file of that name in the
folder (the notebook overwrites it); one written from a computed text, or one that does not parse, stays a library of
its own. The files are read, never run.
"""
from __future__ import annotations

import os
import shlex

import libcst as cst

from .bindings import Bindings
from .reads_writes import free_reads, imported_values
from .walk import walk

WRITE = "nbddp_write_file"


def _written(stmt, names):
    """(path, text) of a top-level `nbddp_write_file("x.py", "...")` line with literal arguments, else None."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    call = small.value if isinstance(small, cst.Expr) else None
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == WRITE and
            len(call.args) >= 2):
        return None
    path, text = (names.literal(arg.value) for arg in call.args[:2])
    return (path, text) if isinstance(path, str) and path.endswith(".py") and isinstance(text, str) else None


def _imports(text) -> tuple[set[str], dict] | None:
    """The packages a module's code imports, anywhere in it, and what each of its top-level defs calls into: the
    packages of the module's imports its body reads, through the module's other defs it reads; None where the module
    does not parse."""
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError:
        return None
    seen = Bindings(set(module.body))
    walk(module, seen)
    roots = {name: what.split(".")[0] for name, what in imported_values(module.body).items()}  # -> its package
    defs = {stmt.name.value: free_reads(stmt) for stmt in module.body if isinstance(stmt, cst.FunctionDef)}
    functions = {}
    for name in defs:
        reached, todo = {name}, [name]
        while todo:
            new = defs[todo.pop()] & defs.keys() - reached
            reached |= new
            todo += new
        functions[name] = {roots[n] for d in reached for n in defs[d] if n in roots}
    return set(seen.packages), functions


def _beside(folder, name) -> list[str] | None:
    """The code of module `name` in `folder`: name.py, or every .py file of a package name/ (its __init__ and the
    modules it imports relatively); None where there is none."""
    package = os.path.join(folder, name)
    if os.path.isfile(os.path.join(package, "__init__.py")):
        paths = sorted(os.path.join(root, file) for root, _, files in os.walk(package) for file in files
                       if file.endswith(".py"))[:200]
    else:
        paths = [package + ".py"]
    texts = []
    for path in paths:
        try:
            if os.path.getsize(path) <= 2 ** 20:
                with open(path, encoding="utf-8") as fh:
                    texts.append(fh.read())
        except (OSError, UnicodeDecodeError, ValueError):
            continue
    return texts or None


class OwnModules:
    def __init__(self, body, names, folder=None):
        self.folder, self.found = folder, {}  # module name -> the packages its code imports (None: not its own)
        self.functions: dict = {}  # module name -> its top-level def -> the packages that def calls into
        self.texts: dict = {}  # path of a .py file the notebook writes with a literal text -> that text
        self.parsed: dict = {}  # module name -> its code, parsed (None: not the notebook's own, or no parse)
        self.analysed: dict = {}  # module name -> the nbddp.meanings.Names of its code
        for stmt in body:
            written = _written(stmt, names)
            if written:
                self.texts[os.path.normpath(written[0])] = written[1]
            read = written and _imports(written[1])
            if read:
                name = os.path.basename(written[0])[:-3]
                self.found[name], self.functions[name] = read[0], read[1]

    def _direct(self, name) -> set[str] | None:
        if name not in self.found:
            texts = _beside(self.folder, name) if self.folder and name.isidentifier() else None
            read = [found for found in map(_imports, texts or ()) if found is not None]
            self.found[name] = set().union(*(r[0] for r in read)) - {name} if read else None
            self.functions[name] = {k: v for r in read for k, v in r[1].items()}
        return self.found[name]

    def code(self, name) -> cst.Module | None:
        """Module `name`'s code: the text the notebook writes it with, else its one file beside the notebook."""
        if name not in self.parsed:
            text = next((t for path, t in self.texts.items() if os.path.basename(path) == f"{name}.py"), None)
            if text is None and self.folder and name.isidentifier():
                found = _beside(self.folder, name)
                text = found[0] if found and len(found) == 1 else None
            try:
                self.parsed[name] = cst.parse_module(text) if text is not None else None
            except cst.ParserSyntaxError:
                self.parsed[name] = None
        return self.parsed[name]

    def names(self, name):
        """nbddp.meanings.Names of module `name`'s code (once), or None where it is not the notebook's own."""
        if name not in self.analysed:
            from .meanings import Names  # (the notebook's Names holds these modules: nbddp.tree)

            code = self.code(name)
            self.analysed[name] = Names(code) if code is not None else None
            if code is not None:
                self.analysed[name].own = self
        return self.analysed[name]

    def definition(self, meaning: str):
        """(the module's Names, its top-level def) that a meaning (`utils.run` of `utils.run(...)`) calls, or None."""
        module, _, name = meaning.partition(".")
        names = self.names(module) if name.isidentifier() else None
        found = [stmt for stmt in names.module.body if isinstance(stmt, cst.FunctionDef) and
                 stmt.name.value == name] if names is not None else ()
        return (names, found[-1]) if found else None

    def packages(self, name, attr=None) -> set[str]:
        """The packages module `name`'s code imports (only its def `attr` calls into, where `attr` is one), through
        the notebook's other own modules it imports; {name} where it is not the notebook's own."""
        if self._direct(name) is None:
            return {name}
        start = self.functions[name].get(attr)
        if start is not None:
            return set().union(*(self.packages(p) if p != name else set() for p in start))
        seen, todo, found = {name}, [name], set()
        while todo:
            for package in self._direct(todo.pop()):
                if package in seen:
                    continue
                seen.add(package)
                if self._direct(package) is None:
                    found.add(package)
                else:
                    todo.append(package)
        return found

    def ran(self, line: str) -> tuple[cst.Module, str] | None:
        """The code `%run line` runs and its flags: the file the notebook wrote with a literal text, else the file in
        its folder (`%run prep` reads prep.py, `-m name` name.py); None where the converter cannot read it."""
        try:
            words = shlex.split(line)
        except ValueError:
            return None
        flags = ""
        while words and words[0].startswith("-") and words[0] != "-m":
            flags += words.pop(0)[1:]
        module = words[1] if words[:1] == ["-m"] and len(words) > 1 else None
        path = module.replace(".", os.sep) + ".py" if module else words[0] if words else None
        candidates = [path, path + ".py"] if path and not module and not path.endswith(".py") else [path]
        for candidate in filter(None, candidates):
            text = self.texts.get(os.path.normpath(candidate))
            if text is None and self.folder and not os.path.isabs(candidate):
                found = _beside(self.folder, candidate[:-3]) if candidate.endswith(".py") else None
                text = found[0] if found and len(found) == 1 else None
            if text is not None:
                try:
                    return cst.parse_module(text), flags
                except cst.ParserSyntaxError:
                    return None
        return None
