"""nbddp.walk: the analyses' read-only walk visits what libcst's own visit visits, in its order, and the fast scope
resolution gives libcst's ScopeProvider answers."""
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ScopeProvider

from nbddp.walk import _TRIVIA, scopes, walk

SHARED = Path(__file__).resolve().parents[2] / "shared" / "notebooks" / "unsloth"

CODE = '''
first = f"{sys.argv}"  # the first f-string part met has no format spec, a later one has
import os as o, sys
from functools import partial as p
@p(print, sep="")
@staticmethod
def f(a: "Model", /, b=1, *args, c: int = 2, **kw) -> "Model":
    global G
    x = lambda q, r=o.sep: q + r
    y = [i * j for i in range(3) if i for j in range(i)]
    z = {k: v for k, v in kw.items()}
    s = f"{a!r:>{b}} {c=} {x(1)!s:{'<'}10}"
    if (n := len(args)) > 1:
        return a if n else b
    with open(o.devnull) as fh, open(o.devnull):
        pass
    try:
        del z[1]
    except (KeyError, ValueError) as e:
        raise RuntimeError() from e
    finally:
        yield from y
    return x(a)[1:2, ::3]

class K(dict, metaclass=type):
    "doc"
    attr: "K" = None
    def m(self, *, k=lambda: G):
        nonlocal_ = [*self, *[1]]
        for i, (j, k2) in enumerate(self.items()):
            while i:
                break
            else:
                continue
        match nonlocal_:
            case [1, *rest] if rest:
                pass
            case {"a": b, **more}:
                pass
            case K(attr=3) | None:
                pass
        return {**self}, (1,), {1, 2}, not i, -i, i @ j, i if j else k2

async def g():
    async with a as b:
        async for c in b:
            await c
    assert g, "no"
'''


class Order(cst.CSTVisitor):
    def __init__(self):
        self.seen = []

    def on_visit(self, node):
        if isinstance(node, _TRIVIA):
            return False
        self.seen.append(("visit", node))
        return True

    def on_leave(self, node):
        if not isinstance(node, _TRIVIA):
            self.seen.append(("leave", node))


def _modules():
    yield cst.parse_module(CODE)
    if SHARED.is_dir():
        from nbddp.notebook import as_notebook
        from nbddp.pipeline import _text_steps
        from nbddp.transforms.base import Context

        for path in sorted(SHARED.glob("*.ipynb"))[:12]:
            cells = _text_steps(as_notebook(str(path)), Context()).cells
            yield cst.parse_module("\n".join(cell.source for cell in cells))


def test_the_walk_visits_and_leaves_what_libcsts_visit_does_in_its_order():
    for module in _modules():
        theirs, ours = Order(), Order()
        module.visit(theirs)
        walk(module, ours)
        assert len(ours.seen) > 100
        assert [(what, id(node)) for what, node in ours.seen] == [(what, id(node)) for what, node in theirs.seen]


def test_a_visitor_that_declines_a_node_skips_its_children_in_the_walk():
    class NoLambdas(cst.CSTVisitor):
        def __init__(self):
            self.names = []

        def visit_Lambda(self, node):
            return False

        def visit_Name(self, node):
            self.names.append(node.value)

    module = cst.parse_module("y = (lambda q: q + inner)(outer)\n")
    ours = NoLambdas()
    walk(module, ours)
    assert ours.names == ["y", "outer"]


def _described(mapping, module):
    """Each node of the module's own tree (not trivia) -> its scope's kind and name, and each access -> what it
    refers to."""
    nodes = [node for what, node in _order(module) if what == "visit"]
    kinds = [(type(mapping[node]).__name__, getattr(mapping[node], "name", None)) if node in mapping else None
             for node in nodes]
    accesses = sorted((id(access.node), tuple(sorted(str(getattr(r, "node", None) and id(r.node)) + r.name
                                                      for r in access.referents)))
                      for scope in {s for s in mapping.values() if s is not None} for access in scope.accesses)
    return kinds, accesses


def _order(module):
    order = Order()
    module.visit(order)
    return order.seen


def test_the_scopes_are_libcsts_scope_provider_answers():
    for module in _modules():
        theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)
        assert _described(scopes(module), module) == _described(theirs, module)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/notebooks/unsloth is not beside this clone")
def test_the_corpus_is_read():
    assert sum(1 for _ in _modules()) == 13


def test_statements_in_finds_the_statements_of_every_kind_of_block():
    from nbddp.cst_helpers import statements_in

    module = cst.parse_module("match x:\n    case 1:\n        a = 1\ntry:\n    pass\nexcept* E:\n    b = 2\n"
                              "for i in r:\n    if i:\n        c = 3\n    elif j:\n        d = 4\nelse:\n    e = 5\n")
    found = [cst.Module([]).code_for_node(s).split("\n")[0].strip() for s in statements_in(module)]
    assert [line for line in found if "=" in line] == ["a = 1", "b = 2", "c = 3", "d = 4", "e = 5"]
