"""Golden scripts: whole-notebook conversions compared line by line with tests/golden/<notebook>.py.

Regenerate after an intended change (then READ the diff before committing it):
    NBDDP_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py

The runtime helpers every script carries (templates/setup.py.j2 and the templates it includes: everything from
the "# ---- nbddp: one process per GPU" line to the `try:` that opens the notebook's cells) are the same for every
notebook: a notebook's golden file holds one line in their place, so it shows what the conversion did to that
notebook, and the section itself has one golden file of its own (golden/_setup_section.py).
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from conftest import CORPUS

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("NBDDP_UPDATE_GOLDEN") == "1"
SETUP_START = "# ---- nbddp: one process per GPU"
SETUP_HIDDEN = "# ---- nbddp setup: templates/setup.py.j2 and its includes (not stored in golden files) ----\n"


def without_setup(script: str) -> str:
    """The script with its setup section (the same for every notebook) replaced by one line."""
    lines = script.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(SETUP_START)]
    assert len(starts) == 1, "the setup's first line is missing or repeated"
    body = next(i for i in range(starts[0], len(lines)) if lines[i] == "try:\n")
    return "".join(lines[:starts[0]] + [SETUP_HIDDEN, "\n"] + lines[body:])


# Each one covers a shape of notebook the converter must get right.
NOTEBOOKS = [
    "Kaggle-Llama3.1_(8B)-Alpaca",                        # the plain SFT notebook
    "Llama3.2_(1B_and_3B)-Conversational",                # `!pip` indented under if/else -> `pass` marker
    "AMD-Qwen3_(4B)-Instruct",                            # %%bash install cell with shell variables
    "Kaggle-Gemma3_(1B)-GRPO",                            # %%capture that sets os.environ (kept)
    "Llama3.1_(8B)-GRPO",                                 # GRPO with vLLM fast_generate
    "Kaggle-Llama3.2_(11B)-Vision",                       # vision: for_inference / for_training
    "Kaggle-Magistral_(24B)-Reasoning-Conversational",    # device_map="balanced" -> own device, warned
    "Gemma3_(270M)_Phone_Deployment",                     # %%file cells, `!python script.py`
    "Kaggle-bert_classification",                         # %env mid-cell, unseeded train_test_split
]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_golden(name, converted):
    notebook = CORPUS / f"{name}.ipynb"
    assert notebook.exists(), f"{notebook} is not in the corpus"
    script = without_setup(converted(notebook).script)  # converted(): nbddp.convert(notebook, script_name=…)
    golden = GOLDEN / f"{name}.py"
    if UPDATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(script, encoding="utf-8")
    assert golden.exists(), f"no golden file {golden}; create it with NBDDP_UPDATE_GOLDEN=1"
    expected = golden.read_text(encoding="utf-8")
    if script != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), script.splitlines(True),
                                            fromfile=f"golden/{name}.py", tofile="converted", n=2))
        pytest.fail(f"{name}: the conversion differs from its golden file "
                    f"(NBDDP_UPDATE_GOLDEN=1 regenerates it):\n{diff}", pytrace=False)


def setup_section(script: str) -> str:
    """What without_setup() hides: the helpers and runtime layer every script carries."""
    lines = script.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(SETUP_START))
    end = next(i for i in range(start, len(lines)) if lines[i] == "try:\n")
    return "".join(lines[start:end])


def test_golden_setup_section(converted):
    """The setup section, the same in every script, has one golden file of its own."""
    scripts = [converted(CORPUS / f"{name}.ipynb").script for name in NOTEBOOKS[:2]]
    section = setup_section(scripts[0])
    assert section == setup_section(scripts[1]), "the setup section differs between notebooks"
    golden = GOLDEN / "_setup_section.py"
    if UPDATE:
        golden.write_text(section, encoding="utf-8")
    expected = golden.read_text(encoding="utf-8")
    if section != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), section.splitlines(True),
                                            fromfile="golden/_setup_section.py", tofile="converted", n=2))
        pytest.fail(f"the setup section differs from its golden file (NBDDP_UPDATE_GOLDEN=1 regenerates it):\n{diff}",
                    pytrace=False)


def test_golden_is_the_public_api():
    """The cached conversion the goldens use is exactly what `nbddp.convert` returns."""
    import nbddp

    notebook = CORPUS / f"{NOTEBOOKS[-1]}.ipynb"
    assert notebook.exists(), f"{notebook} is not in the corpus"
    script = nbddp.convert(notebook, script_name="train_ddp.py")
    assert without_setup(script) == (GOLDEN / f"{NOTEBOOKS[-1]}.py").read_text(encoding="utf-8")


@pytest.mark.parametrize("name, kind, words", [
    ("Kaggle-Magistral_(24B)-Reasoning-Conversational", "warnings", 'device_map="balanced"'),
    ("AMD-Qwen3_(4B)-Instruct", "warnings", "install cell also runs"),
    ("Kaggle-bert_classification", "changes", "train_test_split() had no seed"),
    ("Kaggle-bert_classification", "changes", "`%env UNSLOTH_DISABLE_FAST_GENERATION = 1` → os.environ"),
    ("Gemma3_(270M)_Phone_Deployment", "changes", "`%%file export_gemma_model.py` → file written once per node"),
    ("Llama3.2_(1B_and_3B)-Conversational", "installs", 'pip install --no-deps unsloth_zoo bitsandbytes'),
])
def test_reports_say_what_changed_and_what_to_check(name, kind, words, converted):
    notebook = CORPUS / f"{name}.ipynb"
    assert notebook.exists(), f"{notebook} is not in the corpus"
    report = converted(notebook).report
    entries = report.installs if kind == "installs" else [n.text for n in getattr(report, kind)]
    assert any(words in entry for entry in entries), f"{kind} of {name}: {entries}"
    assert words in report.format()
