"""`nbddp convert` as a user runs it: a real subprocess, its exit code, its stderr, and the files it leaves."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import make_notebook

SMALL = (  # a small notebook with each kind of rewrite, quick to convert
    "%%capture\n!pip install unsloth\n",
    ("markdown", "## Load"),
    "from unsloth import FastLanguageModel\nmodel, tok = FastLanguageModel.from_pretrained('m')\n",
    "from datasets import load_dataset\nds = load_dataset('x')\n",
    "model.save_pretrained('lora')\n",
)


def nbddp(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "nbddp", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def write_notebook(path, *cells):
    path.write_text(json.dumps(make_notebook(*cells)), encoding="utf-8")
    return path


@pytest.fixture
def small(tmp_path):
    return write_notebook(tmp_path / "nb.ipynb", *SMALL)


def _bad_inputs(tmp):
    """name -> (input path, what the one error line must mention)."""
    (tmp / "plain.ipynb").write_text("this is not json\n")
    (tmp / "list.ipynb").write_text("[1, 2, 3]\n")
    (tmp / "nocells.ipynb").write_text('{"metadata": {}}\n')
    text = json.dumps(make_notebook("x = 1\n"))
    (tmp / "truncated.ipynb").write_text(text[: len(text) // 2])
    (tmp / "binary.ipynb").write_bytes(bytes(range(256)) * 4)
    (tmp / "folder.ipynb").mkdir()
    write_notebook(tmp / "empty.ipynb", ("markdown", "# only text"), "   \n")
    write_notebook(tmp / "syntax.ipynb", "x = 1\n", ("markdown", "m"), "a = 1\nb = (\n")
    return {
        "not JSON": (tmp / "plain.ipynb", "not valid JSON"),
        "JSON not a notebook": (tmp / "list.ipynb", "not a Jupyter notebook"),
        "JSON without cells": (tmp / "nocells.ipynb", "not a Jupyter notebook"),
        "truncated": (tmp / "truncated.ipynb", "truncated"),
        "binary": (tmp / "binary.ipynb", "not a text file"),
        "directory": (tmp / "folder.ipynb", "is a directory"),
        "missing": (tmp / "missing.ipynb", "no such file"),
        "no code cells": (tmp / "empty.ipynb", "no code cells"),
        "cell does not parse": (tmp / "syntax.ipynb", "cell 3"),
    }


def test_bad_input_gives_one_error_line_and_no_output(tmp_path):
    inputs = _bad_inputs(tmp_path)
    out = tmp_path / "out" / "train_ddp.py"
    out.parent.mkdir()
    failures = []
    running = {name: subprocess.Popen([sys.executable, "-m", "nbddp", "convert", str(path), "-o", str(out)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, (path, _) in inputs.items()}  # all at once: each is mostly interpreter start-up
    for name, (path, mention) in inputs.items():
        stdout, stderr = running[name].communicate(timeout=120)
        done = subprocess.CompletedProcess(running[name].args, running[name].returncode, stdout, stderr)
        lines = done.stderr.splitlines()
        if not (done.returncode == 1 and len(lines) == 1 and lines[0].startswith("nbddp: error:")
                and mention in lines[0] and "Traceback" not in done.stderr):
            failures.append(f"{name}: exit {done.returncode}, stderr {done.stderr!r}")
        if os.listdir(out.parent):
            failures.append(f"{name}: left {os.listdir(out.parent)}")
    assert not failures, "\n".join(failures)


def test_unparsable_cell_error_names_cell_and_line(tmp_path):
    path = write_notebook(tmp_path / "syntax.ipynb", "x = 1\n", ("markdown", "m"), "a = 1\nb = (\n")
    done = nbddp("convert", path, "-o", "-")
    assert done.returncode == 1 and done.stdout == ""
    assert "cell 3" in done.stderr and "line" in done.stderr


@pytest.mark.parametrize("cell, words", [
    ("import asyncio\nawait asyncio.sleep(0)\n", "cell 3, line 2: Python cannot compile this cell in a script"),
    ("async with lock():\n    pass\n", "cell 3, line 1: Python cannot compile this cell"),
    ("x = 1\ny = '\x00'\n", "cell 3, line 2: the cell holds a NUL character"),
])
def test_a_cell_a_script_cannot_hold_is_one_error_line_and_nothing_written(tmp_path, cell, words):
    path = write_notebook(tmp_path / "nb.ipynb", "x = 1\n", ("markdown", "m"), cell)
    done = nbddp("convert", path, "-o", str(tmp_path / "out.py"))
    assert done.returncode == 1 and not (tmp_path / "out.py").exists()
    assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr


def test_future_imports_move_to_the_top_once(tmp_path):
    path = write_notebook(tmp_path / "nb.ipynb", "from __future__ import annotations\nx: int = 1\n",
                          "from __future__ import annotations\ny = 2\n")
    done = nbddp("convert", path, "-o", str(tmp_path / "out.py"))
    assert done.returncode == 0, done.stderr
    script = (tmp_path / "out.py").read_text()
    compile(script, "out.py", "exec")
    assert script.count("from __future__ import annotations") == 1


def test_output_folder_missing(tmp_path, small):
    done = nbddp("convert", small, "-o", tmp_path / "no" / "such" / "train.py")
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("nbddp: error: cannot write") and "does not exist" in done.stderr


@pytest.mark.parametrize("argv", [[], ["convert"], ["convert", "a.ipynb", "--nproc", "two"], ["frobnicate"]])
def test_usage_errors_exit_2(argv):
    done = nbddp(*argv)
    assert done.returncode == 2, done
    assert "usage:" in done.stderr and "Traceback" not in done.stderr


def test_output_overwrite_rules(tmp_path, small):
    nb = small
    out = tmp_path / "train.py"
    out.write_text("my own work\n")

    refused = nbddp("convert", nb, "-o", out)
    assert refused.returncode == 1 and refused.stderr.startswith("nbddp: error:") and "--force" in refused.stderr
    assert out.read_text() == "my own work\n"

    forced = nbddp("convert", nb, "-o", out, "--force")
    assert forced.returncode == 0, forced.stderr
    first = out.read_text()
    assert "Generated by nbddp" in first and "Wrote" in forced.stdout

    again = nbddp("convert", nb, "-o", out)  # nbddp's own earlier output: replaced without --force
    assert again.returncode == 0, again.stderr
    assert out.read_text() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nb.ipynb", "train.py", "train_runtime.py"]  # no temporary files


def test_output_to_stdout_and_report_to_stderr(tmp_path, small):
    run_in = tmp_path / "cwd"
    run_in.mkdir()
    done = nbddp("convert", small, "-o", "-", cwd=run_in)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#!/usr/bin/env python3") and "nbddp_teardown()" in done.stdout
    compile(done.stdout, "train_ddp.py", "exec")
    assert "code cells converted" in done.stderr and "Launch:" in done.stderr
    assert "code cells converted" not in done.stdout
    assert list(run_in.iterdir()) == []


def test_help_starts_quickly():
    best = min(_timed([sys.executable, "-m", "nbddp", "--help"]) for _ in range(3))
    assert best < 0.5, f"`nbddp --help` took {best:.2f} s"


def _timed(argv):
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - start
    assert done.returncode == 0 and "convert" in done.stdout
    return elapsed


def test_converting_imports_no_torch_or_transformers(small, tmp_path):
    code = (
        "import sys, nbddp.cli, nbddp.pipeline\n"
        f"nbddp.pipeline.convert({str(small)!r})\n"
        f"assert nbddp.cli.main(['convert', {str(small)!r}, '-o', {str(tmp_path / 'out.py')!r}]) == 0\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'trl', 'peft', 'datasets', 'unsloth') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_jupyter_nbconvert_to_ddp(tmp_path):
    jupyter = shutil.which("jupyter")
    assert jupyter is not None, "jupyter is not installed (it comes with the test extras: nbconvert)"
    nb = write_notebook(tmp_path / "my notebook.ipynb", *SMALL)
    done = subprocess.run([jupyter, "nbconvert", "--to", "ddp", "--stdout", str(nb)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    import nbddp

    assert done.stdout.rstrip("\n") == nbddp.convert(nb, script_name="my notebook.py").rstrip("\n")


def test_the_script_reads_as_the_notebook_and_imports_its_runtime_from_beside_it(tmp_path, small):
    done = nbddp("convert", small, "-o", tmp_path / "train.py")
    assert done.returncode == 0, done.stderr
    assert "Wrote" in done.stdout and "train_runtime.py" in done.stdout
    script = (tmp_path / "train.py").read_text().splitlines()
    first = next(n for n, line in enumerate(script, start=1) if line.startswith("    # %% cell"))
    assert first <= 40, "\n".join(script[:first])
    assert any(line.startswith("from train_runtime import *") for line in script)
    assert any(line.startswith("nbddp_runtime_check(") for line in script)
    runtime = (tmp_path / "train_runtime.py").read_text()
    assert runtime.startswith('"""nbddp runtime for train.py, converted from nb.ipynb')
    assert "def nbddp_barrier(what=None):\n    \"\"\"Wait until every rank gets here" in runtime  # documented
    compile(runtime, "train_runtime.py", "exec")


