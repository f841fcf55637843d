"""The runtime's IPython forms in one process (nbddp/runtime/ipython_forms.py), and the converter's expansion of shell
and magic lines (nbddp/transforms/expansion.py): IPython's own expansion is the oracle."""
from __future__ import annotations

import os
import sys

import libcst as cst
import pytest

from nbddp.runtime import files, ipython_forms
from nbddp.transforms.expansion import line_expression

LINES = [
    "ls $folder", "ls {folder}/x", "echo $HOME", "cost $$5 and $$name", "{n * 2} items", "$obj.name",
    "awk '{print $1}'", "grep '$name' file", "echo {{literal}} $n", "a {d['k']} b", "{missing} $n", "ls {a[1:2]}",
    "echo $n$n", "no expansion at all", "unbalanced {", "{n!r} {folder!s}", "",
]


class _Obj:
    name = "attr"


@pytest.fixture
def names():
    return {"folder": "my dir", "n": 3, "d": {"k": "v"}, "a": [0, 1, 2], "obj": _Obj()}


@pytest.mark.parametrize("line", LINES)
def test_expansion_is_ipythons(line, names, ip, monkeypatch):
    monkeypatch.setattr(ip, "user_ns", dict(names))  # the one test shell (conftest), its names for this line
    wanted = ip.var_expand(line, depth=0)
    assert eval(compile("nbddp_expand(line)", "<cell>", "eval"), {"nbddp_expand": ipython_forms.nbddp_expand,
                                                                  "line": line, **names}) == wanted
    # the converter: a plain string where nothing can expand, with IPython's escapes resolved
    expression = line_expression(line)
    if isinstance(expression, cst.SimpleString):
        assert expression.evaluated_value == wanted


def test_expansion_reads_the_callers_local_names():
    def inner(sub):
        return ipython_forms.nbddp_expand("ls {sub} $sub")

    assert inner("x y") == "ls x y x y"


def test_time_runs_the_block_and_says_how_long_on_rank_0(capsys):
    with ipython_forms.nbddp_time():
        value = sum(range(10))
    assert value == 45 and "Wall time: " in capsys.readouterr().out


def test_capture_keeps_prints_and_displays_and_shows_them_later(capsys):
    with ipython_forms.nbddp_capture() as captured:
        print("out")
        ipython_forms.nbddp_display({"a": 1})
    assert capsys.readouterr().out == ""
    assert captured.stdout == "out\n" and captured.outputs == [{"a": 1}]
    captured.show()
    assert capsys.readouterr().out == "out\n{'a': 1}\n"
    with ipython_forms.nbddp_capture(stdout=False) as kept:
        print("shown")
    assert kept.stdout == "" and capsys.readouterr().out == "shown\n"


def test_show_prints_a_value_as_jupyter_shows_it(capsys):
    from IPython.display import Markdown

    for value in (None, [1, 2], "text", Markdown("# title")):
        ipython_forms.nbddp_show(value)
    assert capsys.readouterr().out == "[1, 2]\n'text'\n# title\n"


def test_shell_output_lines_read_as_ipythons():
    lines = files.nbddp_getoutput("printf 'a\\nb\\n'")
    assert lines == ["a", "b"] and lines.s == "a b" and lines.n == "a\nb" and lines.l == ["a", "b"]


@pytest.mark.parametrize("cell, shown", [
    ("a, b\n", "nbddp_show((a, b))\n"), ("*x, 3\n", "nbddp_show((*x, 3))\n"), ("a[0] > 1\n", "nbddp_show(a[0] > 1)\n"),
    ("f'{a}!'\n", "nbddp_show(f'{a}!')\n"), ("a if b else c\n", "nbddp_show(a if b else c)\n"),
])
def test_a_shown_value_of_any_shape_is_one_value(cell, shown):
    from test_transforms import convert_cells

    out, _ = convert_cells("a, b, x, c = 1, 2, [3], 4\n", cell)
    assert out[1] == shown
    compile(out[1], "cell", "exec")


def test_a_notebook_that_reads_ipythons_history_gets_it_and_one_that_does_not_gets_nothing():
    from test_transforms import convert_cells

    out, _ = convert_cells("x = 1\n", "x + 1\n", "y = _ * 2\n")
    assert out[0].startswith("nbddp_history([('x = 1', 'x = 1'), ('x + 1', 'x + 1'), ('y = _ * 2', 'y = _ * 2')])\n"
                             "nbddp_cell_input(1)\n")
    assert out[1] == "nbddp_cell_input(2)\nnbddp_show(x + 1, 2)\n"
    again, _ = convert_cells(*out)
    assert again == out  # converting converted code changes nothing more
    plain, _ = convert_cells("x = 1\n", "for _ in range(2):\n    x += _\n", "x\n")  # `_` bound by the notebook
    assert "nbddp_history" not in "".join(plain) and plain[2] == "nbddp_show(x)\n"


@pytest.mark.parametrize("line", ["NBDDP_T_A=1", "NBDDP_T_B two words", " NBDDP_T_C = spaced ", "NBDDP_T_A", ""])
def test_env_of_a_computed_line_is_ipythons(line, ip, monkeypatch, capsys):
    def fresh():
        monkeypatch.setenv("NBDDP_T_A", "before")
        for name in ("NBDDP_T_B", "NBDDP_T_C"):
            monkeypatch.delenv(name, raising=False)

    fresh()
    wanted = ip.run_line_magic("env", line)
    shown, after = capsys.readouterr().out, dict(os.environ)
    fresh()
    assert ipython_forms.nbddp_env(line) == wanted
    assert dict(os.environ) == after and capsys.readouterr().out == shown


def test_run_file_keeps_what_the_file_bound_before_its_exit_as_ipython_does(tmp_path, monkeypatch, capsys):
    """`%run`: a `sys.exit` ends the file, not the notebook, and the names it bound are the notebook's; a code other
    than 0 is said unless `-e`; a file that takes its own folder off sys.path does not break the line; `-i` reads the
    notebook's names."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "limits.py").write_text("import sys\nSTEPS = 2\nsys.path.remove(sys.path[0])\nsys.exit(3)\n")
    (tmp_path / "twice.py").write_text("DOUBLE = BASE * 2\n")
    path, main = list(sys.path), sys.modules["__main__"]
    namespace = {"BASE": 21}
    ipython_forms.nbddp_run_file("limits.py", namespace)
    assert namespace["STEPS"] == 2 and "%run limits.py: SystemExit: 3" in capsys.readouterr().err
    ipython_forms.nbddp_run_file("-e limits", namespace)
    assert capsys.readouterr().err == ""
    ipython_forms.nbddp_run_file("-i twice.py", namespace)
    assert namespace["DOUBLE"] == 42 and sys.modules["__main__"] is main  # the script's own again
    sys.path[:] = path
