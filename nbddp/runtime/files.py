"""Files, caches and shell commands: once per machine (local rank 0) while the other ranks wait."""
import contextlib
import io
import subprocess
import sys

from .group import NBDDP_IS_LOCAL_MAIN, nbddp_barrier


@contextlib.contextmanager
def nbddp_main_process_first():
    """Local rank 0 runs the block first (and fills the datasets cache); the others run it after."""
    if not NBDDP_IS_LOCAL_MAIN:
        nbddp_barrier("data preparation")
    yield
    if NBDDP_IS_LOCAL_MAIN:
        nbddp_barrier("data preparation")


def nbddp_shell(command, shell=True):
    """A notebook `!command`: runs once per machine (local rank 0) while the other ranks wait."""
    if NBDDP_IS_LOCAL_MAIN:
        sys.stdout.flush()
        captured = isinstance(sys.stdout, io.StringIO)  # inside %%capture: the output is kept there
        pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if captured else {}
        done = subprocess.run(command, shell=True, executable=None if shell is True else shell, text=True, **pipe)
        if captured:
            sys.stdout.write(done.stdout)
        if done.returncode:
            print(f"nbddp: shell command exited with status {done.returncode}: {command}", file=sys.stderr)
    nbddp_barrier(f"shell command {command[:60]}")


class NbddpLines(list):
    """What `x = !command` binds, as IPython's SList: the output's lines, also as `.s` (joined by spaces), `.n`
    (by newlines) and `.l` (the list)."""

    s = spstr = property(" ".join)
    n = nlstr = property("\n".join)
    l = property(list)  # noqa: E741 - IPython's name


def nbddp_getoutput(command):
    """A notebook `x = !command`: the output lines."""
    done = subprocess.run(command, shell=True, capture_output=True, text=True)
    return NbddpLines((done.stdout + done.stderr).splitlines())


def nbddp_write_file(path, text, append=False):
    """A notebook `%%writefile` cell: written once per machine, the other ranks wait."""
    if NBDDP_IS_LOCAL_MAIN:
        with open(path, "a" if append else "w", encoding="utf-8") as fh:
            fh.write(text)
    nbddp_barrier(f"writing {path}")
