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
    done = _run(_script(tmp_path, "print('HELLO')\n"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (
        "nbddp: no GPU visible: one process on the CPU (NBDDP_NPROC=2 runs 2 processes with gloo; on Kaggle or Colab, "
        "turn the GPU accelerator on)")
    assert "nbddp: no GPU" not in _run(_script(tmp_path, "print('HELLO')\n"), NBDDP_NPROC="1").stdout  # asked for


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
