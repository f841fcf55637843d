"""End to end on CPU: a notebook of IPython's own forms (issue 40), converted and run as one 2-process torchrun job
(gloo, every rank's output on the console), and what the script does with each form.

The notebook uses each form in several ways: at the top level, inside its own functions, in a loop, split over
cells. Every rank records what it bound in rank<R>.json (a path made from the rank: each rank's own file); the
console shows what the notebook showed, and the tests count it there: once for the whole job.
"""
from __future__ import annotations

import pytest

import nbddp
from e2e import assert_clean_exit, rank_records, run_notebook

pytestmark = pytest.mark.ddp

CELLS = [
    "import json, os\nfolder = 'out dir'\nn = 3\nrecord = {}\n",
    # shell lines expand $name and {expr} from the notebook's names; $HOME is no Python name: the shell's
    "!mkdir -p \"$folder\" && echo made-{n * 2} > \"$folder/made.txt\"\n",
    "for i in range(2):\n    !echo loop-$i >> \"$folder/loop.txt\"\n",
    "home = !echo $HOME\nrecord['home'] = home.s\nrecord['made'] = open(os.path.join(folder, 'made.txt')).read()\n",
    # x = !cmd inside the notebook's own function: its local names expand
    "def listing(sub):\n    found = !ls \"{sub}\"\n    return found\n",
    "record['listing'] = listing(folder).l\n",
    # magics used as values, and magic lines that expand
    "%env GREETING=hello-$n\nrecord['greeting'] = os.environ['GREETING']\n",
    "total = %time sum(range(10))\nrecord['total'] = total\nwhere = %pwd\nrecord['pwd'] = os.path.basename(where)\n",
    "%cd $folder\n",
    "record['cd'] = os.path.basename(os.getcwd())\n%cd ..\n",
    # %%capture keeps the cell's output in a name (not on the console)
    "%%capture captured\nprint('captured-line')\n",
    "record['captured'] = captured.stdout\n",
    # IPython's builtins, without an import
    "display('displayed-once')\nrecord['colab'] = 'google.colab' in str(get_ipython())\n",
    # what a cell shows: its last value, unless `;`
    "{'shown': 'value-once'}\n",
    "hidden = ['not-shown']\nhidden;\n",
    # %run: the file runs in this process, as __main__, its words its sys.argv; then its names are the notebook's
    "%%writefile prep.py\nimport sys\nROWS = int(sys.argv[sys.argv.index('--rows') + 1])\n"
    "AS_MAIN = __name__ == '__main__'\ndef twice(x):\n    return 2 * x\n",
    "%run prep.py --rows $n\nrecord['run'] = [ROWS, AS_MAIN, twice(ROWS)]\n",
    "def rerun(rows):\n    %run -n prep --rows 1\n    first = AS_MAIN\n    %run -i prep --rows {rows}\n    return first\n"
    "record['rerun'] = [rerun(5), ROWS, AS_MAIN]\n",
    "with open(f\"rank{os.environ.get('RANK', '0')}.json\", 'w') as fh:\n    json.dump(record, fh)\n",
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("forms")
    done, conversion = run_notebook(CELLS, cwd, env={"HOME": str(cwd / "home")})
    return done, rank_records(cwd), conversion


def test_the_job_exits_cleanly_and_the_ranks_bound_the_same(job):
    done, ranks, _ = job
    assert_clean_exit(done)
    assert ranks[0] is not None and ranks[0] == ranks[1], done.explain()


def test_shell_lines_expand_as_ipython_expands_them(job):
    done, (record, _), _ = job
    assert record["made"] == "made-6\n"  # {n * 2} and $folder (a folder name with a space)
    assert (done.cwd / "out dir" / "loop.txt").read_text() == "loop-0\nloop-1\n"  # once per node, $i of the loop
    assert record["home"] == str(done.cwd / "home")  # $HOME left to the shell
    assert record["listing"] == ["loop.txt", "made.txt"]  # {sub}: the function's own parameter


def test_magics_bind_their_values_and_expand(job):
    done, (record, _), _ = job
    assert record["greeting"] == "hello-3"
    assert record["total"] == 45 and done.count("Wall time: ") == 1  # run, bound, timed on rank 0
    assert record["pwd"] == done.cwd.name
    assert record["cd"] == "out dir"


def test_run_runs_the_file_here_and_gives_the_notebook_its_names(job):
    _, (record, _), conversion = job
    assert record["run"] == [3, True, 6]  # its argv from the line ($n expanded), as __main__, its function
    assert record["rerun"] == [False, 5, True]  # -n: not as __main__ (`prep` is prep.py); -i: among its names
    assert "nbddp_run_file(" in conversion.script and "unknown magic" not in conversion.report.format()


def test_capture_binds_the_output_instead_of_showing_it(job):
    done, (record, _), _ = job
    assert record["captured"] == "captured-line\n"
    assert done.count("captured-line") == 0, done.explain()


def test_what_the_notebook_showed_is_shown_once(job):
    done, (record, _), conversion = job
    assert record["colab"] is False  # get_ipython() is None in a script
    assert done.count("'displayed-once'") == 1, done.explain()
    assert done.count("{'shown': 'value-once'}") == 1, done.explain()
    assert done.count("not-shown") == 0
    shown = {note.cell for note in conversion.report.changes if "last value is shown" in note.text}
    assert 14 in shown and 15 not in shown  # the report says so (`hidden;` shows nothing)


@pytest.mark.parametrize("cell, says, line", [
    ("x = %timeit -o sum(range(3))\n", "cannot give this magic's value", 1),
    ("def f():\n    names = %who_ls\n    return names\n", "cannot give this magic's value", 2),
    ("y = %time z = 1\n", "IPython gives None for a statement", 1),
    ("%%capture out\nprint(1)\nprint(get_ipython().run_line_magic('pwd', ''))\n",
     "inside an expression has no script equivalent", 3),
])
def test_a_form_the_script_cannot_honour_stops_the_conversion_at_its_line(cell, says, line):
    import nbformat

    from conftest import make_notebook
    from nbddp.errors import ConversionError

    with pytest.raises(ConversionError) as caught:
        nbddp.convert(nbformat.writes(make_notebook("a = 1\n", cell)))
    assert says in str(caught.value)
    assert f"cell 2, line {line}:" in str(caught.value)
