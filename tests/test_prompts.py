"""Prompts in a multi-process job, one process: what the converter finds and reports (input(), getpass(), a
library's login without a key), and the ask module's paths that need no process group (nbddp/runtime/ask.py). The
2-rank runs of converted notebooks are in test_prompts_ddp.py."""
import builtins
import getpass
import os
import subprocess
import sys
import types

import pytest

from conftest import make_notebook
from nbddp import inline
from nbddp.pipeline import convert_notebook
from nbddp.runtime import ask, hooks

SPELLINGS = (
    "import getpass as gp\nfrom getpass import getpass as secret\nfrom huggingface_hub import login, notebook_login\n"
    "import huggingface_hub as hub\nimport kagglehub\n",
    "key = gp.getpass('Key: ')\n",
    "def ask_in_a_function():\n    return secret()\nfor _ in range(2):\n    ask_in_a_function()\n",
    "login()\nhub.interpreter_login()\nnotebook_login()\nkagglehub.login()\n",
    "print(input('Go on? '))\n",  # a print runs on rank 0 only, and so does its input()
)
# given a key, nothing asks; a login of a value or of a name never imported is not a library's; nor a name `input`
GIVEN = ("login(token = 'hf_x')\nlogin(os.environ['HF_TOKEN'])\nkagglehub.login(api_key = k)\nftp.login()\n"
         "ftplib.FTP('host').login()\nfor input, output in rows:\n    text = input\n")


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    """No NBDDP_* switch from outside, one process on rank 0, every message said anew."""
    for name in list(os.environ):
        if name.startswith("NBDDP_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(hooks, "NBDDP_IS_MAIN", True)
    monkeypatch.setattr(ask, "NBDDP_IS_MAIN", True)
    monkeypatch.setattr(ask, "_NBDDP_ASKED", {})
    hooks._NBDDP_SAID.clear()


# ---- the converter ----
def test_every_prompt_the_notebook_makes_is_found_reported_and_asked_once():
    done = convert_notebook(make_notebook(*SPELLINGS))
    lines = sorted(f"{n.where()}: {n.text}" for n in done.report.changes if "asks" in n.text)
    once = "rank 0 asks, every rank gets the answer; with no answer the job stops: "
    value = "set the value in the notebook instead (from an environment variable or a Kaggle/Colab secret)"
    token = "set HF_TOKEN (in the environment, or a Kaggle/Colab secret of that name)"
    assert lines == [
        f"cell 2: getpass(): {once}{value}",
        f"cell 3: getpass(): {once}{value}",
        f"cell 4: huggingface_hub.interpreter_login() without a token: {once}{token}",
        f"cell 4: huggingface_hub.login() without a token: {once}{token}",
        f"cell 4: huggingface_hub.notebook_login() (a notebook widget; the script asks in the terminal): {once}{token}",
        f"cell 4: kagglehub.login() without a key: {once}pass the key in the notebook instead (from an environment "
        "variable or a Kaggle/Colab secret)",
        "cell 5: input(): in a rank-0-only block: only rank 0 asks and gets the answer; with no answer the job "
        f"stops: {value}",
    ], lines
    assert set(inline.closure(done.runtime.reasons)) >= {"ask", "hooks", "wait", "group"}
    assert done.runtime.reasons["ask"] == (
        "the notebook asks for values (getpass(), huggingface_hub.login(), huggingface_hub.interpreter_login(), "
        "huggingface_hub.notebook_login(), kagglehub.login(), input()): rank 0 asks, every rank gets the answer, or "
        "EOFError and a line saying what to set")
    assert "\ngetpass.getpass = nbddp_getpass\n" in done.script.replace("    ", "")
    assert 'NBDDP_IMPORTS.watch("huggingface_hub._login", _nbddp_patch_hub_login)' in done.script


def test_a_login_given_its_key_asks_nothing_and_the_script_carries_no_prompts():
    done = convert_notebook(make_notebook(SPELLINGS[0], GIVEN))
    assert not [n for n in done.report.changes if "asks" in n.text]
    assert "ask" not in done.runtime.reasons and "nbddp_getpass" not in done.script


# ---- the runtime, without a process group ----
class _Store:
    """The group's store, as rank 0 fills it and the other ranks read it."""

    def __init__(self):
        self.values = {}

    def set(self, key, value):
        self.values[key] = value.encode()

    def check(self, keys):
        return all(key in self.values for key in keys)

    def get(self, key):
        return self.values[key]


def test_a_pipe_answers_each_prompt_with_its_own_line_and_getpass_asks_without_echo(monkeypatch):
    monkeypatch.setattr(ask, "NBDDP_INPUT_GRACE", 0.05)
    read, write = os.pipe()
    with os.fdopen(read) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        os.write(write, b"first\nsecond\n")  # both lines at once, and the pipe stays open
        assert ask._nbddp_answer("?", hidden=True) == "+first"
        assert ask._nbddp_answer("?") == "+second"  # left in the pipe for the next prompt, not in a buffer
        assert ask._nbddp_answer("?", hidden=True) == "-stdin is not a terminal and has nothing to read"
        os.close(write)
        assert ask._nbddp_answer("?", hidden=True) == "-stdin is closed"
    terminal = types.SimpleNamespace(isatty=lambda: True)
    monkeypatch.setattr(sys, "stdin", terminal)
    monkeypatch.setitem(ask._NBDDP_INPUT, "getpass", lambda prompt: f"hidden {prompt}")
    monkeypatch.setitem(ask._NBDDP_INPUT, "input", lambda prompt: f"echoed {prompt}")
    assert ask._nbddp_answer("Key: ", hidden=True) == "+hidden Key: "  # a terminal: getpass's own prompt
    assert ask._nbddp_answer("Name: ") == "+echoed Name: "


def test_with_no_one_to_answer_the_line_names_the_prompt_its_caller_and_what_to_do(monkeypatch, capsys):
    monkeypatch.setattr(ask, "NBDDP_WORLD_SIZE", 2)
    monkeypatch.setattr(ask, "nbddp_store", lambda: _Store())
    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(EOFError) as raised:
        ask.nbddp_getpass("API key: ")
    line = ("getpass() called by test_prompts in a 2-process job has no one to answer it (the process has no stdin): "
            "every rank gets EOFError at the prompt 'API key:'; set the value in the notebook instead (from an "
            "environment variable or a Kaggle/Colab secret) (NBDDP_INPUT=0: every rank reads its stdin)")
    assert str(raised.value) == f"nbddp: {line}"
    assert capsys.readouterr().out == f"nbddp: {line}\n"  # one line, on rank 0


def test_each_rank_takes_the_answer_of_the_same_prompt_even_where_rank_0_asked_more(monkeypatch):
    store = _Store()
    monkeypatch.setattr(ask, "nbddp_store", lambda: store)
    monkeypatch.setattr(ask, "_nbddp_answer", lambda prompt, hidden=False: f"+{prompt} {len(store.values)}")

    def only_on_rank_0():
        return ask.nbddp_input("guarded")

    def everywhere():
        return ask.nbddp_getpass("shared")

    answers = {}
    for main in (True, False):
        monkeypatch.setattr(ask, "NBDDP_IS_MAIN", main)
        monkeypatch.setattr(ask, "_NBDDP_ASKED", {})
        if main:
            assert only_on_rank_0() == "guarded 0"  # a rank-0-only block: the other ranks never ask it
        answers[main] = [everywhere() for _ in range(2)]
    assert answers[True] == answers[False] == ["shared 1", "shared 2"]


def test_the_patches_come_before_the_notebook_and_a_library_imports_rank_0s_getpass(monkeypatch, tmp_path):
    watched = []
    monkeypatch.setattr(ask, "NBDDP_IMPORTS", types.SimpleNamespace(watch=lambda *how: watched.append(how)))
    monkeypatch.setattr(builtins, "input", builtins.input)  # put back after the test
    monkeypatch.setattr(getpass, "getpass", getpass.getpass)
    ask._nbddp_patch_prompts()  # one process: input and getpass as they are
    assert builtins.input is ask._NBDDP_INPUT["input"] and getpass.getpass is ask._NBDDP_INPUT["getpass"]
    monkeypatch.setattr(ask, "NBDDP_WORLD_SIZE", 2)
    ask._nbddp_patch_prompts()
    assert builtins.input is ask.nbddp_input and getpass.getpass is ask.nbddp_getpass
    assert watched == [("huggingface_hub._login", ask._nbddp_patch_hub_login)] * 2
    (tmp_path / "prompting_library.py").write_text("from getpass import getpass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import prompting_library

    assert prompting_library.getpass is ask.nbddp_getpass
    monkeypatch.setattr(builtins, "input", ask._NBDDP_INPUT["input"])
    monkeypatch.setattr(getpass, "getpass", ask._NBDDP_INPUT["getpass"])
    monkeypatch.setenv("NBDDP_INPUT", "0")  # every rank reads its stdin
    ask._nbddp_patch_prompts()
    assert builtins.input is ask._NBDDP_INPUT["input"] and len(watched) == 2


def test_the_installed_huggingface_hub_login_takes_the_patches_when_imported_after_the_runtime(tmp_path):
    """huggingface_hub imports getpass by name at its import; login() looks interpreter_login and notebook_login up
    in its module, where the runtime puts its own; EOFError leaves login() as it is."""
    code = ("import nbddp.runtime.ask as ask\nfrom huggingface_hub import login, notebook_login\n"
            "import huggingface_hub._login as hub\n"
            "print(hub.getpass is ask.nbddp_getpass, hub.interpreter_login.__name__, notebook_login.__name__)\n"
            "try:\n    login()\nexcept EOFError as exc:\n    print(exc)\n")
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("NBDDP_", "HF_", "HUGGING_FACE_")) and key not in ("RANK", "WORLD_SIZE")}
    env.update(WORLD_SIZE="2", RANK="1", HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1")  # no token anywhere, no group
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "True nbddp_hub_login nbddp_hub_login",
        "nbddp: huggingface_hub's login() in a 2-process job has no one to answer it (the process group is not up "
        "yet): every rank gets EOFError at the prompt 'Enter your token (input will not be visible):'; set HF_TOKEN "
        "instead (in the environment, or a Kaggle/Colab secret of that name) (NBDDP_INPUT=0: every rank reads its "
        "stdin)"], done.stdout


