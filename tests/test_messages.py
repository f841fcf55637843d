"""What the user reads when something is off, as they read it: one line that says what to do next, in the notebook's
own cell and line numbers, no step names, no traceback of nbddp's."""
from __future__ import annotations

import subprocess
import sys

from test_cli_convert import nbddp, write_notebook


def _script(tmp_path, *cells):
    nb = write_notebook(tmp_path / "nb.ipynb", *cells)
    done = nbddp("convert", str(nb), "-o", str(tmp_path / "train_ddp.py"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return tmp_path / "train_ddp.py"


def _run(script, **env):
    import os

    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=script.parent, env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **env})


def test_a_script_on_a_machine_without_a_gpu_says_what_runs_instead(tmp_path):
    import os

    from e2e import run_at_once

    script = _script(tmp_path, "print('HELLO')\n")
    (tmp_path / "asked").mkdir()
    again = tmp_path / "asked" / script.name  # the same script, run from a folder of its own
    again.write_bytes(script.read_bytes())
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # _run's; both runs at once (neither reads time)
    done, asked = run_at_once([([sys.executable, str(script)], script.parent, env),
                               ([sys.executable, str(again)], again.parent, {**env, "NBDDP_NPROC": "1"})], 120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (
        "nbddp: no GPU visible: one process on the CPU (NBDDP_NPROC=2 runs 2 processes with gloo; on Kaggle or Colab, "
        "turn the GPU accelerator on)")
    assert "nbddp: no GPU" not in asked.stdout  # asked for


def test_a_missing_package_names_the_install_line_of_the_scripts_header(tmp_path):
    script = _script(tmp_path, "%pip install -q my-missing_pkg==1.0 other\n", "import my_missing_pkg.sub\n")
    done = _run(script, NBDDP_NPROC="1")
    assert done.returncode == 1
    assert "nbddp: the notebook imports my_missing_pkg, which is not installed here: run pip install -q " \
           "my-missing_pkg==1.0 other, then run the script again" in done.stderr, done.stderr


def test_a_cell_that_is_not_python_is_named_by_its_cell_and_line_without_nbddps_inner_names(tmp_path):
    nb = write_notebook(tmp_path / "nb.ipynb", "x = 1\n", "!ls\ndef f(:\n    pass\n")
    done = nbddp("convert", str(nb), cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == "nbddp: error: cell 2, line 2: not valid Python (invalid syntax); fix the cell in " \
                                  "the notebook"
    assert not (tmp_path / "train_ddp.py").exists()


def test_a_traceback_of_the_script_names_the_notebooks_own_line(tmp_path):
    """Guards and barriers nbddp added shift the script's lines: a frame names the line as the notebook's cell
    numbers it (the script's `# nbddp lines:` map), not the converted cell's."""
    from nbddp.executor import cell_frames

    script = _script(tmp_path, "x = 1\nprint('a')\nraise ValueError('boom')\n")
    lines = script.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, start=1) if "raise ValueError('boom')" in line)
    shown = cell_frames(f'  File "{script}", line {number}, in <module>\n    raise ValueError(\'boom\')\n', str(script))
    assert "cell 1, line 3: raise ValueError('boom')" in shown, shown


def test_the_line_map_places_statements_as_libcst_positions_do():
    """The line map counts lines in one code generation per changed cell: the same moved lines as libcst's
    PositionProvider over the whole notebook, through decorators, strings over several lines and nbddp's guards."""
    import libcst as cst
    import nbformat
    from libcst.metadata import MetadataWrapper, PositionProvider

    from conftest import make_notebook
    from nbddp.cells import CellIndex
    from nbddp.pipeline import run_tree
    from nbddp.report import Report
    from nbddp.transforms.base import Context, Options

    cells = ["import functools, os\ntext = '''a\nb\nc'''\n@functools.lru_cache\ndef f(x):\n    return x\n",
             "os.makedirs('out')\nprint(f(1))\nmodel.save_pretrained('out')\nx = 2\n",
             "from trl import SFTTrainer\ntrainer = SFTTrainer(model=model)\ntrainer.train()\nprint(text)\n"]
    tree = run_tree(nbformat.reads(nbformat.writes(make_notebook(*cells)), as_version=4),
                    Context(report=Report(source="t.ipynb"), options=Options()))
    first = MetadataWrapper(tree.first, unsafe_skip_copy=True).resolve(PositionProvider)
    final = MetadataWrapper(tree.module, unsafe_skip_copy=True).resolve(PositionProvider)
    then_cells, now_cells = CellIndex(tree.first.code.splitlines()), CellIndex(tree.module.code.splitlines())
    expected = {}
    for node, where in final.items():
        origin = tree.names.orig(node)
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) and origin in first and \
                not isinstance(node, cst.FunctionDef):  # a def starts at its decorator there, after it here
            now, then = now_cells.at(where.start.line), then_cells.at(first[origin].start.line)
            if now and then and now[0] == then[0]:
                expected[(int(now[0]), now[1])] = then[1]
    found = tree.line_map()
    assert {k: v for k, v in found.items() if k in expected} == expected
    assert any(k[1] != v for k, v in expected.items())  # some lines moved
