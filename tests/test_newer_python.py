"""Notebooks written for a newer Python than the one converting: converted, with a report line naming the Python
the script needs; what no Python accepts in a script (top-level await) is still an error."""
from __future__ import annotations

import sys
import textwrap

import pytest

from conftest import make_notebook
from nbddp.cst_helpers import parse
from nbddp.errors import ConversionError
from nbddp.pipeline import convert_notebook
from nbddp.syntax import newer_syntax


@pytest.mark.parametrize("code, needs", [
    ('f"{"a" + "b"}"\n', True),            # the f-string's own quote inside {...}
    ("f'{x['k']}'\n", True),
    ('f"{f"{x}"}"\n', True),               # a nested f-string in the same quotes
    ('f"{\'\\n\'.join(xs)}"\n', True),     # a backslash inside {...}
    ('type Point = tuple[float, float]\n', True),
    ('def first[T](xs: list[T]) -> T:\n    return xs[0]\n', True),
    ('class Box[T]:\n    pass\n', True),
    # what Python 3.8 already takes: other quotes inside, triple-quoted outside, a backslash outside {...}
    ('f"{x[\'k\']}"\n', False),
    ('f"""{x["k"]}"""\n', False),
    ('f"a\\n{x}"\n', False),
    ('"{}".format(x)\n', False),
])
def test_newer_syntax_is_found_on_the_tree(code, needs):
    found = newer_syntax(parse(code))
    assert bool(found) is needs, found
    assert all(version == (3, 12) and 1 in lines for lines, version, _ in found)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="this Python compiles 3.12 syntax itself")
def test_a_colab_notebook_converts_on_an_older_python_with_a_report_line():
    cell = textwrap.dedent('''\
        name = "world"
        greeting = f"{"hello" + " " + name}"
    ''')
    conversion = convert_notebook(make_notebook("import os\n", cell))
    assert 'greeting = f"{"hello" + " " + name}"' in conversion.script
    (note,) = [n for n in conversion.report.warnings if "Python 3.12" in n.text]
    assert (note.cell, note.line) == (2, 2)
    assert "run the script with Python 3.12 or newer" in note.text


def test_what_no_python_compiles_is_still_an_error():
    with pytest.raises(ConversionError, match=r"cell 2.*'await' outside function"):
        convert_notebook(make_notebook('x = f"{1}"\n', "await something()\n"))