def _hub(calls):
    return types.SimpleNamespace(interpreter_login=lambda **kw: calls.append(("terminal", kw)),
                                 notebook_login=lambda **kw: calls.append(("widget", kw)),
                                 login=lambda token: calls.append(("login", token)))


def test_hub_login_without_a_token_in_a_script(monkeypatch):
    import huggingface_hub

    calls, asked = [], []
    one = _hub(calls)
    ask._nbddp_patch_hub_login(one)  # one process: a script has no widget, so the terminal's flow
    one.notebook_login(skip_if_logged_in=False)
    assert calls == [("terminal", {"skip_if_logged_in": False})]
    monkeypatch.setattr(ask, "NBDDP_WORLD_SIZE", 2)
    monkeypatch.setattr(ask, "nbddp_ask", lambda *how: asked.append(how) or "hf_answer")
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_saved")
    job = _hub(calls)
    ask._nbddp_patch_hub_login(job)
    assert job.interpreter_login is job.notebook_login
    job.notebook_login()  # a token already there: nothing asked, as the library's default
    assert asked == [] and len(calls) == 1
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    job.interpreter_login()
    assert calls[-1] == ("login", "hf_answer")  # rank 0 logs in with its answer
    assert asked == [("huggingface_hub's login()", ask.NBDDP_HF_TOKEN_PROMPT, True, ask.NBDDP_HF_TOKEN_INSTEAD)]
    monkeypatch.setenv("HF_TOKEN", "before")
    monkeypatch.delenv("HF_TOKEN")  # put back as it was after the test
    monkeypatch.setattr(ask, "NBDDP_IS_MAIN", False)
    job.interpreter_login()
    assert os.environ["HF_TOKEN"] == "hf_answer" and len(calls) == 2  # another rank: the answer as HF_TOKEN