def test_single_file_says_where_the_notebook_starts(tmp_path, small):
    done = nbddp("convert", small, "-o", tmp_path / "kaggle.py", "--single-file")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kaggle.py", "nb.ipynb"]
    lines = (tmp_path / "kaggle.py").read_text().splitlines()
    said = next(line for line in lines[:6] if "the notebook starts at line" in line)
    start = int(said.split("line ")[1].split()[0])
    assert lines[start - 1].startswith("    # %% cell"), lines[start - 1]


def test_a_script_with_another_runtime_stops_with_one_line(tmp_path, small):
    assert nbddp("convert", small, "-o", tmp_path / "train.py").returncode == 0
    other = write_notebook(tmp_path / "other.ipynb", "import os\nprint(os.getcwd())\n")
    assert nbddp("convert", other, "-o", tmp_path / "other.py").returncode == 0
    shutil.copy(tmp_path / "other_runtime.py", tmp_path / "train_runtime.py")  # the wrong file beside the script
    done = subprocess.run([sys.executable, "-c", "import train"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().startswith("nbddp: ") and "is not the runtime this script was written for" in done.stderr


def test_nothing_of_the_users_is_lost_without_force(tmp_path, small):
    out = tmp_path / "train.py"
    assert nbddp("convert", small, "-o", out).returncode == 0
    edited = out.read_text().replace("try:\n", "try:\n    print('my line')\n", 1)
    out.write_text(edited)
    refused = nbddp("convert", small, "-o", out)
    assert refused.returncode == 1 and "was edited since nbddp wrote it" in refused.stderr, refused.stderr
    assert out.read_text() == edited
    other = write_notebook(tmp_path / "other.ipynb", "x = 1\n")
    assert nbddp("convert", small, "-o", out, "--force").returncode == 0
    refused = nbddp("convert", other, "-o", out)  # another notebook's script at the same name
    assert refused.returncode == 1 and "DDP training script for nb.ipynb" in refused.stderr, refused.stderr
    assert nbddp("convert", other, "-o", out, "--force").returncode == 0
