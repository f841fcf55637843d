"""input() in a multi-process job: rank 0 asks, where a terminal or a line on its stdin can answer, and every rank
gets the same answer through the store; where no one can answer (stdin closed, a pipe that nobody writes, a Kaggle
Script), every rank gets EOFError, and rank 0 says so in one line. Never a hang, never two ranks reading one stdin."""
import builtins
import select
import sys

from .group import NBDDP_IS_MAIN, NBDDP_WORLD_SIZE
from .hooks import _nbddp_choice, nbddp_say
from .wait import nbddp_store, nbddp_wait_until

NBDDP_INPUT_GRACE = 1.0  # seconds rank 0 waits for a line on a stdin that is not a terminal (a pipe, a file)
_NBDDP_INPUT = {"asked": 0, "input": builtins.input}


def _nbddp_answer(prompt):
    """Rank 0's answer as "+text", or "-why" where no one can answer."""
    stdin = sys.stdin
    try:
        ready = stdin is not None and (stdin.isatty() or select.select([stdin], [], [], NBDDP_INPUT_GRACE)[0])
    except (OSError, ValueError):
        ready = False
    if not ready:
        return "-stdin is not a terminal and has nothing to read"
    try:
        return "+" + _NBDDP_INPUT["input"](prompt)
    except EOFError:
        print(flush=True)  # after the prompt
        return "-stdin is closed"


def nbddp_input(prompt=""):
    """builtins.input of a multi-process job."""
    store = nbddp_store()
    _NBDDP_INPUT["asked"] += 1
    key = f"nbddp/input/{_NBDDP_INPUT['asked']}"
    if store is None:
        answer = "-the process group is not up yet"
    elif NBDDP_IS_MAIN:
        answer = _nbddp_answer(prompt)
        store.set(key, answer)
    else:
        nbddp_wait_until(lambda: store.check([key]), lambda: "rank 0: input()")
        answer = store.get(key).decode()
    if answer.startswith("-"):
        text = (f"input() in a {NBDDP_WORLD_SIZE}-process job has no one to answer it ({answer[1:]}): every rank "
                "gets EOFError; set the value in the notebook instead (NBDDP_INPUT=0: every rank reads its stdin)")
        nbddp_say(key, text)
        raise EOFError(f"nbddp: {text}")
    return answer[1:]


def _nbddp_patch_input():
    if NBDDP_WORLD_SIZE > 1 and _nbddp_choice("NBDDP_INPUT") is not False:
        builtins.input = nbddp_input


_nbddp_patch_input()
