"""Prompts in a multi-process job: input(), getpass.getpass(), so every library prompt that goes through them, a
library's own reads of sys.stdin (`sys.stdin.readline()`, iterating it), and huggingface_hub's login without a
token. Rank 0 asks, where a terminal or a line on its stdin can answer, and every rank gets the same answer through
the store; where no one can answer (stdin closed, a pipe that nobody writes, a Kaggle Script), every rank gets
EOFError, and rank 0 says in one line which prompt it was and how to give the value instead. Never a hang, never two
ranks reading one stdin: readers below Python's stdin (`os.read(0, ...)`, a prompt toolkit) read rank 0's stdin
through stdin_fd.py on every rank, and each answer given here is taken out of every rank's copy alike. The patches
are in place before the notebook's first line, so a library's own `from getpass import getpass`, run when the
notebook imports it, takes rank 0's prompt too."""
import builtins
import getpass
import hashlib
import os
import select
import sys

from .group import NBDDP_IS_MAIN, NBDDP_WORLD_SIZE
from .hooks import NBDDP_IMPORTS, _nbddp_choice, nbddp_say
from .stdin_fd import NBDDP_STDIN, nbddp_fd_line
from .wait import nbddp_store, nbddp_wait_until

NBDDP_INPUT_GRACE = 1.0  # seconds rank 0 waits for a line on a stdin that is not a terminal (a pipe, a file)
NBDDP_ASK_INSTEAD = "set the value in the notebook instead (from an environment variable or a Kaggle/Colab secret)"
NBDDP_HF_TOKEN_INSTEAD = "set HF_TOKEN instead (in the environment, or a Kaggle/Colab secret of that name)"
NBDDP_HF_TOKEN_PROMPT = "Enter your token (input will not be visible): "
_NBDDP_INPUT = {"input": builtins.input, "getpass": getpass.getpass}  # the prompts of a terminal
_NBDDP_ASKED = {}  # where a prompt was asked from -> how many times


def _nbddp_stdin_line(stdin, prompt, stream):
    """A line of a stdin that is not a terminal (nbddp_fd_line: what the next prompt waits for stays in the pipe)."""
    stream.write(prompt)
    stream.flush()
    line = nbddp_fd_line(stdin.fileno())
    print(file=stream, flush=True)  # after the prompt
    if not line:
        raise EOFError
    return line.decode(getattr(stdin, "encoding", None) or "utf-8", "replace").removesuffix("\n")


def _nbddp_answer(prompt, hidden=False):
    """Rank 0's answer as "+text", or "-why" where no one can answer; `hidden`: getpass's (no echo on a terminal)."""
    stdin, tty = getattr(sys.stdin, "_real", sys.stdin), False  # the process's own stdin, under NbddpStdin
    if stdin is None:
        return "-the process has no stdin"
    try:
        tty = stdin.isatty()
        ready = tty or select.select([stdin], [], [], NBDDP_INPUT_GRACE)[0]
    except (OSError, ValueError):
        ready = False
    if not ready:
        return "-stdin is not a terminal and has nothing to read"
    proxy, sys.stdin = sys.stdin, stdin  # the terminal's prompt reads the real stdin (input() reads sys.stdin)
    try:
        if tty:
            return "+" + _NBDDP_INPUT["getpass" if hidden else "input"](prompt)
        return "+" + _nbddp_stdin_line(stdin, prompt, sys.stderr if hidden else sys.stdout)
    except EOFError:
        if tty:
            print(flush=True)  # after the prompt
        return "-stdin is not a terminal and has nothing to read" if NBDDP_STDIN["quiet"] else "-stdin is closed"
    finally:
        sys.stdin = proxy


