"""Prompts ask once, end to end on CPU: a notebook that asks with getpass in several spellings (an alias of the
module, an alias of the function, inside a function called in a loop, over split cells), through a library nbddp
never names (fakehub.py beside the script: `from getpass import getpass` at its import, and input()), and through
huggingface_hub's login() without a token; converted, and run as one 2-process torchrun job (gloo).

Each rank writes answers-<rank>.json: what each prompt gave it, or the EOFError it raised (the notebook catches all
but huggingface_hub's). Three jobs: the answers piped on stdin (a pipe that stays open), with HF_TOKEN set; stdin an
open pipe nobody writes; stdin closed. The oracle is those files, the job's exit status and time, and rank 0's lines.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import make_notebook
from e2e import SCRIPT, child_env, run_jobs
from nbddp.pipeline import convert_notebook

pytestmark = pytest.mark.ddp

FAKEHUB = '''import os
import sys
from getpass import getpass


def login():
    return input("Fakehub user: ") + ":" + getpass("Fakehub key: ")


def read_code():
    return sys.stdin.readline().strip()  # a library that reads stdin itself


def raw_key():
    return os.read(0, 64).decode()  # below Python's stdin, as a prompt toolkit reads
'''

CELLS = [
    "import json, os\nimport getpass as gp\nfrom getpass import getpass as secret\nimport fakehub\n",
    "got = []\n",
    "try:\n    got.append(gp.getpass('Alias: '))\nexcept EOFError as exc:\n    got.append(f'EOFError: {exc}')\n",
    "def in_a_function(i):\n    return secret(f'Loop {i}: ')\n",
    "for i in range(2):\n    try:\n        got.append(in_a_function(i))\n    except EOFError as exc:\n"
    "        got.append(f'EOFError: {exc}')\n",
    "try:\n    got.append(fakehub.login())\nexcept EOFError as exc:\n    got.append(f'EOFError: {exc}')\n",
    "got.append(fakehub.read_code() or 'end of input')\ngot.append(fakehub.raw_key() or 'raw end')\n",
    "with open(f\"answers-{os.environ['RANK']}.json\", 'w') as fh:\n    json.dump(got, fh)\n",
    "from huggingface_hub import login\nlogin()\n",
]
ANSWERS = ["alias answer", "loop 0", "loop 1", "fake user", "fake key", "stdin code", "raw key"]
HUB_LINE = ("nbddp: huggingface_hub's login() in a 2-process job has no one to answer it ({why}): every rank gets "
            "EOFError at the prompt 'Enter your token (input will not be visible):'; set HF_TOKEN instead (in the "
            "environment, or a Kaggle/Colab secret of that name) (NBDDP_INPUT=0: every rank reads its stdin)")


@pytest.fixture(scope="module")
def conversion():
    return convert_notebook(make_notebook(*CELLS))


CASES = {  # name: (stdin, what is written to it, environment)
    "answers": ("pipe", "\n".join(ANSWERS).encode() + b"\n", {"HF_TOKEN": "hf_given"}),  # login() then asks nothing
    "pipe": ("pipe", b"", {"NBDDP_STDIN_QUIET": "1"}),  # nothing ever comes: a shorter quiet ends it the same way
    "closed": ("closed", b"", None),
}


@pytest.fixture(scope="module")
def jobs(conversion, tmp_path_factory):
    """Each case's job, its stdin an open pipe (with what the case writes in it) or DEVNULL, each in its own folder,
    all at once (e2e.run_jobs: each job's seconds are its own): {case: (exit status, output, seconds, answers)}."""
    started, stdins, pipes = [], [], []
    try:
        for name, (stdin, written, env) in CASES.items():
            cwd = tmp_path_factory.mktemp(name)
            (cwd / SCRIPT).write_text(conversion.script, encoding="utf-8")
            (cwd / "fakehub.py").write_text(FAKEHUB, encoding="utf-8")
            environment = {key: value for key, value in child_env(cwd).items() if not key.startswith("HF_TOKEN")}
            read, write = os.pipe()  # its writing end stays open until the job ends
            pipes += [read, write]
            os.write(write, written)
            stdins.append(read if stdin == "pipe" else subprocess.DEVNULL)
            started.append(([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             SCRIPT], cwd, {**environment, **(env or {})}))
        done = run_jobs(started, timeout=120, stdins=stdins)
    finally:
        for fd in pipes:
            os.close(fd)
    return {name: (job.returncode, job.stdout + job.stderr, job.seconds,
                   [json.loads((job.cwd / f"answers-{rank}.json").read_text()) for rank in range(2)
                    if (job.cwd / f"answers-{rank}.json").exists()])
            for name, job in zip(CASES, done)}


def test_the_converter_reports_each_prompt_and_the_script_carries_the_ask_module(conversion):
    lines = [f"{n.where()}: {n.text.split(':')[0]}" for n in conversion.report.changes if "rank 0 asks" in n.text]
    assert lines == ["cell 3: getpass()", "cell 4: getpass()", "cell 6: fakehub.login() without a key",
                     "cell 9: huggingface_hub.login() without a token"], lines
    assert "def nbddp_getpass" in conversion.script


def test_answers_piped_in_reach_every_rank_once(jobs):
    status, output, seconds, answers = jobs["answers"]
    assert status == 0, output[-4000:]
    assert answers == [["alias answer", "loop 0", "loop 1", "fake user:fake key", "stdin code", "raw key\n"]] * 2, \
        output[-4000:]
    assert "has no one to answer it" not in output


@pytest.mark.parametrize("stdin, why", [("pipe", "stdin is not a terminal and has nothing to read"),
                                        ("closed", "stdin is closed")])
def test_with_no_one_to_answer_every_rank_gets_eoferror_and_the_job_stops(jobs, stdin, why):
    status, output, seconds, answers = jobs[stdin]
    assert status != 0 and seconds < 60, output[-4000:]
    line = "{what} in a 2-process job has no one to answer it ({why}): every rank gets EOFError at the prompt {shown}"
    expected = [line.format(what="getpass()", why=why, shown=repr(shown)) for shown in ("Alias:", "Loop 0:", "Loop 1:")]
    expected.append(line.format(what="input() called by fakehub", why=why, shown="'Fakehub user:'"))
    assert len(answers) == 2, output[-4000:]
    for seen in answers:
        assert [text.split(";")[0] for text in seen[:-2]] == [f"EOFError: nbddp: {text}" for text in expected], seen
        assert seen[-2:] == ["end of input", "raw end"]  # a library's own reads of stdin: the end of its input
    assert ("nbddp: sys.stdin.readline() called by fakehub in a 2-process job has no one to answer it "
            f"({why}): every rank reads the end of its input;") in output, output[-4000:]
    said = [line.split(";")[0] for line in output.splitlines() if line.startswith("nbddp: ")]
    for text in expected:
        assert said.count(f"nbddp: {text}") == 1, output[-4000:]  # said once, by rank 0
    assert output.splitlines().count(HUB_LINE.format(why=why)) == 1, output[-4000:]
    assert output.count(f"EOFError: {HUB_LINE.format(why=why)}\n") == 2  # what ended the job, on each rank
