"""Golden scripts: whole-notebook conversions compared line by line with tests/golden/<notebook>.py.

Regenerate after an intended change (then READ the diff before committing it):
    NBDDP_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py

The goldens are of the single-file script. The runtime it carries (nbddp/runtime/ modules, inlined between the
"# ---- nbddp runtime" and "# ---- end of nbddp runtime" lines) is kept in a golden file as its one-line comments,
one per module: which modules the notebook got and why. Their code is the modules' own, tested in test_runtime_modules.py and test_runtime_needs.py.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from conftest import need_corpus
from nbddp.writer import STAMP

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("NBDDP_UPDATE_GOLDEN") == "1"
RUNTIME_START, RUNTIME_END = "# ---- nbddp runtime:", "# ---- end of nbddp runtime"


def without_setup(script: str) -> str:
    """The script with the runtime's code left out: its first and last lines and each module's comment stay."""
    lines = script.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(RUNTIME_START)]
    assert len(starts) == 1, "the runtime's first line is missing or repeated"
    end = next(i for i in range(starts[0], len(lines)) if lines[i].startswith(RUNTIME_END))
    kept = [line for line in lines[starts[0]:end] if line.startswith(("# ---- ", "# -- "))]
    # the line numbers and the hash depend on the runtime's code too: not the golden's business
    moving = ("One file: nbddp's runtime comes first", STAMP)
    return "".join(line for line in lines[:starts[0]] + kept + lines[end:] if not line.startswith(moving))


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
    notebook = need_corpus(name)
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


def test_golden_is_the_public_api():
    """The cached conversion the goldens use is exactly what `nbddp.convert` returns."""
    import nbddp

    notebook = need_corpus(NOTEBOOKS[-1])
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
    notebook = need_corpus(name)
    assert notebook.exists(), f"{notebook} is not in the corpus"
    report = converted(notebook).report
    entries = report.installs if kind == "installs" else [n.text for n in getattr(report, kind)]
    assert any(words in entry for entry in entries), f"{kind} of {name}: {entries}"
    assert words in report.format()