def _nbddp_site():
    """Where a prompt is asked from, the same on every rank: the module, function and line of each call that led to
    it. A prompt that one rank skips (a rank-0-only block) or asks more often never takes another prompt's answer."""
    frame, calls = sys._getframe(1), []
    while frame is not None:
        calls.append(f"{frame.f_globals.get('__name__')}:{frame.f_code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return hashlib.sha1("|".join(calls).encode()).hexdigest()[:16]


def _nbddp_caller(call):
    """`call` and, for a library's prompt, the module that asks it."""
    module = sys._getframe(2).f_globals.get("__name__")
    return call if module in (None, "__main__") else f"{call} called by {module}"


def nbddp_ask(what, prompt, hidden=False, instead=NBDDP_ASK_INSTEAD, ending="gets EOFError"):
    """The answer to a prompt of a multi-process job: rank 0 asks, every rank gets the answer; with no one to answer,
    every rank raises EOFError, and rank 0 says which prompt it was and what to do instead."""
    store, site = nbddp_store(), _nbddp_site()
    _NBDDP_ASKED[site] = _NBDDP_ASKED.get(site, 0) + 1
    key = f"nbddp/ask/{site}/{_NBDDP_ASKED[site]}"
    if store is None:
        answer = "-the process group is not up yet"
    elif NBDDP_IS_MAIN:
        answer = _nbddp_answer(prompt, hidden)
        store.set(key, answer)
    else:
        nbddp_wait_until(lambda: store.check([key]), lambda: f"rank 0: {what}")
        answer = store.get(key).decode()
        if answer.startswith("+") and NBDDP_STDIN["shared"]:
            nbddp_fd_line(0)  # the line rank 0 read, out of this rank's copy of its stdin too
    if answer.startswith("-"):
        shown = str(prompt).strip()
        text = (f"{what} in a {NBDDP_WORLD_SIZE}-process job has no one to answer it ({answer[1:]}): every rank "
                f"{ending}{f' at the prompt {shown!r}' if shown else ''}; {instead} "
                "(NBDDP_INPUT=0: every rank reads its stdin)")
        nbddp_say(key, text)
        raise EOFError(f"nbddp: {text}")
    return answer[1:]


def nbddp_input(prompt=""):
    """builtins.input of a multi-process job."""
    return nbddp_ask(_nbddp_caller("input()"), str(prompt))


def nbddp_getpass(prompt="Password: ", stream=None):
    """getpass.getpass of a multi-process job."""
    return nbddp_ask(_nbddp_caller("getpass()"), str(prompt), hidden=True)


class NbddpStdin:
    """sys.stdin of a multi-process job, for a library that reads it itself: each line is read on rank 0 and every
    rank gets it (as input() does); with no one to answer, every rank reads the end of its input ("") and rank 0 says
    so once. The rest (fileno, isatty, encoding) is the real stdin's."""

    def __init__(self, real):
        self._real = real

    def readline(self, size=-1):
        try:
            return nbddp_ask(_nbddp_caller("sys.stdin.readline()"), "", ending="reads the end of its input") + "\n"
        except EOFError:
            return ""

    def read(self, size=-1):
        """What is left of the input, line by line as readline() gives it, to the end (a size reads whole lines)."""
        lines, total = [], 0
        while size is None or size < 0 or total < size:
            line = self.readline()
            if not line:
                break
            lines.append(line)
            total += len(line)
        return "".join(lines)

    def readlines(self, hint=-1):
        return self.read(hint).splitlines(keepends=True)

    def __iter__(self):
        return iter(self.readline, "")

    def __next__(self):
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def __getattr__(self, name):
        return getattr(self._real, name)


def _nbddp_patch_hub_login(module):
    """huggingface_hub's login without a token. A script has no notebook for notebook_login's widget: it is the
    terminal's flow. In a multi-process job that flow (a menu, or without a terminal a browser's device code, on every
    rank) is one prompt for the token, on rank 0; rank 0 logs in with the answer, the other ranks take it as HF_TOKEN.
    A token already there (HF_TOKEN, a saved login) is used, as the library's default does."""
    terminal = module.interpreter_login

    def nbddp_hub_login(*args, **kwargs):
        if NBDDP_WORLD_SIZE == 1:
            return terminal(*args, **kwargs)
        from huggingface_hub import get_token

        if kwargs.get("skip_if_logged_in", True) and get_token() is not None:
            return None
        token = nbddp_ask("huggingface_hub's login()", NBDDP_HF_TOKEN_PROMPT, True, NBDDP_HF_TOKEN_INSTEAD)
        if NBDDP_IS_MAIN:
            return module.login(token=token)
        os.environ["HF_TOKEN"] = token
        return None

    module.notebook_login = nbddp_hub_login
    if NBDDP_WORLD_SIZE > 1:
        module.interpreter_login = nbddp_hub_login


def _nbddp_patch_prompts():
    if _nbddp_choice("NBDDP_INPUT") is False:
        return
    NBDDP_IMPORTS.watch("huggingface_hub._login", _nbddp_patch_hub_login)
    if NBDDP_WORLD_SIZE > 1:
        builtins.input = nbddp_input
        getpass.getpass = nbddp_getpass
        if sys.stdin is not None and not isinstance(sys.stdin, NbddpStdin):
            sys.stdin = NbddpStdin(sys.stdin)


_nbddp_patch_prompts()
